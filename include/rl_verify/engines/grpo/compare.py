"""The grpo engine's comparison (runbook section 1): a run's tracker against the baseline tracker.

The verdict on the checked metrics belongs to the checkout's own ``check_rl_result`` (``checker``). The
package then adds what the runbook asks for separately: the final-step ``eval/accuracy`` (|delta| < 0.05)
and, when given, the e2e wall time (< 2400 s). The metric table is computed by the package for display,
the way the checker applies the thresholds (p80 of per-step errors where it aggregates, the worst step
where it goes step by step); where that table disagrees with the checker, the checker's verdict stands and
the disagreement is reported.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from rl_verify.core.errors import InputError
from rl_verify.core.model import (STEP_COUNT, TIMING_METRICS, Check, SuiteResult, failure_class_of, missing_findings,
                                  verdict_of, within)
from rl_verify.core.nextsteps import suggest
from rl_verify.core.plots import Panel, plot_panels
from rl_verify.core.shapes import ComparedPoint, classify
from rl_verify.core.thresholds import Rule
from rl_verify.core.tracker import Point, Tracker, read_tracker, write_sanitised
from rl_verify.engines.grpo.checker import (CHECKER_FOLDER, CheckerOutcome, checker_file, checker_reasons,
                                            failed_metrics, run_checker, translate_checker_step)
from rl_verify.engines.grpo.rules import GRPO_RULES
from rl_verify.engines.grpo.thresholds import GrpoThresholds, load_thresholds
from rl_verify.suites.spec import data_file, read_spec

SUITE = "grpo"
WALL_TIME = "e2e wall time"          # the name of the wall-time row (budget: the suite spec's)
STEP_ROUND = 5                       # the checker rounds step-by-step errors to 5 decimals


def _percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, as the checker computes it; NaN propagates."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


def _mean(points: list[Point]) -> float:
    return math.fsum(p.value for p in points) / len(points) if points else math.nan


def _worst(errors: list[float]) -> int:
    """Index of the worst error; a NaN counts as worst (it can never pass)."""
    best_i, best = 0, -math.inf
    for i, e in enumerate(errors):
        if math.isnan(e):
            return i
        if e > best:
            best_i, best = i, e
    return best_i


def step_errors(rule: Rule, base: list[Point], cur: list[Point]) -> list[float]:
    """Per-step errors of ``cur`` against ``base``, paired by position as the checker pairs them.

    Unrounded: a percentile is taken over these; a metric checked step by step rounds them to
    ``STEP_ROUND`` decimals first (see :func:`stepwise_breach`).
    """
    return [rule.error(x.value, y.value) for x, y in zip(base, cur)]


def stepwise_breach(rule: Rule, error: float) -> bool:
    """Whether one step breaks a metric checked step by step (the checker rounds first)."""
    return not rule.holds(round(error, STEP_ROUND))


def percentile_fail_count(steps: int, q: float) -> int:
    """How many breaching steps of ``steps`` make the p``q`` of per-step errors breach, whatever the rest.

    numpy's linear percentile (what the checker takes) lies between s[f] and s[f + 1] of the sorted
    errors s, f = floor(q / 100 * (steps - 1)), so it is at least s[f]; s[f] breaches once
    ``steps - f`` errors breach (they fill the top places of the order). With one fewer, s[f] can be
    any within error and the percentile may still hold: that many never decides.
    """
    return steps - math.floor((q / 100) * (steps - 1))


def metric_check(rule: Rule, base: Tracker, cur: Tracker, percentiles: dict[str, float],
                 checker_reason: str | None = None) -> Check:
    """The display row for one assert_info entry, applying the threshold as the checker does.

    ``checker_reason`` is what the checker said of this metric, if it failed it: its own step number
    is translated into the tracker's (see ``translate_checker_step``).
    """
    metric, threshold, method, operator = rule.metric, rule.threshold, rule.method, rule.operator
    q = percentiles.get(metric)
    b, c = base.series(metric), cur.series(metric)
    row = dict(metric=metric, threshold=threshold, operator=operator, method=method, source="checker")
    if not b and not c:
        return Check(step=None, baseline=None, current=None, error=None, passed=None,
                     note="absent from both trackers: the checker skips it", **row)
    if len(b) != len(c):
        return Check(step=None, baseline=float(len(b)), current=float(len(c)), error=None, passed=False,
                     missing=True, note=f"missing values: baseline has {len(b)} values, current {len(c)} "
                                        "(the checker fails this metric; nothing comparable was measured)", **row)
    errors = step_errors(rule, b, c)
    stepwise = [round(e, STEP_ROUND) for e in errors]
    breach = next((i for i, e in enumerate(errors) if stepwise_breach(rule, e)), None)
    first_breach = c[breach].step if breach is not None else None
    shape = classify([ComparedPoint(y.step, y.value, e, not rule.holds(e))
                      for y, e in zip(c, stepwise)], threshold)
    row.update(shape=shape.kind if shape else None, shape_text=shape.text if shape else "",
               breach_steps=shape.steps if shape else "")
    translated = translate_checker_step(checker_reason or "", breach, first_breach)
    said = f"; {translated}" if translated else ""
    if q is not None:
        agg = _percentile(errors, float(q))
        return Check(step=None, baseline=_mean(b), current=_mean(c), error=agg, passed=rule.holds(agg),
                     first_breach_step=first_breach,
                     note=f"error = p{q:g} of {len(errors)} per-step {method} errors (steps {c[0].step}-{c[-1].step}); "
                          f"baseline/current = mean over those step-summary rows"
                          + (f"; first step whose own error breaks the bound: {first_breach}" if first_breach else "")
                          + said, **row)
    worst = _worst(stepwise)
    note = (f"worst of {len(errors)} steps (baseline line {b[worst].line}, current line {c[worst].line}); "
            "error rounded to 5 decimals")
    if breach is not None:
        note += f"; the checker fails it at the first breaking step, step {first_breach}{said}"
    return Check(step=c[worst].step, baseline=b[worst].value, current=c[worst].value, error=stepwise[worst],
                 passed=breach is None, first_breach_step=first_breach, note=note, **row)


def step_count_check(base: Tracker, cur: Tracker, outcome: CheckerOutcome) -> Check:
    """Number of RL step-summary rows, as the checker counts them (equal or AssertionError)."""
    passed = not outcome.step_count and base.steps == cur.steps
    note = "step-summary rows (marker response/rewards/mean) in each tracker"
    if outcome.step_count:
        note = f"step count: the checker raised AssertionError: {outcome.message}"
    return Check(metric=STEP_COUNT, step=None, baseline=float(base.steps), current=float(cur.steps),
                 error=float(cur.steps - base.steps), threshold=0.0, operator="==", method="count",
                 passed=passed, source="checker", note=note)


def final_eval_check(base: Tracker, cur: Tracker, rule: Rule, baseline_path: Path) -> Check:
    """Last ``eval/accuracy`` value in each file, |delta| < threshold (runbook section 1)."""
    metric, threshold, operator, method = rule.metric, rule.threshold, rule.operator, rule.method
    bp, cp = base.last.get(metric), cur.last.get(metric)
    if bp is None:
        raise InputError(f"baseline tracker has no {metric} value", baseline_path, None,
                         f"use the GRPO baseline tracker, which records {metric} at its final step")
    row = dict(metric=metric, threshold=threshold, operator=operator, method=method, source="final-eval")
    if cp is None:
        return Check(step=None, baseline=bp.value, current=None, error=None, passed=False, missing=True,
                     note=f"missing: the current tracker has no {metric} (baseline step {bp.step}, line {bp.line})",
                     **row)
    error = rule.error(bp.value, cp.value)
    shape = classify([ComparedPoint(cp.step, cp.value, error, not rule.holds(error))], threshold)
    return Check(step=cp.step, baseline=bp.value, current=cp.value, error=error, passed=rule.holds(error),
                 first_breach_step=None if rule.holds(error) else cp.step,
                 shape=shape.kind if shape else None, shape_text=shape.text if shape else "",
                 breach_steps=shape.steps if shape else "",
                 note=f"last value in each file: baseline step {bp.step} line {bp.line}, "
                      f"current step {cp.step} line {cp.line}", **row)


def wall_time_check(wall_time_s: float, budget_s: float) -> Check:
    """e2e wall time (seconds, measured by the caller) < the suite spec's budget."""
    if not isinstance(wall_time_s, (int, float)) or not math.isfinite(wall_time_s) or wall_time_s < 0:
        raise InputError(f"wall time must be a non-negative number of seconds, got {wall_time_s!r}", None, None,
                         "the wall time must be the launch-to-end duration of the run in seconds")
    return Check(metric=WALL_TIME, step=None, baseline=None, current=float(wall_time_s),
                 error=float(wall_time_s), threshold=float(budget_s), operator="<", method="value",
                 passed=within(float(wall_time_s), "<", float(budget_s)), source="wall-time",
                 note="seconds from launch to end of run, measured by the caller (not from a tracker)")


