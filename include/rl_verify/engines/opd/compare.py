"""The opd engine's comparison (runbook section 2): every eval point of a run against the golden table.

* Each eval point of the golden file (0/5/10/15/20/25) is compared: eval metrics from the row that
  carries them at that step (step 0 is the eval-only row), training metrics from step-summary row N.
  Step 0 has no training metrics ("-" in the golden table), so none are compared there.
* ``response/response_len/mean`` and ``time/step`` have no golden values: their reference comes from
  ``baseline`` (a tracker) when given; otherwise the rows are reported with ``passed=None`` and one
  abnormal finding says how to provide the reference (``missing_reference``: the caller's words, so
  a DAG report names the path on the node and the CLI its flag). ``time/step`` is reference only
  (machine-dependent): never failing.
* A golden point or metric missing from the current tracker is a FAIL marked ``missing`` (an
  infrastructure failure and an abnormal finding, never a breach), never a pass.
* Eval points beyond the calibrated range (a 50-step run) are listed as "not calibrated" (passed None).
"""

from __future__ import annotations

import math
from functools import reduce
from pathlib import Path

from rl_verify.core.model import Check, SuiteResult, failure_class_of, missing_findings, verdict_of
from rl_verify.core.nextsteps import suggest
from rl_verify.core.plots import Panel, plot_panels
from rl_verify.core.shapes import ComparedPoint, classify
from rl_verify.core.thresholds import Rule
from rl_verify.core.tracker import EVAL_PREFIX, Point, Tracker, read_tracker
from rl_verify.engines.opd.rules import OPD_RULES
from rl_verify.engines.opd.thresholds import OpdGolden, load_golden
from rl_verify.suites.spec import SuiteSpec, data_file, read_spec

SUITE = "opd"
# Errors are rounded to drop binary float noise (|0.5586 - 0.5286| must equal 0.03, not 0.0299999...).
ERROR_DIGITS = 10
# A long run (hundreds of eval points past the calibrated range) is summarised, not listed in full.
MAX_UNCALIBRATED_POINTS = 20
NO_REFERENCE = "not compared: the golden table has no value for it and there is no reference baseline"


def _in_golden_anywhere(golden: OpdGolden, metric: str) -> bool:
    return any(metric in row for row in golden.golden.values())


def _reference(metric: str, step: int, golden: OpdGolden | None, golden_path: Path,
               base: Tracker | None) -> tuple[float | None, str]:
    """(reference value, where it comes from / why there is none); ``golden`` None: past its range."""
    value = golden.value(step, metric) if golden is not None else None
    if value is not None:
        return value, f"golden table {golden_path.name} step {step}"
    if base is None:
        return None, NO_REFERENCE
    point = base.value_at(metric, step)
    if point is None:
        return None, f"no baseline value: baseline tracker {Path(base.path).name} has no {metric} at step {step}"
    return point.value, f"baseline tracker {Path(base.path).name} line {point.line}"


def point_check(rule: Rule, step: int, golden: OpdGolden, golden_path: Path,
                cur: Tracker, base: Tracker | None, calibrated: bool = True) -> Check:
    """One (metric, eval point) comparison row."""
    metric, method, operator, threshold = rule.metric, rule.method, rule.operator, rule.threshold
    reference_only = rule.reference_only
    # Past the calibrated range the golden table has nothing; only a baseline tracker can be shown.
    ref, ref_note = _reference(metric, step, golden if calibrated else None, golden_path, base)
    if not calibrated:
        ref_note = f"not calibrated (beyond the golden table's step {golden.calibrated_max_step}); {ref_note}"
    cp: Point | None = cur.value_at(metric, step)
    row = dict(metric=metric, step=step, threshold=threshold, operator=operator, method=method, source="golden")
    where = "eval row" if metric.startswith(EVAL_PREFIX) else "step-summary row"
    if cp is None:
        judged = not (reference_only or not calibrated)
        return Check(baseline=ref, current=None, error=None, passed=False if judged else None, missing=judged,
                     note=f"missing: no {metric} in a current {where} at step {step}", **row)
    cur_note = f"current line {cp.line}"
    if ref is None:
        return Check(baseline=None, current=cp.value, error=None, passed=None, note=f"{ref_note}; {cur_note}", **row)
    error = rule.error(ref, cp.value)
    error = round(error, ERROR_DIGITS) if math.isfinite(error) else error
    ok = rule.holds(error)
    note = f"reference: {ref_note}; {cur_note}"
    if not calibrated:
        return Check(baseline=ref, current=cp.value, error=error, passed=None, note=note, **row)
    if reference_only:
        return Check(baseline=ref, current=cp.value, error=error, passed=None,
                     note=note + f"; reference only (machine-dependent): would {'pass' if ok else 'fail'}", **row)
    return Check(baseline=ref, current=cp.value, error=error, passed=ok, first_breach_step=None if ok else step,
                 note=note, **row)


def wanted_at(metric: str, step: int, golden: OpdGolden) -> bool:
    """False for the golden table's "-" cells: training metrics at step 0, metrics the table leaves empty."""
    if golden.value(step, metric) is not None:
        return True
    if _in_golden_anywhere(golden, metric):
        return False  # "-" in the golden table at this step
    return step != 0 or metric.startswith(EVAL_PREFIX)  # step 0 is the eval-only row


def uncalibrated_steps(cur: Tracker, golden: OpdGolden, points: list[int]) -> list[int]:
    """Eval points of the current run beyond the calibrated range (eval rows, or summary rows on the
    eval interval of ``points``)."""
    limit = golden.calibrated_max_step
    diffs = [b - a for a, b in zip(points, points[1:]) if b > a]
    interval = reduce(math.gcd, diffs) if diffs else 0
    steps = {s for s in cur.evals if s > limit}
    if interval:
        steps |= {r.step for r in cur.rows if r.step > limit and r.step % interval == 0}
    return sorted(steps)


