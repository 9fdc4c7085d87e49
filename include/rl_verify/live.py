"""Live checking of a growing tracker: a FAIL as soon as it is certain, never a false one.

A suite is judged while it trains, with the final comparison's own rule code (``grpo.step_errors``,
``grpo.stepwise_breach``, ``grpo.percentile_fail_count``, ``opd.point_check``) and threshold data.
:meth:`check` returns the breaches that make the final verdict FAIL whatever the remaining steps
bring (``Certain``), and a status per checked metric (within / breached / warning / waiting):

* ``every-step``: a metric checked step by step breaks its bound at some step (GRPO
  ``mismatch/mismatch_k3_kl``, ``time/step``); a NaN or infinite value breaks it too.
* ``percentile``: a metric judged by the p80 of per-step errors has as many breaching steps as
  :func:`grpo.percentile_fail_count` says decide it for the run's step count, or a NaN error (the
  percentile of a series holding NaN is NaN, which never holds).
* ``eval-point``: an OPD eval point breaks its golden value once its rows are in (reference-only
  metrics never decide).
* ``wall-time``: the run has used more than its wall-time budget.

Anything less (a metric near its bound, breaching steps short of the count, a NaN at a step the
final comparison does not judge) is a warning: reported, never acted on. No Airflow import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rl_verify.model import FAIL, Check, SuiteResult, failure_class_of
from rl_verify.nextsteps import EngineRules
from rl_verify.grpo import percentile_fail_count, step_errors, stepwise_breach
from rl_verify.opd import point_check, wanted_at
from rl_verify.thresholds import GrpoThresholds, OpdGolden, Rule
from rl_verify.tracker import Tracker

#: A metric whose latest error has used this share of its threshold is reported as a warning.
NEAR_BOUND = 0.8
WITHIN, BREACHED, WARNING, WAITING = "within", "breached", "warning", "waiting"


@dataclass(frozen=True)
class Certain:
    """A breach no remaining step can undo: the suite's final verdict is FAIL."""

    metric: str
    step: int | None
    rule: str
    text: str
    baseline: float | None = None
    current: float | None = None
    error: float | None = None
    threshold: float | None = None
    operator: str = "<"
    method: str = "absolute"
    #: How the metric left its bound, as far as the steps so far show (``shapes.KINDS``), or None.
    shape: str | None = None


@dataclass(frozen=True)
class Status:
    """Where one checked metric stands now."""

    metric: str
    state: str
    text: str


@dataclass
class LiveResult:
    """What one look at the growing tracker found."""

    steps: int
    certain: list[Certain] = field(default_factory=list)
    status: list[Status] = field(default_factory=list)

    @property
    def doomed(self) -> bool:
        return bool(self.certain)


def _near(rule: Rule, error: float) -> bool:
    return math.isfinite(error) and rule.threshold > 0 and error >= NEAR_BOUND * rule.threshold


def _wall_time(elapsed_s: float | None, budget_s: float) -> Certain | None:
    if elapsed_s is not None and elapsed_s >= budget_s:
        return Certain("e2e wall time", None, "wall-time",
                       f"e2e wall time {elapsed_s:.0f} s has reached the budget of < {budget_s:.0f} s",
                       None, float(elapsed_s), float(elapsed_s), float(budget_s), "<", "value")
    return None


class GrpoLive:
    """Live GRPO checks against the baseline tracker (read in full before the run is watched)."""

    def __init__(self, data: GrpoThresholds, baseline: Tracker, expected_steps: int, budget_s: float) -> None:
        self.data, self.baseline = data, baseline
        self.expected_steps, self.budget_s = expected_steps, budget_s

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
        wall = _wall_time(elapsed_s, self.budget_s)
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
                found = Certain(rule.metric, point.step, kind, text, base[i].value, point.value, error,
                                rule.threshold, rule.operator, rule.method, shape)
                return [found], Status(rule.metric, BREACHED, text)
        last = errors[-1]
        if _near(rule, last):
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
                    f"{rule.threshold:g} (steps {_steps(breaching)}); {needed} decide its p{q:g}")
            found = Certain(rule.metric, breaching[needed - 1], "percentile", text, None, None, None, rule.threshold,
                            rule.operator, rule.method)
            return [found], Status(rule.metric, BREACHED, text)
        if breaching:
            return [], Status(rule.metric, WARNING, f"{len(breaching)} step(s) outside (FAIL certain at {needed} of "
                                                    f"{self.expected_steps}): steps {_steps(breaching)}")
        return [], Status(rule.metric, WITHIN, f"every step within {rule.operator} {rule.threshold:g} so far")


class OpdLive:
    """Live OPD checks: each eval point against the golden table as soon as its rows are in."""

    def __init__(self, golden: OpdGolden, golden_path: Path, eval_points: list[int], budget_s: float,
                 baseline: Tracker | None = None) -> None:
        self.golden, self.golden_path = golden, golden_path
        self.points, self.budget_s, self.baseline = sorted(eval_points), budget_s, baseline

    def check(self, cur: Tracker, elapsed_s: float | None = None) -> LiveResult:
        result = LiveResult(steps=cur.steps)
        for metric, rule in self.golden.thresholds.items():
            found, status = self._metric(rule, cur)
            result.certain += found
            result.status.append(status)
        wall = _wall_time(elapsed_s, self.budget_s)
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
                found = Certain(rule.metric, step, "eval-point", text, check.baseline, check.current, check.error,
                                rule.threshold, rule.operator, rule.method, shape)
                return [found], Status(rule.metric, BREACHED, text)
            seen.append(check)
        unjudged = [p.step for p in cur.series(rule.metric) if not math.isfinite(p.value)]
        if unjudged:
            return [], Status(rule.metric, WARNING, f"not finite at step {unjudged[0]} (judged at eval points only)")
        if not seen:
            return [], Status(rule.metric, WAITING, "no eval point in yet")
        last = seen[-1]
        if last.error is not None and _near(rule, last.error):
            return [], Status(rule.metric, WARNING, f"error {last.error:.5g} at eval point {last.step} is "
                                                    f"{last.error / rule.threshold:.0%} of the threshold")
        return [], Status(rule.metric, WITHIN, f"eval points {', '.join(str(c.step) for c in seen)} within")