def reconcile(checks: list[Check], outcome: CheckerOutcome, metrics: list[str]) -> list[str]:
    """Make the checker's verdict stand over the package's table; return abnormal notes."""
    notes: list[str] = []
    if outcome.step_count:
        for c in checks:
            if c.source == "checker" and c.metric != STEP_COUNT:
                c.passed, c.missing, c.shape, c.shape_text, c.breach_steps = None, False, None, "", ""
                c.note += "; not judged: the checker stopped at the step-count assertion"
        return notes
    named = set() if outcome.ok else failed_metrics(outcome.message, metrics)
    if named is None:
        notes.append(f"The checker failed without naming a checked metric: {outcome.message!r}")
        return notes
    for c in checks:
        if c.source != "checker" or c.metric == STEP_COUNT:
            continue
        verdict = c.metric not in named
        if c.passed is None and verdict:
            continue  # skipped by both
        if c.passed != verdict:
            notes.append(f"Table vs checker disagreement on {c.metric}: the package computed "
                         f"{'pass' if c.passed else 'fail' if c.passed is False else 'not judged'}, the checker says "
                         f"{'pass' if verdict else 'fail'}; the checker's verdict stands")
            c.note += f"; package computed {c.passed}, checker verdict stands"
            c.passed = verdict
    return notes


