"""The confirmation rule (core.confirm): which FAILs are repeated, the budget, stopping early, the three
outcomes, the fallback without a spread, and where the spread comes from."""

from __future__ import annotations

import math

import pytest

from rl_verify import engines
from rl_verify.core import confirm, deviation
from rl_verify.core.confirm import (FAIL, INCONCLUSIVE, NOT_REPRODUCED, PASS, REPRODUCED, Point, Rule, RunPoints,
                                    Spread, decide)
from rl_verify.engines import load_suite

KL, GSM = "distillation/reduced_distillation_kl", "eval/gsm8k/acc"
SPREAD = Spread({KL: 0.01, GSM: 0.01}, 3, "test spread")
STEPS = (5, 10, 15, 20, 25)


def run(diffs: dict[str, dict[int, float]], threshold: float = 0.03, failure_class: str | None = "accuracy",
        not_repeatable: list[str] | None = None) -> RunPoints:
    """A run with ``diffs[metric][step]`` (the rest of the points at 0), judged against ``threshold``."""
    points = [Point(m, s, diffs.get(m, {}).get(s, 0.0), threshold, not abs(diffs.get(m, {}).get(s, 0.0)) < threshold)
              for m in (KL, GSM) for s in STEPS]  # a NaN breaches, as in the engine's comparison
    failed = any(p.breached for p in points) or failure_class not in (None, "accuracy")
    return RunPoints(FAIL if failed else PASS, failure_class if failed else None, points, {}, not_repeatable or [])


def test_a_passing_first_run_is_final():
    assert decide(run({}), [], SPREAD).outcome == PASS


@pytest.mark.parametrize("first,why", [
    (run({KL: {5: 0.04}}, failure_class="performance"), "of the performance class"),
    (run({KL: {5: 0.04}}, failure_class="infrastructure"), "of the infrastructure class"),
    (run({KL: {5: math.nan}}), "not finite"),
    (run({KL: {5: 0.2}}), "sigma from its reference"),           # 17 sigma: no noise reaches it
    (run({KL: {5: 0.04}}, not_repeatable=["wrong step count"]), "wrong step count"),
])
def test_what_noise_cannot_produce_is_failed_at_once_naming_why(first, why):
    decision = decide(first, [], SPREAD)
    assert decision.outcome == FAIL and why in decision.reason and "not repeated" in decision.reason


def test_a_breach_within_the_noise_is_repeated():
    assert decide(run({KL: {10: 0.035}}), [], SPREAD).outcome is None


def test_a_budget_of_zero_keeps_the_first_runs_verdict():
    assert decide(run({KL: {10: 0.035}}), [], SPREAD, budget=0).outcome == FAIL


def test_a_repeat_shifted_the_same_way_reproduces_the_fail_at_once():
    first = run({KL: {10: 0.035, 15: 0.032}})
    decision = decide(first, [run({KL: {10: 0.04, 15: 0.04, 20: 0.04, 25: 0.04}})], SPREAD)
    assert decision.outcome == REPRODUCED and KL in decision.reason and "|z| = " in decision.reason
    group = next(e for e in decision.evidence if e["metric"] == KL)
    assert group["steps"] == list(STEPS) and group["direction"] == "up" and group["z"] >= Rule().z_reproduce(2)
    assert {e["metric"] for e in decision.evidence} == {KL, GSM}  # every judged metric is weighed


def test_a_repeat_that_stays_put_clears_the_fail_as_noise():
    decision = decide(run({KL: {10: 0.035}}), [run({})], SPREAD)
    assert decision.outcome == NOT_REPRODUCED and "reads as noise" in decision.reason


def test_a_shift_the_other_way_is_a_shift_too():
    # The runbook's tolerances are absolute: a metric moved down by 4 sigma is as off as one moved up.
    decision = decide(run({KL: {10: 0.035}}), [run({KL: {10: -0.04, 15: -0.04, 20: -0.04, 25: -0.04}})], SPREAD)
    assert decision.outcome == REPRODUCED and "below its reference" in decision.reason


def test_a_metric_the_first_run_never_reached_reproduces_the_fail():
    # The first run stopped at step 0 on an eval's noise; its repeat shows the regression in KL.
    first = RunPoints(FAIL, "accuracy", [Point(GSM, 0, -0.035, 0.03, True)], complete=False)
    decision = decide(first, [run({KL: {s: 0.05 for s in STEPS}})], SPREAD)
    assert decision.outcome == REPRODUCED and "not a metric the first run breached" in decision.reason


