"""The grpo engine: runbook section 1, everything about judging a run against a baseline tracker.

The comparison, the card's criteria, the live check, the calibration proposal, the validation of a
stored baseline version and the provenance of the baseline that ships (``GrpoEngine``, the module's
``ENGINE``). The suites that use it name ``"engine": "grpo"`` in their spec.

The verdict on the checked metrics belongs to the checkout's own ``check_rl_result``: it runs in a
subprocess (the package's own interpreter, its own working folder inside the output folder,
``GITHUB_RUN_ID``/``GITHUB_STEP_SUMMARY`` pointing inside that folder, a timeout) on sanitised
copies of the trackers. The package then adds what the runbook asks for separately: the final-step
``eval/accuracy`` (|delta| < 0.05) and, when given, the e2e wall time (< 2400 s). The metric table
is computed by the package for display, the way the checker applies the thresholds (p80 of
per-step errors where it aggregates, the worst step where it goes step by step); where that table
disagrees with the checker, the checker's verdict stands and the disagreement is reported.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from rl_verify import settings
from rl_verify.core.errors import CheckerError, InputError
from rl_verify.core.live import (Certain, LiveCheck, LiveResult, Status, WAITING, BREACHED, WARNING, WITHIN,
                                 compact_tracker, compared_points, near_bound, steps_text, tracker_from_text,
                                 wall_time_breach)
from rl_verify.core.model import (STEP_COUNT, Check, SuiteResult, failure_class_of, missing_findings,
                                  verdict_of, within)
from rl_verify.core.nextsteps import GRPO_RULES, suggest
from rl_verify.core.plots import Panel, plot_panels
from rl_verify.core.provenance import Provenance
from rl_verify.core.shapes import ComparedPoint, classify
from rl_verify.core.thresholds import GrpoThresholds, Rule, load_data
from rl_verify.core.tracker import MARKER, Point, Tracker, read_tracker, write_sanitised
from rl_verify.engines.base import TRACKER_FILE, Engine
from rl_verify.suites.card import fmt, threshold_text
from rl_verify.suites.spec import SuiteSpec, data_file, read_spec

SUITE = "grpo"
WALL_TIME = "e2e wall time"          # the name of the wall-time row (budget: the suite spec's)
CHECKER_FOLDER = "checker"           # the checker's working folder inside the output folder
CHECKER_RUN_ID = "rl-verify"         # GITHUB_RUN_ID given to the checker: its PNG lands in <cwd>/<id>/
STEP_ROUND = 5                       # the checker rounds step-by-step errors to 5 decimals
STDERR_TAIL_CHARS = 3000
_CHECKER_STEP = re.compile(r"\bstep (\d+)\b")

# Runs inside the subprocess. Kept as a file in the working folder so a human can re-run it.
RUNNER = '''\
"""Runs the checkout's check_rl_result exactly as runbook section 1 shows (written by rl-verify)."""
import json
import sys

checker_dir, base, cur, info_path, result_path, case_name = sys.argv[1:7]
sys.path.insert(0, checker_dir)  # the checkout's autotest/ must come first: it imports utils.*
from utils.check_metric import check_rl_result  # noqa: E402

with open(info_path, encoding="utf-8") as handle:
    assert_info = json.load(handle)
try:
    ok, message = check_rl_result(case_name, base, cur, assert_info)
    result = {"status": "returned", "ok": bool(ok), "message": str(message)}
except AssertionError as exc:  # the checker's way of saying "different number of RL steps"
    result = {"status": "assertion", "ok": False, "message": str(exc)}
with open(result_path, "w", encoding="utf-8") as handle:
    json.dump(result, handle)