def _translation(check: Check) -> str | None:
    match = re.search(r"checker (?:index|row|'s own step) [^;]*", check.note)
    return f"{check.metric}: {match.group(0)}" if match else None


def step_times(base: Tracker, cur: Tracker, metric: str = "time/step") -> dict[str, Any] | None:
    """Observed seconds per step: current mean and slowest step, baseline mean (None without data)."""
    b, c = base.series(metric), cur.series(metric)
    finite = [p for p in c if math.isfinite(p.value)]
    if not finite or not b:
        return None
    slowest = max(finite, key=lambda p: p.value)
    return {"current_mean": _mean(finite), "current_max": slowest.value, "current_max_step": slowest.step,
            "baseline_mean": _mean(b)}


def _panels(base: Tracker, cur: Tracker, rules: list[Rule], final: Rule):
    panels = []
    for rule in rules:
        metric = rule.metric
        b, c = base.series(metric), cur.series(metric)
        failing = [(y.step, y.value) for x, y in zip(b, c) if not rule.holds(round(rule.error(x.value, y.value),
                                                                                    STEP_ROUND))]
        panels.append(Panel(metric, [(p.step, p.value) for p in b], [(p.step, p.value) for p in c], rule.method,
                            rule.threshold, failing, note="p80 decides" if metric.startswith("response/") else ""))
    metric, thr = final.metric, final.threshold

    def evals(t: Tracker) -> list[tuple[float, float]]:
        return [(s, v[metric].value) for s, v in sorted(t.evals.items()) if metric in v]

    bl, cl = base.last.get(metric), cur.last.get(metric)
    failing = []
    if bl and cl and not final.holds(final.error(bl.value, cl.value)):
        failing = [(cl.step, cl.value)]
    panels.append(Panel(metric, evals(base), evals(cur), final.method, thr, failing, note="final step decides"))
    return panels


