"""GRPO's confirmation from evidence (issue 43): its judged points, its prior spread, and what the rule does with
them (a breach no noise produces ends FAIL at once; a healthy repeat on a noisier node clears the first run's FAIL)."""

from __future__ import annotations

import math

from conftest import dump_rows, grpo_rows
from rl_verify.core import confirm, deviation
from rl_verify.core.model import Check, SuiteResult
from rl_verify.engines import engine_of, load_suite

SPEC = load_suite("grpo")
ENGINE = engine_of(SPEC)
REWARDS, LENGTH, MISMATCH, ACC = ("response/rewards/mean", "response/response_len/mean", "mismatch/mismatch_k3_kl",
                                  "eval/accuracy")


def _run(tmp_path, name: str, breached: tuple[str, ...] = (), **rows) -> confirm.RunPoints:
    folder = tmp_path / name
    folder.mkdir()
    dump_rows(folder / "tracker.jsonl", grpo_rows(**rows))
    dump_rows(folder / "baseline.jsonl", grpo_rows())
    checks = [Check(metric=m, step=None, baseline=0.0, current=1.0, error=1.0, threshold=0.1, operator="<",
                    method="absolute", passed=False, source="checker") for m in breached]
    verdict = "FAIL" if breached else "PASS"
    result = SuiteResult(suite="grpo", verdict=verdict, failure_class="accuracy" if breached else None,
                         checks=checks)
    return ENGINE.run_points(SPEC, folder, result, {"tracker.jsonl": folder / "baseline.jsonl"})


def test_a_runs_points_are_every_steps_signed_difference_and_the_final_eval(tmp_path):
    points = _run(tmp_path, "ok", rewards=lambda i: 0.5 + 0.005 * i - 0.01, length=lambda i: (300.0 + i) * 1.05,
                  final_acc=0.88)
    by_metric: dict[str, list[confirm.Point]] = {}
    for p in points.points:
        by_metric.setdefault(p.metric, []).append(p)
    assert sorted(by_metric) == [ACC, MISMATCH, LENGTH, REWARDS]  # time/step: performance, never repeated
    assert [p.step for p in by_metric[REWARDS]] == list(range(1, 46))
    assert all(math.isclose(p.diff, -0.01, abs_tol=1e-12) for p in by_metric[REWARDS])
    assert all(math.isclose(p.diff, 0.05) for p in by_metric[LENGTH])  # relative: divided by the baseline's value
    (acc,) = by_metric[ACC]
    assert acc.step == 45 and math.isclose(acc.diff, 0.88 - 0.9007) and not acc.breached
    assert points.complete and not any(p.breached for p in points.points)


def test_a_breached_p80_metric_marks_the_steps_that_broke_its_bound(tmp_path):
    points = _run(tmp_path, "len", breached=(LENGTH,),
                  length=lambda i: (300.0 + i) * (1.2 if i > 30 else 1.0))
    breached = sorted(p.step for p in points.points if p.breached)
    assert breached == list(range(31, 46))


def test_a_mismatch_breach_thirty_times_its_level_is_no_noise_and_ends_fail_at_once(tmp_path):
    """sim/regress-mismatch: 3.8e-4 against a healthy 1.3e-5 at step 1; the first run, stopped there by early
    abort, is not repeated (the report says why)."""
    first = _run(tmp_path, "mismatch", breached=(MISMATCH,), steps=45, mismatch=lambda i: 3.8e-4)
    spread = ENGINE.spread(SPEC, None)
    decision = confirm.decide(first, [], spread, confirm.Rule(budget=2))
    assert decision.outcome == confirm.FAIL and "no noise reaches it" in decision.reason
    assert MISMATCH in decision.reason


def test_a_noisier_nodes_p80_breach_is_repeated_and_a_repeat_with_no_shift_clears_it(tmp_path):
    import random

    rng = random.Random(5)
    spread = ENGINE.spread(SPEC, None)
    first = _run(tmp_path, "first", breached=(LENGTH,), length=lambda i: (300.0 + i) * (1 + rng.gauss(0, 0.10)))
    assert confirm.decide(first, [], spread, confirm.Rule(budget=2)).outcome is None  # noise could: repeat
    repeats = [_run(tmp_path, f"r{k}", length=lambda i: (300.0 + i) * (1 + rng.gauss(0, 0.09))) for k in (1, 2)]
    decided = confirm.decide(first, repeats, spread, confirm.Rule(budget=2))
    assert decided.outcome == confirm.NOT_REPRODUCED, decided.reason
    shifted = [_run(tmp_path, f"s{k}", length=lambda i: (300.0 + i) * (1.22 + rng.gauss(0, 0.06))) for k in (1,)]
    assert confirm.decide(first, shifted, spread, confirm.Rule(budget=2)).outcome == confirm.REPRODUCED


def test_grpos_error_rates_are_simulated_with_its_p80_verdict():
    layout = ENGINE.judged_layout(SPEC, {})
    spread = ENGINE.spread(SPEC, None)
    assert layout.percentiles == {REWARDS: 80.0, LENGTH: 80.0} and layout.steps[ACC] == (45,)
    # At the prior's own spread a single step often leaves the 12% bound, its p80 over 45 steps seldom does.
    any_step = deviation.healthy_breach_rate(spread.sigma[LENGTH], 0.12, 45, 5)
    p80 = deviation.healthy_breach_rate(spread.sigma[LENGTH], 0.12, 45, 5, percentile=80)
    assert any_step > 0.5 and p80 < 0.05