def test_one_point_beyond_the_point_bound_reproduces_even_before_the_metric_sum_does():
    rule = Rule()
    at = rule.z_point(2) * 0.01 * math.sqrt(1 + 1 / 3) * 1.02
    stopped = RunPoints(FAIL, "accuracy", [Point(GSM, 0, 0.0, 0.03, False), Point(GSM, 5, 0.0, 0.03, False),
                                           Point(GSM, 10, -at, 0.03, True)], complete=False)
    decision = decide(run({GSM: {10: -0.035}}), [stopped], SPREAD)
    assert decision.outcome == REPRODUCED and "one point's |z|" in decision.reason
    assert abs(next(e for e in decision.evidence if e["metric"] == GSM)["z"]) < rule.z_reproduce(2)


def test_a_repeat_stops_early_only_on_a_point_that_decides():
    stop = confirm.stop_early(run({KL: {10: 0.035}}), SPREAD)
    least = Rule().z_point(2) * 0.01 * math.sqrt(1 + 1 / 3)
    assert stop == {GSM: [0, pytest.approx(least)], KL: [0, pytest.approx(least)]}
    from rl_verify.core.live import confirming
    check = {"metric": KL, "method": "absolute", "baseline": 0.30, "current": 0.30 + least * 1.01}
    assert confirming([check], stop)
    assert not confirming([{**check, "current": 0.30 + least * 0.9}], stop)  # breached, but not by enough
    assert not confirming([{**check, "metric": "response/response_len/mean"}], stop)
    # Without a spread: the first run's breached metric, the same way.
    fallback = confirm.stop_early(RunPoints(FAIL, "accuracy", [], {"response/rewards/mean": -1}), None)
    assert fallback == {"response/rewards/mean": [-1, 0.0]}
    rewards = {"metric": "response/rewards/mean", "method": "absolute", "baseline": 0.6, "current": 0.5}
    assert confirming([rewards], fallback) and not confirming([{**rewards, "current": 0.7}], fallback)


def test_a_repeat_stopped_early_cannot_clear_the_fail():
    stopped = RunPoints(FAIL, "accuracy", run({}).points, complete=False)
    assert decide(run({KL: {10: 0.035}}), [stopped], SPREAD, budget=2).outcome is None
    assert decide(run({KL: {10: 0.035}}), [stopped], SPREAD, budget=1).outcome == INCONCLUSIVE


def test_the_first_run_is_left_out_of_the_evidence():
    # However extreme the first run is (short of 'far'), a repeat at 0 clears it.
    first = run({KL: {s: 0.09 for s in STEPS}})
    assert decide(first, [run({})], SPREAD).outcome == NOT_REPRODUCED


def test_an_undecided_repeat_asks_for_another_within_the_budget_then_ends_inconclusive():
    first = run({KL: {10: 0.035}})
    middling = run({KL: {s: 0.012 for s in STEPS}})  # z ~ 2.3 after one repeat: between z_clear and z_reproduce
    assert decide(first, [middling], SPREAD, budget=2).outcome is None
    ended = decide(first, [middling, middling], SPREAD, budget=2)
    assert ended.outcome in (REPRODUCED, INCONCLUSIVE)
    ended = decide(first, [middling], SPREAD, budget=1)
    assert ended.outcome == INCONCLUSIVE and "What would settle it" in ended.reason


def test_a_repeat_that_fails_as_infrastructure_ends_the_suite_as_a_fail():
    decision = decide(run({KL: {10: 0.035}}), [run({}, failure_class="infrastructure")], SPREAD)
    assert decision.outcome == FAIL and "infrastructure" in decision.reason


def test_a_repeat_stopped_before_the_breached_points_is_no_evidence_yet():
    first = run({KL: {20: 0.035}})
    stopped = RunPoints(FAIL, "accuracy", [Point(KL, 5, 0.0, 0.03, False)], complete=False)  # never reached step 20
    assert decide(first, [stopped], SPREAD, budget=2).outcome is None


def test_without_a_spread_one_repeat_decides_by_the_same_metric_in_the_same_direction():
    first = RunPoints(FAIL, "accuracy", [], {"response/rewards/mean": -1})
    assert decide(first, [], None).outcome is None
    again = RunPoints(FAIL, "accuracy", [], {"response/rewards/mean": -1})
    assert decide(first, [again], None).outcome == REPRODUCED
    other = RunPoints(FAIL, "accuracy", [], {"mismatch/mismatch_k3_kl": 1})
    decision = decide(first, [other], None)
    assert decision.outcome == NOT_REPRODUCED and "records no run-to-run spread" in decision.reason
    assert decide(first, [RunPoints(PASS, None)], None).outcome == NOT_REPRODUCED