def add_shapes(checks: list[Check]) -> None:
    """Classify how each failing metric left its bound over its eval points; mark its failing rows."""
    for metric in dict.fromkeys(c.metric for c in checks):
        rows = [c for c in checks if c.metric == metric and c.step is not None and c.passed is not None
                and not c.missing]
        shape = classify([ComparedPoint(c.step, c.current, c.error, c.passed is False) for c in rows],
                         rows[0].threshold if rows else None)
        if shape is None:
            continue
        for c in rows:
            if c.passed is False:
                c.shape, c.shape_text, c.breach_steps = shape.kind, shape.text, shape.steps


def _panels(checks: list[Check], cur: Tracker, metrics: list[str]):
    panels = []
    for metric in metrics:
        mine = [c for c in checks if c.metric == metric and c.step is not None]
        if metric.startswith(EVAL_PREFIX):
            current = [(s, v[metric].value) for s, v in sorted(cur.evals.items()) if metric in v]
        else:
            current = [(p.step, p.value) for p in cur.series(metric)]
        reference = [(c.step, c.baseline) for c in mine if c.baseline is not None]
        failing = [(c.step, c.current if c.current is not None else math.nan) for c in mine if c.passed is False]
        spec = next((c for c in mine), None)
        panels.append(Panel(metric, reference, current, spec.method if spec else "absolute",
                            spec.threshold if spec else None, failing,
                            baseline_label=("golden" if any("reference: golden table" in c.note for c in mine)
                                            else "baseline"),
                            note="reference only" if metric == "time/step" else ""))
    return panels


def compare_opd(current: Path, out_dir: Path, golden: Path | None = None, baseline: Path | None = None,
                plot: bool = True, missing_reference: str | None = None, suite: str = SUITE,
                eval_points: list[int] | None = None) -> SuiteResult:
    """OPD verdict: every eval point of the current tracker against the golden table.

    The golden file and the eval points default to those of the suite spec ``suite``.
    ``missing_reference`` says, in the caller's terms, why there is no reference baseline and how
    to provide one; it ends the abnormal finding about metrics left uncompared.
    Raises ``InputError`` for a missing/malformed tracker or golden file.
    """
    if golden is None or eval_points is None:
        spec = read_spec(suite)
        golden = golden if golden is not None else data_file(spec.data)
        eval_points = eval_points if eval_points is not None else list(spec.eval_points)
    golden_path = Path(golden).resolve()
    table = load_golden(golden_path)
    points = sorted(eval_points)
    current = Path(current).resolve()
    out_dir = Path(out_dir)
    metrics = list(table.thresholds)
    cur = read_tracker(current, metrics)
    base = read_tracker(Path(baseline).resolve(), metrics) if baseline is not None else None

    checks: list[Check] = []
    for step in points:
        for metric, rule in table.thresholds.items():
            if wanted_at(metric, step, table):
                checks.append(point_check(rule, step, table, golden_path, cur, base))
    abnormal = list(cur.abnormal) + (list(base.abnormal) if base else [])
    extra = uncalibrated_steps(cur, table, points)
    for step in extra[:MAX_UNCALIBRATED_POINTS]:
        for metric, rule in table.thresholds.items():
            if cur.value_at(metric, step) is not None:
                checks.append(point_check(rule, step, table, golden_path, cur, base, calibrated=False))
    if extra:
        limit = table.calibrated_max_step
        abnormal.append(f"{current}: eval points {extra[0]}-{extra[-1]} lie beyond the calibrated range "
                        f"(step {limit}); "
                        "listed as not calibrated (record a 50-step CI baseline before judging them)"
                        + (f"; only the first {MAX_UNCALIBRATED_POINTS} are listed"
                           if len(extra) > MAX_UNCALIBRATED_POINTS else ""))

    uncompared = sorted({c.metric for c in checks if c.note.startswith(NO_REFERENCE)})
    if uncompared:
        abnormal.append(f"{', '.join(uncompared)} not compared: the golden table has no values for them and "
                        + (missing_reference or "no reference baseline tracker was given") + ".")
    add_shapes(checks)
    abnormal += missing_findings(checks)
    verdict = verdict_of(checks)
    trackers = {"current": str(current), "golden": str(golden_path)}
    if base is not None:
        trackers["baseline"] = base.path
    result = SuiteResult(suite=suite, verdict=verdict, failure_class=failure_class_of(checks, verdict),
                         checks=checks, abnormal=abnormal, trackers=trackers,
                         details={"golden_source": table.source.model_dump(), "eval_points": points,
                                  "current_steps": cur.steps})
    result.next_steps = suggest(OPD_RULES, checks, verdict, result.failure_class)
    if plot:
        png = plot_panels(out_dir / f"{suite}_metrics.png", f"OPD: {verdict} (current {current.name} vs golden "
                          f"{golden_path.name})", _panels(checks, cur, metrics))
        result.plots.append(str(png.resolve()))
    return result


def missing_reference_hint(spec: SuiteSpec, path: str, node_name: str | None) -> str:
    """Why a suite has no reference baseline and how to provide one, in a DAG user's terms."""
    return (f"there is no reference baseline at {path} on node {node_name or '?'}: to compare them, put the tracker "
            f"of a {spec.expected_steps}-step run of the baseline config there (the suite spec's reference_baseline, "
            f"{spec.reference_baseline}; CI_SHARE_BASELINE comes from the node connection's extras, an Airflow "
            "Variable or the environment)")
