"""The spread the confirmation rule judges against is learned from the runs we make (issue 34): the prior on
its own degrees of freedom, the repeats of the commit and the healthy history of the same experiment,
baseline version and node, within an age bound. Boundaries of the combination rule, the t-based bounds it
feeds, the drift alarm, and the record store's history entries (a local store, the real ObjectStoragePath)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from rl_verify import engines, settings
from rl_verify.core import confirm, deviation, spread
from rl_verify.core.confirm import Point, RunPoints, Rule, Spread
from rl_verify.engines import load_suite
from rl_verify.orchestration import spread_history

KL, GSM = "distillation/reduced_distillation_kl", "eval/gsm8k/acc"
STEPS = (0, 5, 10, 15, 20, 25)
NOW = datetime(2026, 12, 4, 3, 0, tzinfo=timezone.utc)
KEY = {"suite": "opd", "experiment": "abc", "baseline_version": 1, "node": "rl_gpu_node"}
PRIOR = Spread({KL: 0.01, GSM: 0.01}, 3, "test prior", {KL: 8.0, GSM: 8.0})
#: A prior that knows its points independent (issue 51): the pooling's arithmetic as before correlations were learned.
INDEPENDENT = Spread({KL: 0.01, GSM: 0.01}, 3, "test prior", {KL: 8.0, GSM: 8.0}, correlation={KL: 0.0, GSM: 0.0})


def _run(rng: np.random.Generator, sigma: float, offset: float = 0.0, verdict: str = "PASS") -> RunPoints:
    return RunPoints(verdict, None, [Point(m, s, float(offset + rng.normal(0, sigma)), 0.05, False)
                                     for m in (KL, GSM) for s in STEPS])


def _past(label: str, runs, outcome: str | None = "PASS", days_ago: float = 1.0, key=KEY) -> spread.Past:
    return spread.Past(label, dict(key), outcome, NOW - timedelta(days=days_ago), tuple(runs))


def test_with_no_repeats_and_no_history_the_prior_stands_on_its_own_degrees_of_freedom():
    learned = spread.learn(PRIOR, [], [])
    assert learned.sigma == PRIOR.sigma and learned.df == {KL: 8.0, GSM: 8.0}
    assert learned.sources == ("prior: test prior (df 8)", "step-to-step correlation of neighbouring points: "
                               f"{KL} 0.90 (the prior: no data), {GSM} 0.90 (the prior: no data)")
    assert learned.drift == () and learned.correlation == {KL: spread.CORRELATION_PRIOR, GSM: spread.CORRELATION_PRIOR}
    assert spread.moved(learned) == {KL: 1.0, GSM: 1.0}


def test_the_repeats_and_the_history_pool_with_the_prior_weighted_by_degrees_of_freedom():
    a = RunPoints("PASS", None, [Point(KL, 5, 0.02, 0.05, False), Point(KL, 10, 0.0, 0.05, False)])
    b = RunPoints("PASS", None, [Point(KL, 5, 0.00, 0.05, False), Point(KL, 10, 0.0, 0.05, False),
                                 Point(KL, 15, 0.5, 0.05, False)])  # a point seen once adds nothing
    squares = spread.squares([a, b])
    assert squares.ss[KL] == pytest.approx(2 * 0.01 ** 2) and squares.df[KL] == 2 and GSM not in squares.ss
    learned = spread.learn(Spread({KL: 0.01}, 3, "p", {KL: 8.0}, correlation={KL: 0.0}), [a, b], [])
    assert learned.sigma[KL] == pytest.approx(math.sqrt((8 * 0.01 ** 2 + 2e-4) / 10))
    assert learned.df[KL] == 10 and learned.sources[1] == "2 repeats of this commit (df 2)"
    # With the conservative prior (no correlation given) and residuals that estimate none (step 10's are 0), the
    # prior's correlation stands: the data's 2 df count as the effective share of correlated points.
    cold = spread.learn(Spread({KL: 0.01}, 3, "p", {KL: 8.0}), [a, b], [])
    rho = cold.correlation[KL]
    assert rho == spread.CORRELATION_PRIOR
    assert cold.df[KL] == pytest.approx(8 + 2 * (1 - rho ** 2) / (1 + rho ** 2))


def test_a_shift_shared_by_every_run_does_not_inflate_the_spread():
    """Runs of a regressed commit (repeats) or a baseline's own error (history) move every run alike."""
    plain = [_run(np.random.default_rng(7 + i), 0.01) for i in range(10)]
    shifted = [RunPoints(r.verdict, None, [Point(p.metric, p.step, p.diff + 0.3, p.threshold, False)
                                           for p in r.points]) for r in plain]
    assert spread.squares(plain).ss == pytest.approx(spread.squares(shifted).ss)


