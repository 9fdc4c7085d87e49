"""The grpo engine's live check: a growing tracker against the baseline tracker, with the final
comparison's own rule code.

The kinds of certain breach it finds (``core.livecheck.Certain``):

* ``every-step``: a metric checked step by step breaks its bound at some step (``mismatch/mismatch_k3_kl``,
  ``time/step``); a NaN or infinite value breaks it too.
* ``percentile``: a metric judged by the p80 of per-step errors has as many breaching steps as
  :func:`~rl_verify.engines.grpo.compare.percentile_fail_count` says decide it for the run's step count,
  or a NaN error (the percentile of a series holding NaN is NaN, which never holds).
* ``step-count``: more step-summary rows than the suite runs; ``wall-time``: the budget is used up.
"""

from __future__ import annotations

import math
from typing import Any

from rl_verify.core.livecheck import (BREACHED, WAITING, WARNING, WITHIN, Certain, LiveCheck, LiveResult, Status,
                                      compared_points, near_bound, steps_text, tracker_from_text, wall_time_breach)
from rl_verify.core.thresholds import Rule
from rl_verify.core.tracker import Tracker
from rl_verify.engines.grpo.compare import STEP_ROUND, percentile_fail_count, step_errors, stepwise_breach
from rl_verify.engines.grpo.thresholds import GrpoThresholds


class GrpoLive(LiveCheck):
    """Live GRPO checks against the baseline tracker, with the final comparison's rule code
    (``step_errors``, ``stepwise_breach``, ``percentile_fail_count``).

    Built from JSON (it travels to the triggerer): ``data`` the thresholds file's content, ``baseline``
    the baseline tracker's step rows as JSONL (``core.livecheck.compact_tracker``), the spec's step count and
    wall-time budget.
    """

    def __init__(self, data: dict[str, Any], baseline: str, expected_steps: int, budget_s: float) -> None:
        self._data, self._baseline_text = data, baseline
        self.data = GrpoThresholds.model_validate(data)
        self.baseline = tracker_from_text(baseline, "baseline")
        self.expected_steps, self.budget_s = int(expected_steps), float(budget_s)

    def kwargs(self) -> dict[str, Any]:
        return {"data": self._data, "baseline": self._baseline_text, "expected_steps": self.expected_steps,
                "budget_s": self.budget_s}

    def check(self, cur: Tracker, elapsed_s: float | None = None) -> LiveResult:
        result = LiveResult(steps=cur.steps)
        for rule in self.data.rules:
            q = self.data.percentile_metrics.get(rule.metric)
            found, status = (self._percentile(rule, q, cur) if q is not None else self._every_step(rule, cur))
            result.certain += found
            result.status.append(status)
        if cur.steps > self.expected_steps:
            result.certain.append(Certain("RL steps", cur.steps, "step-count",
                                          f"{cur.steps} step-summary rows, more than the {self.expected_steps} "
                                          "the suite runs: the step count can no longer match"))
        wall = wall_time_breach(elapsed_s, self.budget_s)
        if wall:
            result.certain.append(wall)
        return result

    def _series(self, rule: Rule, cur: Tracker) -> tuple[list, list[float]]:
        c = cur.series(rule.metric)
        b = self.baseline.series(rule.metric)[: len(c)]
        return c[: len(b)], step_errors(rule, b, c)

    def _every_step(self, rule: Rule, cur: Tracker) -> tuple[list[Certain], Status]:
        points, errors = self._series(rule, cur)
        if not errors:
            return [], Status(rule.metric, WAITING, "no step yet")
        base = self.baseline.series(rule.metric)
        for i, (point, error) in enumerate(zip(points, errors)):
            if stepwise_breach(rule, error):
                kind = "every-step" if math.isfinite(error) else "non-finite"
                text = (f"{rule.metric} error {error:.5g} at step {point.step} breaks {rule.operator} "
                        f"{rule.threshold:g} (checked at every step)")
                shape = "non-finite" if kind == "non-finite" else "from-start" if i == 0 else None
                seen = compared_points((p.step, p.value, round(e, STEP_ROUND), stepwise_breach(rule, e))
                                       for p, e in zip(points[: i + 1], errors[: i + 1]))
                found = Certain(rule.metric, point.step, kind, text, base[i].value, point.value, error,
                                rule.threshold, rule.operator, rule.method, shape, seen)
                return [found], Status(rule.metric, BREACHED, text)
        last = errors[-1]
        if near_bound(rule, last):
            return [], Status(rule.metric, WARNING, f"error {last:.5g} at step {points[-1].step} is "
                                                    f"{last / rule.threshold:.0%} of the threshold")
        return [], Status(rule.metric, WITHIN, f"max error {max(errors):.5g} < {rule.threshold:g}")

    def _percentile(self, rule: Rule, q: float, cur: Tracker) -> tuple[list[Certain], Status]:
        points, errors = self._series(rule, cur)
        if not errors:
            return [], Status(rule.metric, WAITING, "no step yet")
        needed = percentile_fail_count(self.expected_steps, q)
        non_finite = [p.step for p, e in zip(points, errors) if not math.isfinite(e)]
        if non_finite:
            text = (f"{rule.metric} is not finite at step {non_finite[0]}: its p{q:g} over the run can never hold")
            found = Certain(rule.metric, non_finite[0], "non-finite", text, None, math.nan, math.nan, rule.threshold,
                            rule.operator, rule.method, "non-finite")
            return [found], Status(rule.metric, BREACHED, text)
        breaching = [p.step for p, e in zip(points, errors) if not rule.holds(e)]
        if len(breaching) >= needed:
            text = (f"{rule.metric}: {len(breaching)} of {self.expected_steps} steps outside {rule.operator} "
                    f"{rule.threshold:g} (steps {steps_text(breaching)}); {needed} decide its p{q:g}")
            seen = compared_points((p.step, p.value, e, not rule.holds(e)) for p, e in zip(points, errors))
            found = Certain(rule.metric, breaching[needed - 1], "percentile", text, None, None, None, rule.threshold,
                            rule.operator, rule.method, None, seen)
            return [found], Status(rule.metric, BREACHED, text)
        if breaching:
            return [], Status(rule.metric, WARNING, f"{len(breaching)} step(s) outside (FAIL certain at {needed} of "
                                                    f"{self.expected_steps}): steps {steps_text(breaching)}")
        return [], Status(rule.metric, WITHIN, f"every step within {rule.operator} {rule.threshold:g} so far")
