"""A FAIL you can believe, through the whole DAG (real Airflow, the simulated node at realistic noise):
a healthy run's noise FAIL is repeated and cleared with the spread learned from the node's healthy nights
(issue 34: the report names its sources), a regression is reproduced by a repeat aborted early, a NaN and
a crash are never repeated, a node made noisier raises the drift alarm, and the node is clean after each.

The healthy nights are kept in the record store's spread history before the first test
(``harness.nights``: the node's own runs judged by the engine, as a PASS night keeps them); the first
test's verification adds its own entry, which later verifications read.

The first run's seed is the node's (sim.json "seed"); each repeat's comes from the DAG run's id
(``core.names.repeat_seed``), so a fixed run id makes the outcome reproducible: with the node's baseline
error draw "46" (its golden table off by at most 1.5 of its own sigma at any point; the simulator's
default "33" has one point, rewards at step 25, 3 sigma off, where healthy runs FAIL and reproduce),
node seed 3 FAILs response_len at step 5 by noise and the repeat of run "manual__noise-repeat" clears it,
whether or not either run is stopped early (found by replaying the node's own curves through the
decision code, as scripts/bench_confirmation.py does).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import httpx
import pytest

from harness.nights import keep_nights
from harness.rig import DAG_ID, Rig
from rl_verify import settings
from simulator import node as sim

pytestmark = pytest.mark.e2e
STEP_SECONDS = 0.05
NOISE_SEED, BASELINE_ERROR_SEED, RUN_ID = "3", "46", "manual__noise-repeat"
#: What the verification DAG keys its spread history by on this rig (baseline v1, the one node).
RESOLVED = {"baselines": {"opd": {"version": 1}}, "suite_nodes": {"opd": "rl_gpu_node"}}
HEALTHY_NIGHTS = 6


@pytest.fixture(scope="module")
def rig(start_rig):
    with start_rig("e2e-confirm", step_seconds=STEP_SECONDS, database="postgres") as rig:
        sim.set_noise(rig.node_state(), "realistic", baseline_error_seed=BASELINE_ERROR_SEED)
        sim_json = Path(rig.node["root"]) / "sim.json"
        sim_json.write_text(json.dumps({**json.loads(sim_json.read_text()), "seed": NOISE_SEED}))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(settings, "RECORD_ROOT", str(rig.record_root))  # where harness.nights keeps them
            keep_nights("opd", RESOLVED, HEALTHY_NIGHTS, BASELINE_ERROR_SEED)
        yield rig


@pytest.fixture()
def node_state(rig):
    state = rig.state_dir / "node"
    sim.clear_faults(state)
    yield state
    sim.clear_faults(state)


def _report(out) -> dict:
    return json.loads(Path(out.summary["report"]["json"]).read_text())


def _outcome(report: dict, suite: str = "opd") -> dict:
    (entry,) = [s for s in report["suites"] if s["suite"] == suite]
    return entry["outcome"]


def _assert_node_clean(node_state: Path) -> None:
    assert sim.node_processes(node_state) == []
    assert not sim.ray_running(node_state)


def _get(rig: Rig, path: str) -> httpx.Response:
    token = rig.client.login()
    return httpx.get(rig.stack.base_url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_healthy_runs_noise_fail_is_repeated_and_ends_pass_not_reproduced(rig, node_state, slow_steps):
    # lane auto: no bitwise reference yet, so a full verification whose PASS makes one (issue 42: from the repeat
    # that ran to its end when the first run was stopped on its noise breach).
    out = rig.run({"commit": "main", "suites": ["opd"], "node": "rl_gpu_node", "lane": "auto"}, run_id=RUN_ID)
    assert out.state == "success", json.dumps(out.tasks)  # a FAIL that was not reproduced fails no DAG run
    assert out.tasks["compare_opd"] == "failed"  # the first run keeps its runbook verdict
    # The repeat ran to its judgement (its own runbook verdict may be a FAIL of other metrics: at this noise a
    # single run FAILs something half the time; only the first run's breach is what it must reproduce).
    assert (out.tasks["fetch_opd-r1"], out.tasks["confirm_opd"]) == ("success", "success")
    assert out.tasks["run_opd-r2"] == "skipped"  # no run is launched that could not change the outcome
    report = _report(out)
    outcome = _outcome(report)
    assert report["schema"] == 2 and report["verdict"] == "PASS" and report["first_run_verdict"] == "FAIL"
    assert outcome["outcome"] == "PASS (not reproduced)" and "reads as noise" in outcome["reason"]
    first, repeat = outcome["runs"]
    assert (first["verdict"], first["failure_class"]) == ("FAIL", "accuracy")
    assert first["seed"] is None and isinstance(repeat["seed"], int) and repeat["folder"] == "opd-r1"
    # Every judged metric weighed over the repeat, the first run's one breach among them, all within the noise.
    evidence = {e["metric"]: e for e in outcome["evidence"]}
    breached_first = [m for m, e in evidence.items() if e["breached_first"]]
    assert len(evidence) == 6 and breached_first == ["response/response_len/mean"]
    assert all(abs(e["z"]) < e["z_clear"] and e["points_seen"] >= 5 for e in evidence.values()), evidence
    # It decided with the spread learned from the node's healthy nights and its own repeat, and says so.
    learned = outcome["spread"]
    assert learned["sources"][0].startswith("prior: shipped baseline") and learned["drift"] == []
    assert learned["sources"][-2] == (f"{HEALTHY_NIGHTS} runs of {HEALTHY_NIGHTS} healthy verifications over "
                                      f"{HEALTHY_NIGHTS} days (df 25-30 by metric)"), learned["sources"]
    # issue 51: and the step-to-step correlation learned from the same nights' residuals (independent noise here:
    # 24-30 pairs pull the conservative prior of 0.9 toward 0), the data's df counted at its effective share
    assert learned["sources"][-1].startswith("step-to-step correlation of neighbouring points: ") \
        and "pairs)" in learned["sources"][-1], learned["sources"]
    assert all(e["df"] == learned["metrics"][m]["df"] > 12 for m, e in evidence.items()), evidence
    assert all(learned["metrics"][m]["correlation"] < 0.85 for m in evidence), learned["metrics"]
    md = (Path(out.summary["record"]) / "report.md").read_text()
    assert f"{HEALTHY_NIGHTS} runs of {HEALTHY_NIGHTS} healthy verifications" in md and "Drift alarm" not in md
    assert outcome["estimates"]["metrics"]["distillation/reduced_distillation_kl"]["healthy_breach"] > 0
    # Both runs' reports are reachable from the run's report view, each with its own runbook verdict.
    main = _get(rig, f"/rl-verify/dags/{DAG_ID}/runs/{RUN_ID}/report")
    assert main.status_code == 200 and first["report"] in main.text and repeat["report"] in main.text
    for run in (first, repeat):
        page = _get(rig, run["report"])
        assert page.status_code == 200, run["report"]
        assert f"RL accuracy verification: {run['verdict']}" in page.text
        assert f"Run {run['attempt'] + 1} of 2 of opd" in page.text
        for name in ("report.json", "report.md", "report.html"):  # no path of a task's deleted workspace
            assert "rl-verify-staging" not in (Path(out.summary["record"]) / run["folder"] / name).read_text(), name
    note = rig.client.dag_run(DAG_ID, RUN_ID).get("note") or ""
    assert note.startswith("PASS: opd PASS (not reproduced) (2 runs)"), note
    # The first run was stopped on its noise breach, so the repeat, which ran to its end, made the reference.
    record_dir = Path(out.summary["record"])
    assert json.loads((record_dir / "opd" / "abort.json").read_text())["applied"]
    from rl_verify.store import references

    kept = [json.loads(p.read_text()) for p in (Path(rig.record_root) / references.FOLDER).glob("*.json")]
    (made,) = [r for r in kept if r["suite"] == "opd" and r["run_id"] == RUN_ID]
    assert made["state"] == "trusted" and made["sha"] == rig.node["commits"]["good"]
    assert "opd: bitwise reference trusted" in md
    assert "after repeat 1, the run that ran to its end" in rig.client.task_log(DAG_ID, RUN_ID, "run_opd-r1")
    _assert_node_clean(node_state)


@pytest.fixture()
def slow_steps(rig):
    """Steps slow enough (OPD: 25 x 0.4 s) that the live check, polling every second, sees a run before its end."""
    sim_json = Path(rig.node["root"]) / "sim.json"
    before = json.loads(sim_json.read_text())
    sim_json.write_text(json.dumps({**before, "step_seconds": 0.4}))
    yield
    sim_json.write_text(json.dumps(before))


def test_a_regression_is_reproduced_by_a_repeat_that_is_aborted_early(rig, node_state, slow_steps):
    out = rig.run({"commit": "sim/regress-teacher", "suites": ["opd"], "node": "rl_gpu_node"})
    assert out.state == "failed"
    # Both trainings stopped on purpose (success, issue 35); the reproduced FAIL is the comparisons' and confirm's.
    assert (out.tasks["run_opd"], out.tasks["run_opd-r1"], out.tasks["compare_opd-r1"], out.tasks["confirm_opd"]) \
        == ("success", "success", "failed", "failed"), out.tasks
    outcome = _outcome(_report(out))
    assert outcome["outcome"] == "FAIL (reproduced)" and "distillation/reduced_distillation_" in outcome["reason"]
    first, repeat = outcome["runs"]
    assert repeat["steps"] < repeat["expected_steps"]  # the repeat stopped as soon as its FAIL was certain
    assert out.summary["verdict"] == "FAIL" and out.summary["failure_classes"] == ["accuracy"]
    assert not first["attempts"] and not repeat["attempts"]  # issue 55: an accuracy FAIL is never trained again
    _assert_node_clean(node_state)


@pytest.mark.parametrize("kind,extra,said", [
    ("nan", {"at_step": 3, "metric": "distillation/reduced_distillation_kl"}, "not finite"),
    ("crash", {"at_step": 4}, "of the infrastructure class"),
])
def test_a_nan_and_a_crash_are_never_repeated(rig, node_state, kind, extra, said):
    sim.set_fault(node_state, "opd", kind, **extra)
    out = rig.run({"commit": "main", "suites": ["opd"], "node": "rl_gpu_node"})
    assert out.state == "failed"
    assert out.tasks["run_opd-r1"] == "skipped" and out.tasks["confirm_opd"] == "failed"
    outcome = _outcome(_report(out))
    assert outcome["outcome"] == "FAIL" and "not repeated" in outcome["reason"] and said in outcome["reason"]
    assert len(outcome["runs"]) == 1
    if kind == "crash":  # issue 55: trained again once as infrastructure (a new job), never as a confirmation repeat
        assert [a["job"] for a in outcome["runs"][0]["attempts"]] == ["opd", "opd-t2"], outcome["runs"]
    else:  # a NaN ends the run on its own terms (accuracy rules): no infrastructure attempt
        assert not outcome["runs"][0]["attempts"], outcome["runs"]
    _assert_node_clean(node_state)


def test_a_node_made_noisier_raises_the_drift_alarm_in_the_report(rig, node_state):
    """The node's true spread 4x the assumed one (the simulator's spread_ratio), its recent healthy nights as
    noisy: the learned spread leaves the prior's plausible range for every metric. Information, not a FAIL: the
    run's outcome is whatever its own run says (one run: repeats 0)."""
    history = Path(rig.record_root) / settings.SPREAD_HISTORY_FOLDER / "opd"
    assert any(RUN_ID in p.name for p in history.iterdir())  # the first test's verification kept its runs
    for entry in history.iterdir():  # only the noisy node's nights
        entry.unlink()
    sim.set_noise(node_state, "realistic", baseline_error_seed=BASELINE_ERROR_SEED, spread_ratio=4.0)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(settings, "RECORD_ROOT", str(rig.record_root))
            keep_nights("opd", RESOLVED, 10, BASELINE_ERROR_SEED, spread_ratio=4.0, tag="noisy")
        out = rig.run({"commit": "main", "suites": ["opd"], "node": "rl_gpu_node", "repeats": 0})
    finally:
        sim.set_noise(node_state, "realistic", baseline_error_seed=BASELINE_ERROR_SEED, spread_ratio=1.0)
    learned = _outcome(_report(out))["spread"]
    assert len(learned["drift"]) >= 4, learned  # of six metrics
    assert all("noisier" in alarm for alarm in learned["drift"]), learned["drift"]
    # Pooled with the prior (8 df) and the nights (~50 df): ~3.7x for most; rewards, clamped to [0, 1], less.
    assert all(2.0 < m["moved"] < 5.0 for m in learned["metrics"].values()), learned["metrics"]
    record = Path(out.summary["record"])
    for name, shown in (("report.md", str), ("report.html", html.escape)):  # one sentence naming every metric
        text = (record / name).read_text()
        assert text.count("Drift alarm (information, not a FAIL): ") == 1, name
        assert all(shown(alarm) in text for alarm in learned["drift"]), name
    _assert_node_clean(node_state)


