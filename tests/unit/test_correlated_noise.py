"""Issue 51: the confirmation rule learns how a run's noise persists from step to step and combines its points
accordingly: a known AR(1) series gives back its correlation, thin data falls back to the conservative prior,
independent points give today's answer, and a correlation that moves raises a drift alarm."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from rl_verify.core import confirm, spread
from rl_verify.core.confirm import Point, RunPoints, Rule, Spread

M = "response/rewards/mean"
STEPS = tuple(range(1, 46))
NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)


def _ar1(rng: np.random.Generator, rho: float, n: int = len(STEPS)) -> np.ndarray:
    z = rng.normal(0, 1, n)
    for i in range(1, n):
        z[i] = rho * z[i - 1] + math.sqrt(1 - rho * rho) * z[i]
    return z


def _run(rng: np.random.Generator, rho: float, sigma: float = 0.01, shift: float = 0.0) -> RunPoints:
    noise = _ar1(rng, rho) * sigma
    return RunPoints("PASS", None, [Point(M, s, float(shift + v), 0.05, False) for s, v in zip(STEPS, noise)])


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_a_known_ar1_series_gives_back_its_correlation_within_its_interval(rho):
    rng = np.random.default_rng(51)
    estimate, pairs = spread.squares([_run(rng, rho) for _ in range(60)]).correlation(M)
    assert pairs == 60 * 44
    # the pairs of one run are correlated too: the interval on the effective pairs, Fisher z, 99%
    effective = pairs * spread.effective_share(rho)
    half = 2.58 / math.sqrt(effective - 3)
    assert math.tanh(math.atanh(rho) - half) - 0.05 <= estimate <= math.tanh(math.atanh(rho) + half), estimate


def test_too_few_points_fall_back_to_the_conservative_prior():
    rng = np.random.default_rng(1)
    assert spread.learned_correlation(spread.squares([_run(rng, 0.0)]), M) == (spread.CORRELATION_PRIOR, 0)
    few = spread.squares([_run(rng, 0.0) for _ in range(2)])
    rho, pairs = spread.learned_correlation(few, M)
    assert pairs == 88 and 0 <= rho < spread.CORRELATION_PRIOR  # some data: pulled toward it, not to it
    many = spread.squares([_run(rng, 0.0) for _ in range(40)])
    assert spread.learned_correlation(many, M)[0] < 0.1


def test_independent_points_give_todays_answer():
    assert confirm.sum_variance(STEPS, 0.0) == len(STEPS)
    rng = np.random.default_rng(3)
    first = RunPoints("FAIL", "accuracy", [Point(M, 5, 0.06, 0.05, True)])
    repeats = [_run(rng, 0.0, shift=0.004) for _ in range(2)]
    base = Spread({M: 0.01}, 5, "t")
    terms = []
    for step in STEPS:
        mean = sum(p.diff for r in repeats for p in r.points if p.step == step) / 2
        terms.append(mean / (0.01 * math.sqrt(1 / 2 + 1 / 5)))
    z, _, _ = confirm._metric_z(M, repeats, base)
    assert z == pytest.approx(sum(terms) / math.sqrt(len(terms)))
    assert confirm.decide(first, repeats, base, Rule()) == confirm.decide(first, repeats, Spread({M: 0.01}, 5, "t",
                                                                                                 correlation={M: 0.0}))


def test_a_correlated_sum_weighs_its_own_variance_evenly_spaced_or_not():
    for steps, rho in ((STEPS, 0.9), ((0, 5, 10, 15, 20, 25), 0.6), ((1, 2, 4, 8), 0.7)):
        unit = min(b - a for a, b in zip(steps, steps[1:]))
        brute = sum(rho ** (abs(a - b) / unit) for a in steps for b in steps)
        assert confirm.sum_variance(steps, rho) == pytest.approx(brute)
    rng = np.random.default_rng(4)
    repeats = [_run(rng, 0.9, shift=0.004) for _ in range(2)]
    independent, _, _ = confirm._metric_z(M, repeats, Spread({M: 0.01}, 5, "t"))
    persistent, _, _ = confirm._metric_z(M, repeats, Spread({M: 0.01}, 5, "t", correlation={M: 0.9}))
    assert persistent == pytest.approx(independent * math.sqrt(len(STEPS) / confirm.sum_variance(STEPS, 0.9)))


def test_the_rule_that_knows_the_correlation_keeps_its_false_alarm_where_one_that_ignores_it_does_not():
    layout = confirm.Layout({M: 0.02}, {M: STEPS})
    knows = confirm.simulate(layout, Spread({M: 0.01}, 5, "t", correlation={M: 0.9}), samples=300, seed=2)
    assert knows[confirm.REPRODUCED] + knows[confirm.FAIL] <= 0.03


def _past(label: str, rho: float, day: int, rng: np.random.Generator) -> spread.Past:
    return spread.Past(label, {}, confirm.PASS, NOW - timedelta(days=day), (_run(rng, rho),))


def test_a_correlation_that_moves_between_the_older_and_newer_nights_raises_a_drift_alarm():
    rng = np.random.default_rng(5)
    moved = [_past(f"old{i}", 0.1, 40 - i, rng) for i in range(10)] + \
        [_past(f"new{i}", 0.9, 20 - i, rng) for i in range(10)]
    alarms = spread.correlation_drift(moved)
    assert alarms and alarms[0].startswith(f"{M} step-to-step correlation moved from 0.")
    steady = [_past(f"n{i}", 0.5, 40 - i, np.random.default_rng(100 + i)) for i in range(20)]
    assert spread.correlation_drift(steady) == []
    learned = spread.learn(Spread({M: 0.01}, 5, "t", {M: 8.0}), [], moved)
    assert any("correlation moved" in a for a in learned.drift)
    assert "step-to-step correlation of neighbouring points" in learned.sources[-1]


def test_the_report_says_what_the_rule_assumes_about_correlation_and_what_it_learned():
    from rl_verify.core.report.words import spread_sentences
    from rl_verify.orchestration import spread_history

    rng = np.random.default_rng(6)
    learned = spread.learn(Spread({M: 0.01}, 5, "t", {M: 8.0}), [], [_past(f"n{i}", 0.8, 30 - i, rng)
                                                                    for i in range(20)])
    said = " ".join(spread_sentences({"spread": spread_history.describe(learned)}))
    assert "persisting from step to step (AR(1))" in said, said
    assert f"{M} 0.7" in said or f"{M} 0.8" in said, said
    assert "pairs" in said  # learned, not the prior's


def test_the_bench_grid_lets_verifications_share_a_node_and_draws_the_nodes_correlation():
    from scripts import bench_confirmation as bc

    assert bc._seeds(("on-node", 2, 25), 1) == ("node2-25-1", "node2")
    assert bc._seeds(("node-night", 2, 7), 0)[1] == "node2"  # its nights on the same node's baseline error
    assert bc._seeds(3, 0) == ("bench-3-0", "bench-3")  # the other tables' keys stay as they were
    assert bc._tail() == () and bc._tail(1.5) == (1.5,) and bc._tail(1.0, 0.9) == (1.0, 0.9)
    rows = bc._rows("grpo", None, None, ("on-node", 0, 1), 0, "realistic", 1.0, 0.9)
    assert rows != bc._rows("grpo", None, None, ("on-node", 0, 1), 0, "realistic", 1.0, 0.0)