def test_history_from_another_experiment_node_or_baseline_version_is_left_out():
    rng = np.random.default_rng(2)
    pasts = [_past("same", [_run(rng, 0.01)]),
             _past("other node", [_run(rng, 0.05)], key={**KEY, "node": "rl_gpu_node_b"}),
             _past("other experiment", [_run(rng, 0.05)], key={**KEY, "experiment": "def"}),
             _past("other version", [_run(rng, 0.05)], key={**KEY, "baseline_version": 2})]
    kept, skipped = spread.select(pasts, KEY, NOW, timedelta(days=30), 60)
    assert [p.label for p in kept] == ["same"]
    assert skipped == {"another experiment, baseline version or node": 3}


@pytest.mark.parametrize("outcome", ["FAIL", "FAIL (reproduced)", "INCONCLUSIVE", None])
def test_history_of_a_verification_that_did_not_end_healthy_is_left_out(outcome):
    rng = np.random.default_rng(3)
    kept, skipped = spread.select([_past("bad", [_run(rng, 0.01)], outcome), _past("ok", [_run(rng, 0.01)])],
                                  KEY, NOW, timedelta(days=30), 60)
    assert [p.label for p in kept] == ["ok"] and sum(skipped.values()) == 1
    assert list(skipped) == [f"ended {outcome or 'without an outcome'}"]
    kept, _ = spread.select([_past("cleared", [_run(rng, 0.01)], "PASS (not reproduced)")], KEY, NOW,
                            timedelta(days=30), 60)
    assert [p.label for p in kept] == ["cleared"]  # a cleared FAIL's runs are healthy runs, its first included


def test_history_past_the_age_bound_or_beyond_the_newest_n_or_the_run_itself_is_left_out():
    rng = np.random.default_rng(4)
    pasts = [_past(f"day-{d}", [_run(rng, 0.01)], days_ago=d) for d in (1, 2, 3, 29.9, 30.1, 45)]
    pasts.append(_past("this run", [_run(rng, 0.01)], days_ago=0.01))
    kept, skipped = spread.select(pasts, KEY, NOW, timedelta(days=30), 3, current="this run")
    assert [p.label for p in kept] == ["day-1", "day-2", "day-3"]
    assert skipped == {"the verification being decided": 1, "beyond the newest 3": 1, "older than the age bound": 2}
    kept, _ = spread.select(pasts, KEY, NOW, timedelta(days=30), 60, current="this run")
    assert [p.label for p in kept][-1] == "day-29.9"


def test_many_runs_move_the_spread_to_the_truth_and_the_bounds_toward_normal():
    rng = np.random.default_rng(5)
    history = [_past(f"n{i}", [_run(rng, 0.0125)], days_ago=i / 2) for i in range(40)]
    learned = spread.learn(PRIOR, [], history)
    assert learned.sigma[KL] == pytest.approx(0.0125, rel=0.12)
    # independent points: 200 pairs of residuals bring the learned correlation near 0 (shrunk from the prior's 0.9)
    assert learned.correlation[KL] < 0.15
    assert 8 + 0.95 * (40 * 6 - 6) < learned.df[KL] <= 8 + 40 * 6 - 6
    learned = spread.learn(INDEPENDENT, [], history)
    assert learned.df[KL] == 8 + 40 * 6 - 6
    rule = Rule()
    assert rule.z_reproduce(2, learned.df_of(KL)) < rule.z_reproduce(2, 8.0)
    assert rule.z_reproduce(2, learned.df_of(KL)) == pytest.approx(rule.z_reproduce(2), rel=0.03)
    assert learned.sources[-2] == "40 runs of 40 healthy verifications over 21 days (df 234)"