'''


@dataclass
class CheckerOutcome:
    """What the checker said. ``step_count`` is True when it raised its step-count AssertionError."""

    ok: bool
    message: str
    status: str
    png: str | None
    workdir: str
    step_summary: str
    stdout: str
    stderr: str

    @property
    def step_count(self) -> bool:
        return self.status == "assertion" and "steps" in self.message.lower()

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "status": self.status, "png": self.png,
                "workdir": self.workdir, "step_summary": self.step_summary, "stdout": self.stdout,
                "stderr": self.stderr, "reason": "step count" if self.step_count else None}


def load_thresholds(path: str | Path) -> GrpoThresholds:
    """The versioned GRPO thresholds (assert_info, percentile metrics, final eval), validated."""
    return load_data(path, GrpoThresholds, "give a thresholds file in the format of the suite spec's data file "
                                           "(the suites folder's data/, see the suite spec's 'data')")


def _checker_file(checker_dir: Path) -> Path:
    """Validate that ``checker_dir`` is a checkout's autotest folder; return check_metric.py."""
    target = checker_dir / "utils" / "check_metric.py"
    if not target.is_file():
        raise InputError("no utils/check_metric.py under the checker dir", checker_dir, None,
                         "the checker dir must be the checkout's autotest folder (<checkout>/autotest)")
    return target


def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def run_checker(checker_dir: Path, workdir: Path, base_copy: Path, cur_copy: Path,
                assert_info: dict[str, Any], timeout_s: float, case_name: str) -> CheckerOutcome:
    """Run ``check_rl_result`` in a subprocess with ``workdir`` as its cwd; never raises for a
    FAIL. Raises ``CheckerError`` when the checker crashes, writes no result, or times out (the
    whole process group is killed)."""
    # The subprocess runs with cwd=workdir: every path handed to it must be absolute.
    workdir, base_copy, cur_copy = workdir.resolve(), base_copy.resolve(), cur_copy.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    runner = workdir / "run_checker.py"
    runner.write_text(RUNNER, encoding="utf-8")
    info = workdir / "assert_info.json"
    info.write_text(json.dumps(assert_info, indent=1), encoding="utf-8")
    result_path = workdir / "checker_result.json"
    result_path.unlink(missing_ok=True)
    summary = workdir / "step_summary.md"
    stdout_path, stderr_path = workdir / "checker.stdout.log", workdir / "checker.stderr.log"
    env = dict(os.environ)
    env.update({"GITHUB_RUN_ID": CHECKER_RUN_ID, "GITHUB_STEP_SUMMARY": str(summary), "MPLBACKEND": "Agg"})
    cmd = [sys.executable, str(runner), str(checker_dir.resolve()), str(base_copy), str(cur_copy), str(info),
           str(result_path), case_name]
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        # Own session: on timeout the whole group (checker + anything it spawned) is killed.
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CheckerError(f"checker timed out after {timeout_s:g} s and was killed", checker_dir / "utils"
                               / "check_metric.py", None, "check the checkout's checker (hang?) or raise the timeout",
                               stderr_tail=_tail(stderr_path)) from None
    if code != 0 or not result_path.is_file():
        raise CheckerError(f"checker crashed (exit status {code})", checker_dir / "utils" / "check_metric.py", None,
                           f"read the traceback below / {stderr_path}; fix the checkout or the inputs",
                           stderr_tail=_tail(stderr_path))
    result = json.loads(result_path.read_text(encoding="utf-8"))
    png: Path | None = workdir / CHECKER_RUN_ID / f"{case_name}_comparison.png"
    if not png.is_file():
        # A checkout whose checker names its plot differently: keep whatever PNG it left in <cwd>/<run id>/.
        plots = workdir / CHECKER_RUN_ID
        png = next(iter(sorted(plots.glob("*.png"))), None) if plots.is_dir() else None
    return CheckerOutcome(ok=bool(result["ok"]), message=str(result["message"]), status=result["status"],
                          png=str(png) if png is not None else None, workdir=str(workdir),
                          step_summary=str(summary), stdout=str(stdout_path), stderr=str(stderr_path))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def checker_reasons(message: str) -> dict[str, str]:
    """{metric: reason} from the checker's "Some metric check failed: {...}" message ({} if unparsable)."""
    _, sep, tail = message.partition("failed:")
    if sep:
        try:
            parsed = ast.literal_eval(tail.strip())
        except (ValueError, SyntaxError):
            return {}
        if isinstance(parsed, dict):
            return {str(k): str(v) for k, v in parsed.items()}
    return {}


def translate_checker_step(reason: str, breach_index: int | None, breach_step: int | None) -> str | None:
    """Say which tracker step the checker's own "step N" in ``reason`` is, or None when it needs no saying.

    The checker counts the step-summary rows itself (the real one from 0); the report speaks in the
    tracker's step numbers. ``breach_index`` is the 0-based row index of the first breaching row,
    ``breach_step`` that row's tracker step.
    """
    match = _CHECKER_STEP.search(reason)
    if match is None or breach_index is None or breach_step is None:
        return None
    number = int(match.group(1))
    if number == breach_step:
        return None
    if number == breach_index:
        return f"checker index {number} (counted from 0) = step {breach_step}"
    if number == breach_index + 1:
        return f"checker row {number} (counted from 1) = step {breach_step}"
    return f"checker's own step {number}; the first breaching tracker step is {breach_step}"


def failed_metrics(message: str, metrics: list[str]) -> set[str] | None:
    """Metric names the checker's "Some metric check failed: {metric: reason, ...}" message names.

    Parses the dict when it is a Python literal (``checker_reasons``), else falls back to the
    checked names found in the text. None when nothing can be identified.
    """
    reasons = checker_reasons(message)
    if reasons:
        return set(reasons)
    found = {m for m in metrics if m in message}
    return found or None


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
                 expected_steps: int | None = None, wall_time_budget_s: float | None = None) -> SuiteResult:
    """GRPO verdict: checker (subprocess) + final eval/accuracy + optional wall time.

    The thresholds, step count and wall-time budget default to those of the suite spec ``suite``.
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
    assert_info = data.checker_assert_info()
    rules, final = data.rules, data.final_eval
    metrics = [r.metric for r in rules]
    _checker_file(checker_dir)
    wall = wall_time_check(wall_time_s, wall_time_budget_s) if wall_time_s is not None else None
    base = read_tracker(baseline, metrics + [final.metric])
    cur = read_tracker(current, metrics + [final.metric])

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




class GrpoLive(LiveCheck):
    """Live GRPO checks against the baseline tracker, with the final comparison's rule code
    (``step_errors``, ``stepwise_breach``, ``percentile_fail_count``).

    Built from JSON (it travels to the triggerer): ``data`` the thresholds file's content, ``baseline``
    the baseline tracker's step rows as JSONL (``core.live.compact_tracker``), the spec's step count and
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


# ----------------------------------------------------------------------------- the engine

def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def grpo_criteria(spec: SuiteSpec, data: GrpoThresholds) -> list[str]:
    """The card's acceptance criteria: the final eval, every checked metric and how, the wall time."""
    fe = data.final_eval
    rows = ["| metric | method | threshold | how |", "|---|---|---|---|",
            f"| `{fe.metric}` | {fe.method} | {fe.operator} {fmt(fe.threshold)} | final step only |"]
    for rule in data.rules:
        q = data.percentile_metrics.get(rule.metric)
        how = f"p{q:g} of per-step errors" if q is not None else "every step"
        rows.append(f"| `{rule.metric}` | {rule.method} | {threshold_text(rule)} | {how} |")
    rows.append(f"| {WALL_TIME} | - | < {spec.wall_time_budget_s // 60} min | whole run |")
    rows.append("")
    rows.append(f"Decided by the checkout's own `check_rl_result` with the runbook's `assert_info`; "
                f"source: {data.source.document}.")
    return rows


def grpo_proposal(spec: SuiteSpec, trackers: Mapping[str, str | Path], current_data: Path) -> Any:
    """GRPO: the baseline tracker of per-step means over every metric the checker and the final eval
    judge (``baseline.jsonl``), with the largest run-to-run deviation of each metric."""
    # pandas, numpy: kept out of DAG parsing and of the triggerer.
    from rl_verify.core import calibration as calib

    thresholds = load_thresholds(current_data)
    metrics = [MARKER] + [r.metric for r in thresholds.rules] + [thresholds.final_eval.metric]
    stats = calib.step_statistics(calib.run_table(trackers, metrics, spec.expected_steps))
    rows = calib.grpo_baseline_rows(stats, list(trackers))
    text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
    worst = stats.loc[stats.groupby("metric")["max_dev"].idxmax()]
    lines = ["| metric | steps | mean at the last step | largest deviation from the mean (step, run) |",
             "|---|---|---|---|"]
    summary: dict[str, Any] = {}
    last = int(stats["step"].max())
    for row in worst.itertuples(index=False):
        at_last = stats[(stats["metric"] == row.metric) & (stats["step"] == last)]["mean"]
        mean = float(at_last.iloc[0]) if len(at_last) else None
        steps = int((stats["metric"] == row.metric).sum())
        summary[row.metric] = {"max_dev": float(row.max_dev), "at_step": int(row.step), "run": str(row.worst_run)}
        lines.append(f"| {calib.cell(row.metric)} | {steps} | {calib.fmt_value(mean)} | {row.max_dev:.4g} (step "
                     f"{row.step}, run {calib.cell(str(row.worst_run))}) |")
    markdown = (f"Proposed baseline tracker: per-step mean of {len(trackers)} runs, {len(rows)} lines "
                "(XTuner's tracker format; the checkout's check_rl_result reads it).\n\n" + "\n".join(lines) + "\n")
    return calib.Proposal({TRACKER_FILE: text.encode("utf-8")}, {"runs": len(trackers), "max_dev": summary},
                          markdown, [])


class GrpoEngine(Engine):
    """Judged against a baseline tracker: the checkout's ``check_rl_result`` + final eval + wall time."""

    name = "grpo"
    describe = "the checkout's check_rl_result + final eval/accuracy + wall time"
    baseline_file = TRACKER_FILE
    baseline_is_data = False
    rules = GRPO_RULES

    def load_data(self, path: Path) -> GrpoThresholds:
        return load_thresholds(path)

    def judged_metrics(self, data: GrpoThresholds) -> list[str]:
        return [r.metric for r in data.rules]

    def criteria(self, spec: SuiteSpec, data: GrpoThresholds) -> list[str]:
        return grpo_criteria(spec, data)

    def compare_archived(self, spec: SuiteSpec, suite_dir: Path, out: Path, meta: Mapping[str, Any],
                         node_name: str | None, version: Mapping[str, Path], plot: bool = True) -> SuiteResult:
        return compare_grpo(baseline=version.get(TRACKER_FILE, suite_dir / settings.BASELINE_TRACKER_FILE),
                            current=suite_dir / "tracker.jsonl",
                            checker_dir=suite_dir / "checker" / "autotest", out_dir=out,
                            wall_time_s=meta.get("wall_time_s"), timeout_s=settings.CHECKER_TIMEOUT_S,
                            thresholds=data_file(spec.data), suite=spec.name, expected_steps=spec.expected_steps,
                            wall_time_budget_s=spec.wall_time_budget_s, plot=plot)

    def cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--baseline", required=True, help="baseline tracker.jsonl")
        parser.add_argument("--current", required=True, help="current run's tracker.jsonl")
        parser.add_argument("--checker-dir", required=True,
                            help="the checkout's autotest folder (holds utils/check_metric.py)")
        parser.add_argument("--out", required=True, help="output folder for report.json/md/html and plots")
        parser.add_argument("--commit", default=None, help="full SHA of the code under test")
        parser.add_argument("--wall-time-s", type=float, default=None, help="e2e wall time of the run in seconds")
        parser.add_argument("--timeout-s", type=_positive_float, default=600.0, help="checker timeout (default 600)")

    def cli_compare(self, args: argparse.Namespace, spec: SuiteSpec, out: Path) -> SuiteResult:
        return compare_grpo(Path(args.baseline), Path(args.current), Path(args.checker_dir), out,
                            wall_time_s=args.wall_time_s, timeout_s=args.timeout_s, thresholds=data_file(spec.data),
                            suite=spec.name, expected_steps=spec.expected_steps,
                            wall_time_budget_s=spec.wall_time_budget_s)

    def live_baseline(self, spec: SuiteSpec) -> str | None:
        return spec.baseline

    def live(self, spec: SuiteSpec, baseline: bytes | None, data: Any) -> GrpoLive | None:
        if baseline is None:
            return None  # the checker compares against the baseline tracker: nothing to judge without it
        path = data_file(spec.data)
        thresholds = json.loads(path.read_text(encoding="utf-8"))
        self.load_data(path)  # refused here, in the worker, when it does not fit
        tracker = tracker_from_text(baseline.decode("utf-8", errors="replace"), "baseline")
        return GrpoLive(thresholds, compact_tracker(tracker), spec.expected_steps, spec.wall_time_budget_s)

    def shipped(self, spec: SuiteSpec) -> tuple[Provenance, dict[str, bytes]]:
        if not spec.baseline:
            raise InputError(f"suite {spec.name} names no baseline tracker", None, None,
                             "set the spec's baseline (the share path of the baseline tracker)")
        source = load_thresholds(data_file(spec.data)).source
        return Provenance(
            source="shipped", runs=source.runs, baseline_ref=spec.baseline,
            statistics={"kind": f"average of {source.runs} historical runs", "recorded": source.baseline,
                        "document": source.document},
            note=(f"The baseline tracker on the GPU node's share ({spec.baseline}), referenced, not copied; "
                  f"{source.document}: \"{source.quote}\"")), {}

    def propose(self, spec: SuiteSpec, trackers: Mapping[str, Path], current_data: Path,
                commit: str | None) -> Any:
        return grpo_proposal(spec, trackers, current_data)


ENGINE = GrpoEngine()