def compare_grpo(baseline: Path, current: Path, checker_dir: Path, out_dir: Path,
                 wall_time_s: float | None = None, timeout_s: float = 600,
                 thresholds: GrpoThresholds | str | Path | None = None, plot: bool = True, suite: str = SUITE,
                 expected_steps: int | None = None, wall_time_budget_s: float | None = None,
                 timing_judged: bool = True) -> SuiteResult:
    """GRPO verdict: checker (subprocess) + final eval/accuracy + optional wall time.

    The thresholds, step count and wall-time budget default to those of the suite spec ``suite``.
    ``timing_judged=False`` (a run that recorded its executed lines, slower than the unrecorded baseline): the
    timing checks (``TIMING_METRICS``) are shown, never judged, and not given to the checker.
    Raises ``InputError`` for bad inputs and ``CheckerError`` when the checker crashes or times out.
    """
    # Absolute paths: the report must name concrete files, and the checker runs in another cwd.
    baseline, current = Path(baseline).resolve(), Path(current).resolve()
    checker_dir, out_dir = Path(checker_dir).resolve(), Path(out_dir).resolve()
    if thresholds is None or expected_steps is None or wall_time_budget_s is None:
        spec = read_spec(suite)
        thresholds = thresholds if thresholds is not None else data_file(spec.data)
        expected_steps = expected_steps if expected_steps is not None else spec.expected_steps
        wall_time_budget_s = wall_time_budget_s if wall_time_budget_s is not None else spec.wall_time_budget_s
    data = thresholds if isinstance(thresholds, GrpoThresholds) else load_thresholds(thresholds)
    timing = [] if timing_judged else [r for r in data.rules if r.metric in TIMING_METRICS]
    if timing:
        kept = [r for r in data.rules if r not in timing]
        data = data.model_copy(update={"assert_info": data.assert_info.model_copy(update={"check_metrics": kept})})
    assert_info = data.checker_assert_info()
    rules, final = data.rules, data.final_eval
    metrics = [r.metric for r in rules]
    checker_file(checker_dir)
    wall = wall_time_check(wall_time_s, wall_time_budget_s) if wall_time_s is not None else None
    base = read_tracker(baseline, metrics + [r.metric for r in timing] + [final.metric])
    cur = read_tracker(current, metrics + [r.metric for r in timing] + [final.metric])

    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = out_dir / CHECKER_FOLDER
    base_copy = write_sanitised(base, workdir / "inputs" / "baseline.tracker.jsonl")
    cur_copy = write_sanitised(cur, workdir / "inputs" / "current.tracker.jsonl")
    outcome = run_checker(checker_dir, workdir, base_copy, cur_copy, assert_info, timeout_s, data.case_name)

    percentiles = dict(data.percentile_metrics)
    reasons = checker_reasons(outcome.message) if not outcome.ok else {}
    checks = [step_count_check(base, cur, outcome)]
    checks += [metric_check(r, base, cur, percentiles, reasons.get(r.metric)) for r in rules]
    abnormal = base.abnormal + cur.abnormal  # each already names its file:line
    abnormal += reconcile(checks, outcome, metrics)
    if base.steps != expected_steps:
        abnormal.append(f"{baseline}: baseline has {base.steps} RL step-summary rows; the suite spec expects "
                        f"{expected_steps}")
    checks.append(final_eval_check(base, cur, final, baseline))
    if wall is not None:
        checks.append(wall)
    if timing:  # shown, never judged: the recording's cost is not the code's
        shown = [metric_check(r, base, cur, {}, None) for r in timing] + [c for c in checks if c.metric == WALL_TIME]
        checks = [c for c in checks if c.metric != WALL_TIME] + [unjudged_timing(c) for c in shown]

    if checks[0].passed is False:
        abnormal.append(f"Wrong step count: the current tracker has {cur.steps} RL step-summary rows, the baseline "
                        f"{base.steps}; the checker judged no metric")
    abnormal += missing_findings(checks)
    verdict = verdict_of(checks, extra_failure=not outcome.ok)
    result = SuiteResult(
        suite=suite, verdict=verdict, failure_class=failure_class_of(checks, verdict), checks=checks,
        abnormal=abnormal, trackers={"baseline": str(baseline), "current": str(current),
                                     "checker baseline copy": str(base_copy), "checker current copy": str(cur_copy)},
        checker=outcome.to_dict(),
        details={"case_name": data.case_name, "checker_dir": str(checker_dir), "assert_info": assert_info,
                 "baseline_steps": base.steps, "current_steps": cur.steps,
                 "step_times": step_times(base, cur),
                 "checker_step_translations": [t for c in checks if (t := _translation(c))]},
    )
    result.next_steps = suggest(GRPO_RULES, checks, verdict, result.failure_class,
                                step_times=result.details["step_times"])
    if plot:
        png = plot_panels(out_dir / f"{suite}_metrics.png",
                          f"GRPO: {verdict} (baseline {baseline.name} vs current {current.name})",
                          _panels(base, cur, rules, final))
        result.plots.append(str(png))
    if outcome.png:
        result.plots.append(outcome.png)
    return result


#: Why a recorded run's timing is not judged (issue 53, item 7).
RECORDED_TIMING = ("not judged: this run recorded its executed lines with coverage.py (executed-code evidence), "
                   "which slows its steps; the unrecorded baseline's timing does not compare")


def unjudged_timing(check: Check) -> Check:
    """``check`` (a timing check of a recorded run) shown with what it would say, never judged."""
    would = "" if check.passed is None else f"; would {'pass' if check.passed else 'fail'}"
    return dataclasses.replace(check, passed=None, first_breach_step=None,
                               note="; ".join(n for n in (check.note, RECORDED_TIMING + would) if n))