def test_a_thin_estimate_asks_for_more_evidence_to_reproduce_and_never_clears_more_easily():
    rule = Rule()
    assert rule.z_reproduce(6, 8.0) > rule.z_reproduce(6) + 1.5  # 5.19 against 3.34
    assert rule.z_point(6, 8.0) > rule.z_point(6)
    assert rule.z_clear(6, 8.0) == rule.z_clear(6)  # 2.63: uncertainty widens the gap between the two bounds
    assert rule.z_reproduce(6, math.inf) == rule.z_reproduce(6)


def test_a_noisier_node_raises_the_drift_alarm_and_a_node_as_assumed_does_not():
    rng = np.random.default_rng(6)
    # The prior rests on 8 df: its plausible range is wide (a 2x node is not out of it at 1% family-wise); 3x is.
    noisy = spread.learn(PRIOR, [], [_past(f"n{i}", [_run(rng, 0.03)]) for i in range(20)])
    assert len(noisy.drift) == 2 and noisy.drift[0].split(" ")[0] in (KL, GSM)
    assert "noisier" in noisy.drift[0] and "x the prior's spread" in noisy.drift[0]
    calm = [spread.learn(PRIOR, [], [_past(f"n{i}", [_run(np.random.default_rng(100 * s + i), 0.01)])
                                     for i in range(20)]) for s in range(100)]
    false_alarms = sum(bool(c.drift) for c in calm)
    assert false_alarms <= 5  # family-wise p = 0.01 (two metrics): a node as assumed is rarely flagged


def test_a_learned_spread_decides_and_its_evidence_names_its_degrees_of_freedom():
    rng = np.random.default_rng(8)
    first = RunPoints("FAIL", "accuracy", [Point(KL, 5, 0.06, 0.05, True)])
    repeats = [_run(rng, 0.01), _run(rng, 0.01)]
    decision = confirm.decide(first, repeats, spread.learn(INDEPENDENT, repeats, []), Rule())
    assert decision.outcome == confirm.NOT_REPRODUCED
    # 6 squares a metric, counted at the share the learned (near 0) correlation leaves them
    assert all(8 + 5 <= e["df"] <= 8 + 6 for e in decision.evidence), decision.evidence


def test_the_shipped_opd_prior_carries_the_degrees_of_freedom_of_one_max_deviation_over_three_runs():
    spec = load_suite("opd")
    provenance, _ = engines.get("opd").shipped(spec)
    prior = engines.get("opd").spread(spec, provenance.model_dump(mode="json"))
    assert set(prior.df) == set(prior.sigma)
    assert all(6.5 <= df <= 9.0 for df in prior.df.values()), prior.df  # ~25% uncertain: 1 / (2 cv^2)
    assert deviation.max_dev_df(3, 6) == pytest.approx(8.1, abs=0.3)


# ----------------------------------------------------------------------------- the record store's history

@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    return tmp_path


def test_a_finished_verification_is_kept_and_read_back_newest_first_and_a_probe_is_not_kept(store):
    rng = np.random.default_rng(9)
    for i in range(3):
        spread_history.keep("opd", f"scheduled__2026-12-0{i + 1}", KEY, "PASS", [_run(rng, 0.01)],
                            now=NOW - timedelta(days=3 - i))
    assert spread_history.keep("opd", f"{settings.PROBE_RUN_PREFIX}x", KEY, "PASS", [_run(rng, 0.01)]) is None
    (store / settings.SPREAD_HISTORY_FOLDER / "opd" / "20261204T000000000000Z__broken.json").write_text("{not json")
    pasts = spread_history.read("opd", 10)
    assert [p.label for p in pasts] == ["scheduled__2026-12-03", "scheduled__2026-12-02", "scheduled__2026-12-01"]
    assert pasts[0].key == KEY and len(pasts[0].runs[0].points) == 12
    assert [p.label for p in spread_history.read("opd", 3)] == ["scheduled__2026-12-03", "scheduled__2026-12-02"]
    assert spread_history.read("grpo", 10) == []