def _steps(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f" (+{len(steps) - 8} more)" if len(steps) > 8 else "")


def progress(result: LiveResult, expected_steps: int, elapsed_s: float | None) -> str:
    """One task-log line: ``step N/M``, the ETA from the observed step time, every metric's status."""
    eta = ""
    if elapsed_s and result.steps:
        per_step = elapsed_s / result.steps
        eta = f", ETA {max(0, expected_steps - result.steps) * per_step / 60:.1f} min ({per_step:.1f} s/step observed)"
    states = "; ".join(s.metric + " " + s.state + (f" ({s.text})" if s.state in (BREACHED, WARNING) else "")
                       for s in result.status)
    return f"step {result.steps}/{expected_steps}{eta} | {states}"


def aborted_checks(certain: list[Certain]) -> list[Check]:
    """The comparison rows of an early abort: one failing row per certain breach."""
    return [Check(metric=c.metric, step=c.step, baseline=c.baseline, current=c.current, error=c.error,
                  threshold=c.threshold, operator=c.operator,
                  method=c.method, passed=False, first_breach_step=c.step, source="live",
                  shape=c.shape, shape_text=_shape_text(c), breach_steps=str(c.step),
                  note=f"early abort ({c.rule}): {c.text}") for c in certain]


def _shape_text(c: Certain) -> str:
    if c.shape == "from-start":
        return f"outside its bound from the first compared step {c.step} (the run was stopped there)"
    if c.shape == "non-finite":
        return f"NaN/Infinity at step {c.step}"
    return ""


def aborted_result(suite: str, abort: dict, rules: EngineRules) -> SuiteResult:
    """The suite's FAIL after an early abort, from what the live check recorded (``abort.json``).

    One failing row per certain breach (its rule and the step where it became certain in the note),
    the class those rows call for, "aborted at step N of M" first among the findings, and the
    runbook's next steps for the breached metrics.
    """
    from rl_verify.nextsteps import suggest

    certain = [Certain(**{k: _number(v) if k in _FLOATS else v for k, v in c.items()}) for c in abort["certain"]]
    checks = aborted_checks(certain)
    failure_class = failure_class_of(checks, FAIL)
    rules_named = "; ".join(f"{c.metric} ({c.rule}, step {c.step})" for c in certain)
    abnormal = [f"Aborted at step {abort['step']} of {abort['expected_steps']}: the final verdict could no longer "
                f"be PASS ({rules_named}); the job was stopped early (early_abort on). "
                + "; ".join(c.text for c in certain)]
    abnormal += [f"Live warning: {w}" for w in abort.get("warnings") or []]
    result = SuiteResult(suite=suite, verdict=FAIL, failure_class=failure_class, checks=checks, abnormal=abnormal,
                         details={"early_abort": {k: v for k, v in abort.items() if k != "certain"}})
    result.next_steps = suggest(rules, checks, FAIL, failure_class)
    return result


_FLOATS = {"baseline", "current", "error", "threshold"}


def _number(value: object) -> float | None:
    """A float back from its JSON form ("nan"/"inf" were written as text)."""
    return float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None


def partial_plot(suite: str, certain: list[dict], current: Path, baseline: Path | None, golden: OpdGolden | None,
                 out: Path) -> Path | None:
    """PNG of the breached metrics' partial curves (what the run wrote before it was stopped)."""
    from rl_verify.plots import Panel, plot_panels
    from rl_verify.tracker import EVAL_PREFIX, read_tracker

    metrics = list(dict.fromkeys(c["metric"] for c in certain if c["metric"] != "e2e wall time"))
    if not metrics or not current.is_file():
        return None
    cur = read_tracker(current, metrics)
    base = read_tracker(baseline, metrics) if baseline is not None and baseline.is_file() else None
    panels = []
    for metric in metrics:
        def series(t: Tracker) -> list[tuple[float, float]]:
            if metric.startswith(EVAL_PREFIX):
                return [(s, v[metric].value) for s, v in sorted(t.evals.items()) if metric in v]
            return [(p.step, p.value) for p in t.series(metric)]

        reference, label = (series(base), "baseline") if base is not None else ([], "baseline")
        if golden is not None and not reference:
            reference = [(s, golden.golden[s][metric]) for s in golden.eval_points if metric in golden.golden[s]]
            label = "golden"
        mine = [c for c in certain if c["metric"] == metric]
        failing = [(c["step"], _number(c.get("current"))) for c in mine
                   if c.get("step") is not None and _number(c.get("current")) is not None]
        panels.append(Panel(metric, reference, series(cur), mine[0].get("method", "absolute"),
                            _number(mine[0].get("threshold")), failing, baseline_label=label,
                            note=f"stopped at step {cur.steps}"))
    return plot_panels(out / f"{suite}_metrics.png", f"{suite.upper()}: FAIL, aborted early (partial curves)", panels)
