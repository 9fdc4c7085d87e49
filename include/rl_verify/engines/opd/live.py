"""The opd engine's live check: each eval point of a growing tracker against the golden table as soon as
its rows are in, with the final comparison's ``point_check``.

Its certain breach (``core.livecheck.Certain``) is ``eval-point``: an eval point breaks its golden value once
its rows are in (reference-only metrics never decide); or ``wall-time``: the budget is used up.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rl_verify.core.livecheck import (BREACHED, WAITING, WARNING, WITHIN, Certain, LiveCheck, LiveResult, Status,
                                      compared_points, near_bound, tracker_from_text, wall_time_breach)
from rl_verify.core.thresholds import Rule
from rl_verify.core.tracker import Tracker
from rl_verify.engines.opd.compare import point_check, wanted_at
from rl_verify.engines.opd.thresholds import OpdGolden


class OpdLive(LiveCheck):
    """Live OPD checks: each eval point against the golden table as soon as its rows are in, with the
    final comparison's ``point_check``.

    Built from JSON (it travels to the triggerer): ``golden`` the golden table's content, the name it
    is known by, the spec's eval points and wall-time budget, and the reference baseline's step rows as
    JSONL (``core.livecheck.compact_tracker``) when there is one.
    """

    def __init__(self, golden: dict[str, Any], golden_name: str, eval_points: list[int], budget_s: float,
                 baseline: str | None = None) -> None:
        self._golden, self._baseline_text = golden, baseline
        self.golden, self.golden_path = OpdGolden.model_validate(golden), Path(golden_name)
        self.points, self.budget_s = sorted(int(p) for p in eval_points), float(budget_s)
        self.baseline = tracker_from_text(baseline, "baseline") if baseline is not None else None

    def kwargs(self) -> dict[str, Any]:
        return {"golden": self._golden, "golden_name": str(self.golden_path), "eval_points": self.points,
                "budget_s": self.budget_s, "baseline": self._baseline_text}

    def check(self, cur: Tracker, elapsed_s: float | None = None) -> LiveResult:
        result = LiveResult(steps=cur.steps)
        for metric, rule in self.golden.thresholds.items():
            found, status = self._metric(rule, cur)
            result.certain += found
            result.status.append(status)
        wall = wall_time_breach(elapsed_s, self.budget_s)
        if wall:
            result.certain.append(wall)
        return result

    def _metric(self, rule: Rule, cur: Tracker) -> tuple[list[Certain], Status]:
        seen = []
        for step in self.points:
            if not wanted_at(rule.metric, step, self.golden) or cur.value_at(rule.metric, step) is None:
                continue  # not judged at this point (as in the final comparison), or its row is not in yet
            check = point_check(rule, step, self.golden, self.golden_path, cur, self.baseline)
            if check.passed is False and not check.missing:
                text = (f"{rule.metric} at eval point {step}: {check.current:.5g} vs golden {check.baseline:.5g}, "
                        f"error {check.error:.5g} breaks {rule.operator} {rule.threshold:g}")
                shape = "from-start" if not seen else None  # off at the first point it is judged at
                points = compared_points([(c.step, c.current, c.error, False) for c in seen]
                                         + [(step, check.current, check.error, True)])
                found = Certain(rule.metric, step, "eval-point", text, check.baseline, check.current, check.error,
                                rule.threshold, rule.operator, rule.method, shape, points)
                return [found], Status(rule.metric, BREACHED, text)
            seen.append(check)
        unjudged = [p.step for p in cur.series(rule.metric) if not math.isfinite(p.value)]
        if unjudged:
            return [], Status(rule.metric, WARNING, f"not finite at step {unjudged[0]} (judged at eval points only)")
        if not seen:
            return [], Status(rule.metric, WAITING, "no eval point in yet")
        last = seen[-1]
        if last.error is not None and near_bound(rule, last.error):
            return [], Status(rule.metric, WARNING, f"error {last.error:.5g} at eval point {last.step} is "
                                                    f"{last.error / rule.threshold:.0%} of the threshold")
        return [], Status(rule.metric, WITHIN, f"eval points {', '.join(str(c.step) for c in seen)} within")