def test_the_verification_learns_from_the_kept_history_of_its_own_key_only(store):
    spec = load_suite("opd")
    resolved = {"baselines": {"opd": {"version": 1}}, "suite_nodes": {"opd": "rl_gpu_node"}, "node": "rl_gpu_node"}
    key = spread_history.spread_key(spec, resolved)
    assert key["node"] == "rl_gpu_node" and key["baseline_version"] == 1 and len(key["experiment"]) == 16
    rng = np.random.default_rng(10)
    now = datetime.now(timezone.utc)
    for i in range(5):
        spread_history.keep("opd", f"night-{i}", key, "PASS", [_run(rng, 0.01)], now=now - timedelta(days=i + 1))
    spread_history.keep("opd", "other-node", {**key, "node": "b"}, "PASS", [_run(rng, 0.5)], now=now)
    spread_history.keep("opd", "bad", key, "FAIL (reproduced)", [_run(rng, 0.5)], now=now)
    learned = spread_history.learned(INDEPENDENT, spec, resolved, "this-run", [])
    assert learned.sources[-2] == "5 runs of 5 healthy verifications over 5 days (df 24)"
    assert learned.sigma[KL] < 0.02  # neither the other node's nor the reproduced FAIL's 0.5
    said = spread_history.describe(learned)
    assert said["metrics"][KL]["df"] == pytest.approx(32.0, abs=1.0) and said["sources"] == list(learned.sources)


def test_the_calibration_proposal_shows_the_learned_spread_beside_its_own(store, tmp_path):
    from rl_verify.orchestration import calibration
    from rl_verify.store import baselines

    baselines.import_shipped("opd")
    current = {}
    for name, data in baselines.version_files("opd", 1).items():
        (tmp_path / name).write_bytes(data)
        current[name] = tmp_path / name
    provenance = json.loads(current[baselines.VERSION_FILE].read_text())
    spec = load_suite("opd")
    resolved = {"baselines": {"opd": {"version": 1}}, "suite_nodes": {"opd": "rl_gpu_node"}}
    prior = engines.get("opd").spread(spec, provenance)
    rng = np.random.default_rng(11)
    noisy = [RunPoints("PASS", None, [Point(m, s, float(rng.normal(0, 3 * prior.sigma[m])), 0.0, False)
                                      for m in prior.sigma for s in STEPS]) for _ in range(20)]
    for i, run in enumerate(noisy):
        spread_history.keep("opd", f"night-{i}", spread_history.spread_key(spec, resolved), "PASS", [run],
                            now=datetime.now(timezone.utc) - timedelta(days=i + 1))
    lines = calibration._spread_beside(spec, 1, current, 3, provenance["statistics"], ["rl_gpu_node", "other"],
                                       "calibration-run")
    table = [line for line in lines if line.startswith(f"| {KL} |")]
    assert len(table) == 1
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[1] == cells[2] == format(prior.sigma[KL], ".4g")  # these 3 runs are the shipped table's
    assert cells[3].endswith("x)") and 2.0 < float(cells[3].split("(")[1].rstrip("x)")) < 3.2
    assert cells[4] == f"{prior.sigma[KL]:.4g} (1.00x)"  # nothing learned on a node with no history
    assert any(line.startswith("- drift on rl_gpu_node: ") for line in lines)
    assert all("Drift alarm" not in line for line in lines)  # each metric's phrase, not the report's sentence
    assert any("20 runs of 20 healthy verifications" in line for line in lines)