#: What the verification DAG keys GRPO's spread history by on this rig (baseline v1, the one node).
RESOLVED_GRPO = {"baselines": {"grpo": {"version": 1}}, "suite_nodes": {"grpo": "rl_gpu_node"}}
GRPO_NIGHTS, GRPO_RUN_ID = 12, "manual__grpo-noisier-node"


def test_a_grpo_night_on_a_node_half_again_as_noisy_after_healthy_nights_is_no_fail(rig, node_state):
    """Issue 43: GRPO's confirmation learns its spread as OPD's does. On a node whose true run-to-run spread is 1.5x
    the assumed one (most single runs breach response_len's p80), with that node's healthy nights kept, a healthy
    commit ends PASS or PASS (not reproduced), and the report names the learned GRPO spread and its sources."""
    sim.set_noise(node_state, "realistic", baseline_error_seed=BASELINE_ERROR_SEED, spread_ratio=1.5)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(settings, "RECORD_ROOT", str(rig.record_root))
            keep_nights("grpo", RESOLVED_GRPO, GRPO_NIGHTS, BASELINE_ERROR_SEED, spread_ratio=1.5, tag="grpo-noisy")
        out = rig.run({"commit": "main", "suites": ["grpo"], "node": "rl_gpu_node"}, run_id=GRPO_RUN_ID)
    finally:
        sim.set_noise(node_state, "realistic", baseline_error_seed=BASELINE_ERROR_SEED, spread_ratio=1.0)
    assert out.state == "success", json.dumps(out.tasks)
    outcome = _outcome(_report(out), "grpo")
    assert outcome["outcome"] in ("PASS", "PASS (not reproduced)"), outcome["reason"]
    learned = outcome["spread"]
    assert learned["sources"][0].startswith("prior: shipped baseline (mean of 5 runs, no spread recorded)")
    assert learned["sources"][-2].startswith(f"{GRPO_NIGHTS} runs of {GRPO_NIGHTS} healthy verifications"), learned
    # The nights moved the prior: response_len's sigma is about 1.5x the threshold's reading.
    assert 1.2 < learned["metrics"]["response/response_len/mean"]["moved"] < 1.8, learned["metrics"]
    md = (Path(out.summary["record"]) / "report.md").read_text()
    assert f"{GRPO_NIGHTS} runs of {GRPO_NIGHTS} healthy verifications" in md
    assert "the mismatch bound itself stays the runbook's absolute one" in md
    _assert_node_clean(node_state)