def test_the_max_deviation_factor_matches_the_runbooks_three_runs():
    assert deviation.max_dev_factor(3, 5) == pytest.approx(1.615, abs=0.01)
    assert deviation.max_dev_factor(3, 6) == pytest.approx(1.680, abs=0.01)


def test_a_healthy_runs_breach_chance_follows_the_normal_tail():
    # One point, threshold 2 sd of a difference (sigma * sqrt(1 + 1/N)): 4.55%.
    sd = 0.01 * math.sqrt(1 + 1 / 3)
    assert deviation.healthy_breach_rate(0.01, 2 * sd, 1, 3) == pytest.approx(0.0455, abs=0.0005)
    assert deviation.healthy_breach_rate(0.01, 2 * sd, 6, 3) == pytest.approx(1 - (1 - 0.0455) ** 6, abs=0.002)


def test_the_shipped_opd_golden_table_gives_the_spread_from_the_runbooks_measured_deviations():
    spec = load_suite("opd")
    provenance, _ = engines.get("opd").shipped(spec)
    spread = engines.get("opd").spread(spec, provenance.model_dump(mode="json"))
    assert spread is not None and spread.runs == 3
    assert spread.sigma[KL] == pytest.approx(0.0174 / deviation.max_dev_factor(3, 5))  # measured over 5 points
    assert spread.sigma[GSM] == pytest.approx(0.0169 / deviation.max_dev_factor(3, 6))  # and over 6
    assert "time/step" not in spread.sigma  # reference only: never judged


def test_a_version_without_statistics_gives_opd_no_spread():
    assert engines.get("opd").spread(load_suite("opd"), {"runs": 3, "statistics": {}}) is None


def test_grpos_prior_reads_its_thresholds_as_the_runbooks_rule_on_n_minus_1_degrees_of_freedom():
    """Issue 43: the runbook records no GRPO spread; its thresholds read backwards (1.5 x the expected max deviation
    of the baseline's 5 runs in the statistic the check compares) are a prior the runs then move."""
    grpo = load_suite("grpo")
    provenance, _ = engines.get("grpo").shipped(grpo)
    spread = engines.get("grpo").spread(grpo, provenance.model_dump(mode="json"))
    assert spread is not None and spread.runs == 5 and spread.points_per_metric == 45
    p80 = deviation.percentile_dev_factor(5, 45, 80.0)[0]
    assert spread.sigma["response/rewards/mean"] == pytest.approx(0.1 / (1.5 * p80))
    assert spread.sigma["response/response_len/mean"] == pytest.approx(0.12 / (1.5 * p80))
    assert spread.sigma["mismatch/mismatch_k3_kl"] == pytest.approx(1e-4 / (1.5 * deviation.max_dev_factor(5, 45)))
    assert spread.sigma["eval/accuracy"] == pytest.approx(0.05 / (1.5 * deviation.max_dev_factor(5, 1)))
    assert set(spread.df.values()) == {4.0} and "time/step" not in spread.sigma
    assert "the mismatch bound itself stays the runbook's absolute one" in spread.source
    # A calibrated version's measured max deviation replaces the reading for an absolute metric.
    measured = engines.get("grpo").spread(grpo, {"runs": 4, "statistics": {"max_dev": {
        "response/rewards/mean": {"max_dev": 0.08}}}})
    assert measured.sigma["response/rewards/mean"] == pytest.approx(0.08 / deviation.max_dev_factor(4, 45))
    assert measured.df["response/rewards/mean"] == deviation.max_dev_df(4, 45)


def test_the_simulated_rates_of_the_rule_at_the_runbooks_opd_noise():
    layout = confirm.Layout({KL: 0.03, GSM: 0.03}, {KL: STEPS, GSM: STEPS})
    healthy = confirm.simulate(layout, SPREAD, samples=400, seed=3)
    single = 1 - (1 - deviation.healthy_breach_rate(0.01, 0.03, len(STEPS), 3)) ** 2
    assert abs((1 - healthy[PASS]) - single) < 0.04  # the simulated first runs FAIL as the normal tail says
    assert healthy[REPRODUCED] < 0.02 and healthy["runs"] < 1.2
    shifted = confirm.simulate(layout, SPREAD, shift={KL: 0.04}, samples=200, seed=3)
    assert shifted["detected"] > 0.95
    mde = confirm.minimum_detectable_shift(layout, SPREAD, KL, samples=150)
    assert 0.01 < mde < 0.04
