"""The opd engine: runbook section 2, every eval point against a golden table.

Everything about judging a run against a golden table (``OpdEngine``, the module's ``ENGINE``): the
comparison, the card's criteria, the live check, the calibration proposal (the runbook's x1.5 rule),
the validation of a stored golden table and the provenance of the table that ships. The suites that
use it name ``"engine": "opd"`` in their spec. The comparison promises:

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

import argparse
import json
import math
import tempfile
from collections.abc import Mapping
from datetime import date
from functools import reduce
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rl_verify import settings
from rl_verify.core.confirm import Point as ConfirmPoint
from rl_verify.core.confirm import Layout, RunPoints, Spread, max_dev_df, sigma_from_max_dev
from rl_verify.core.errors import InputError
from rl_verify.core.live import (Certain, LiveCheck, LiveResult, Status, WAITING, BREACHED, WARNING, WITHIN,
                                 compact_tracker, compared_points, near_bound, tracker_from_text, wall_time_breach)
from rl_verify.core.model import Check, SuiteResult, failure_class_of, missing_findings, verdict_of
from rl_verify.core.nextsteps import OPD_RULES, suggest
from rl_verify.core.plots import Panel, plot_panels
from rl_verify.core.provenance import Provenance
from rl_verify.core.report import text_table
from rl_verify.core.shapes import ComparedPoint, classify
from rl_verify.core.thresholds import OpdGolden, Rule, field_errors, load_data, parse_json
from rl_verify.core.tracker import EVAL_PREFIX, Point, Tracker, read_tracker
from rl_verify.engines.base import Engine
from rl_verify.suites.card import fmt, threshold_text
from rl_verify.suites.spec import SuiteSpec, data_file, read_spec

SUITE = "opd"
# Errors are rounded to drop binary float noise (|0.5586 - 0.5286| must equal 0.03, not 0.0299999...).
ERROR_DIGITS = 10
# A long run (hundreds of eval points past the calibrated range) is summarised, not listed in full.
MAX_UNCALIBRATED_POINTS = 20
NO_REFERENCE = "not compared: the golden table has no value for it and there is no reference baseline"


def load_golden(path: str | Path) -> OpdGolden:
    """Load and validate a golden file (the format of the OPD suite spec's data file)."""
    return load_data(path, OpdGolden, "give a golden file in the format of the OPD suite spec's data file "
                                      "(the suites folder's data/, see the suite spec's 'data')")


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


class OpdLive(LiveCheck):
    """Live OPD checks: each eval point against the golden table as soon as its rows are in, with the
    final comparison's ``point_check``.

    Built from JSON (it travels to the triggerer): ``golden`` the golden table's content, the name it
    is known by, the spec's eval points and wall-time budget, and the reference baseline's step rows as
    JSONL (``core.live.compact_tracker``) when there is one.
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


# ----------------------------------------------------------------------------- the engine

#: The runbook's rule for the thresholds of a golden table: measured max run-to-run deviation x this.
MARGIN = 1.5
#: The approver's choices of thresholds for a calibrated golden table (``Proposal.choices``).
RUNBOOK_CHOICE = "runbook: max deviation x 1.5"
#: The proposal's golden table with the thresholds that hold a stated false-alarm rate.
FALSE_ALARM_FILE = "golden-false-alarm.json"
FALSE_ALARM_CHOICE = "5% false alarm per verification"


def max_dev_text(rule: Rule) -> str:
    """A measured deviation written like its threshold: a percentage for a relative one (12.1%, not 0.121)."""
    if rule.measured_max_dev is None:
        return "-"
    return f"{rule.measured_max_dev * 100:.3g}%" if rule.method == "relative" else fmt(rule.measured_max_dev)


def golden_criteria(spec: SuiteSpec, data: OpdGolden) -> list[str]:
    """The card's acceptance criteria: every threshold with its measured deviation, the golden table."""
    rows = ["| metric | method | threshold | measured max dev |", "|---|---|---|---|"]
    for name, rule in data.thresholds.items():
        suffix = " (reference only)" if rule.reference_only else ""
        rows.append(f"| `{name}` | {rule.method} | {threshold_text(rule)}{suffix} | {max_dev_text(rule)} |")
    golden_metrics = [m for m in data.thresholds if any(m in v for v in data.golden.values())]
    source = data.source.model_dump()
    rows += ["", "Golden values per eval point (" + ", ".join(
        f"{k}: {v}" for k, v in source.items() if k in ("kind", "measured", "commit", "runs")) + "):", "",
        # One row per metric, one column per eval point: the metric names are long and the points few, so
        # the table stays narrow enough for the approval card's pane (a column per metric was cut off).
        "| metric | " + " | ".join(f"step {step}" for step in data.eval_points) + " |",
        "|---" * (len(data.eval_points) + 1) + "|"]
    for m in golden_metrics:
        rows.append(f"| `{m}` | " + " | ".join(
            "-" if data.golden[step].get(m) is None else f"{data.golden[step][m]:.4f}"
            for step in data.eval_points) + " |")
    rows.append(f"\nSteps beyond {data.calibrated_max_step} are reported as not calibrated.")
    return rows


def missing_reference_hint(spec: SuiteSpec, path: str, node_name: str | None) -> str:
    """Why a suite has no reference baseline and how to provide one, in a DAG user's terms."""
    return (f"there is no reference baseline at {path} on node {node_name or '?'}: to compare them, put the tracker "
            f"of a {spec.expected_steps}-step run of the baseline config there (the suite spec's reference_baseline, "
            f"{spec.reference_baseline}; CI_SHARE_BASELINE comes from the node connection's extras, an Airflow "
            "Variable or the environment)")


def opd_golden_proposal(spec: SuiteSpec, trackers: Mapping[str, str | Path], current_data: Path,
                        commit: str | None = None) -> Any:
    """A golden table (``golden.json``, the data file's schema) of the means at every eval point and
    thresholds = max deviation x 1.5, with the current table side by side and the warnings."""
    # pandas, numpy: kept out of DAG parsing and of the triggerer.
    from rl_verify.core import calibration as calib

    current = load_golden(current_data)
    stats = calib.step_statistics(calib.run_table(trackers, list(current.thresholds), spec.expected_steps))
    proposal = calib.opd_proposal(stats, current, spec.eval_points, margin=MARGIN)
    source = {**current.source.model_dump(mode="json"), "runs": len(trackers), "measured": date.today().isoformat(),
              "commit": commit or current.source.commit,
              "note": f"calibration: mean of {len(trackers)} runs; thresholds = measured max run-to-run deviation x "
                      f"{proposal['margin']} margin"}
    # A metric without golden values is judged against the reference baseline tracker, not against the
    # N-run mean: the runs' spread around their own mean says nothing about that comparison, so its
    # threshold stays today's (a tighter one would FAIL the reference commit's own runs).
    kept = [m["metric"] for m in proposal["metrics"] if not any(p["metric"] == m["metric"] for p in proposal["points"])]
    for row in proposal["metrics"]:
        if row["metric"] in kept:
            rule = current.thresholds[row["metric"]]
            row.update(proposed_threshold=rule.threshold, change=0.0, widening=False)
            proposal["thresholds"][row["metric"]] = {k: v for k, v in rule.model_dump(mode="json").items()
                                                      if k != "metric" and v is not None
                                                      and not (k == "reference_only" and v is False)}
    proposal["warnings"] = [w for w in proposal["warnings"] if not any(m in w for m in kept)]
    golden = {**json.loads(Path(current_data).read_text(encoding="utf-8")), "source": source,
              "golden": {str(step): values for step, values in proposal["golden"].items()},
              "thresholds": proposal["thresholds"]}
    statistics = {"runs": proposal["runs"], "margin": proposal["margin"], "metrics": proposal["metrics"],
                  "rules": proposal["rules"]}
    markdown = calib.proposal_table_markdown(proposal, warnings=False)  # the warnings travel in Proposal.warnings
    if kept:
        markdown += (f"\nKept at today's threshold: {', '.join(kept)} (judged against the reference baseline "
                     "tracker, which these runs do not calibrate).\n")
    files = {OpdEngine.baseline_file: (json.dumps(golden, indent=2) + "\n").encode("utf-8")}
    choices: dict[str, dict[str, str]] = {RUNBOOK_CHOICE: {}}
    alternative = proposal["false_alarm"]
    if alternative["thresholds"] and alternative["alpha"] == 0.05:  # the label says 5%
        label = FALSE_ALARM_CHOICE
        held = {**golden, "source": {**source, "note": source["note"].split(";")[0] + f"; thresholds: {label} ("
                                     + alternative["rule"] + ")"},
                "thresholds": {m: {**t, "threshold": alternative["thresholds"].get(m, t["threshold"])}
                               for m, t in golden["thresholds"].items()}}
        files[FALSE_ALARM_FILE] = (json.dumps(held, indent=2) + "\n").encode("utf-8")
        choices[label] = {OpdEngine.baseline_file: FALSE_ALARM_FILE}
        statistics["false_alarm"] = alternative
    return calib.Proposal(files, json.loads(json.dumps(statistics, default=float)), markdown,
                          list(proposal["warnings"]), choices)


class OpdEngine(Engine):
    """Judged against a golden table at every eval point."""

    name = "opd"
    describe = "every eval point against a golden table"
    baseline_file = "golden.json"
    baseline_is_data = True
    rules = OPD_RULES

    def load_data(self, path: Path) -> OpdGolden:
        return load_golden(path)

    def contradictions(self, spec: SuiteSpec, golden: OpdGolden) -> list[str]:
        out = []
        if golden.eval_points != sorted(spec.eval_points):
            out.append(f"eval_points are {list(spec.eval_points)} but {spec.data} has golden values at steps "
                       f"{golden.eval_points}")
        if golden.source.total_train_steps != spec.expected_steps:
            out.append(f"expected_steps is {spec.expected_steps} but {spec.data} was measured at total_train_steps "
                       f"{golden.source.total_train_steps}")
        return out

    def judged_metrics(self, data: OpdGolden) -> list[str]:
        return list(data.thresholds)

    def reference_points(self, data: OpdGolden, metric: str) -> list[tuple[int, float]]:
        return [(s, data.golden[s][metric]) for s in data.eval_points if metric in data.golden[s]]

    def criteria(self, spec: SuiteSpec, data: OpdGolden) -> list[str]:
        return golden_criteria(spec, data)

    def data_lines(self, golden: OpdGolden) -> list[str]:
        """The golden values by eval step and the thresholds, as plain text (``rl-verify baselines show``)."""
        points = golden.eval_points
        rows = [[metric] + [f"{golden.value(p, metric):.4f}" if golden.value(p, metric) is not None else None
                            for p in points]
                for metric in golden.thresholds if any(golden.value(p, metric) is not None for p in points)]
        out = [f"golden values ({self.baseline_file}), by eval step:",
               text_table(["metric"] + [str(p) for p in points], rows), "", "thresholds:"]
        out.append(text_table(["metric", "method", "rule", "measured_max_dev", "note"],
                              [[r.metric, r.method, f"{r.operator} {r.threshold:g}", r.measured_max_dev,
                                "reference only" if r.reference_only else None] for r in golden.thresholds.values()]))
        return out

    def compare_archived(self, spec: SuiteSpec, suite_dir: Path, out: Path, meta: Mapping[str, Any],
                         node_name: str | None, version: Mapping[str, Path], plot: bool = True) -> SuiteResult:
        baseline = suite_dir / settings.BASELINE_TRACKER_FILE
        missing = meta.get("reference_baseline_missing")
        return compare_opd(current=suite_dir / "tracker.jsonl", out_dir=out,
                           golden=version.get(self.baseline_file, data_file(spec.data)),
                           baseline=baseline if baseline.exists() else None, suite=spec.name,
                           eval_points=list(spec.eval_points), plot=plot,
                           missing_reference=missing_reference_hint(spec, missing, node_name) if missing else None)

    def cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--current", required=True, help="current run's tracker.jsonl")
        parser.add_argument("--out", required=True, help="output folder for report.json/md/html and plots")
        parser.add_argument("--golden", default=None, help="golden file (default: the suite's data file)")
        parser.add_argument("--baseline", default=None,
                            help="baseline tracker for metrics the golden table lacks (response_len, time/step)")
        parser.add_argument("--commit", default=None, help="full SHA of the code under test")

    def cli_compare(self, args: argparse.Namespace, spec: SuiteSpec, out: Path) -> SuiteResult:
        return compare_opd(Path(args.current), out,
                           golden=Path(args.golden) if args.golden else data_file(spec.data),
                           baseline=Path(args.baseline) if args.baseline else None, suite=spec.name,
                           eval_points=list(spec.eval_points),
                           missing_reference="no --baseline tracker was given (pass --baseline BASE.jsonl, a "
                                             "tracker of a run of the baseline config, to compare them)")

    def live_baseline(self, spec: SuiteSpec) -> str | None:
        return spec.reference_baseline

    def live(self, spec: SuiteSpec, baseline: bytes | None, data: Any) -> OpdLive:
        if data is None:
            path = data_file(spec.data)
            golden, name = json.loads(path.read_text(encoding="utf-8")), str(path)
            self.load_data(path)  # refused here, in the worker, when it does not fit
        else:
            golden, name = data.model_dump(mode="json"), self.baseline_file
        reference = None
        if baseline is not None:
            reference = compact_tracker(tracker_from_text(baseline.decode("utf-8", errors="replace"), "baseline"))
        return OpdLive(golden, name, list(spec.eval_points), spec.wall_time_budget_s, reference)

    def check_version(self, spec: SuiteSpec, files: Mapping[str, bytes], baseline_ref: str | None,
                      where: Any, label: str, fix: str) -> OpdGolden:
        super().check_version(spec, files, baseline_ref, where, label, fix)
        name = self.baseline_file
        if name not in files:
            raise InputError(f"{label} has no {name} (suite {spec.name} is judged against a golden table)",
                             where(name), None, fix)
        return self.check_golden(spec, files[name], where(name), f"{label} {name}", fix)

    def check_golden(self, spec: SuiteSpec, data: bytes, where: str, what: str, fix: str) -> OpdGolden:
        """``data`` as the suite's golden table: OpdGolden's schema, the suite's name, the spec's eval points."""
        raw = parse_json(data, where, what, fix)
        try:
            golden = OpdGolden.model_validate(raw)
        except ValidationError as exc:
            raise InputError(f"{what} does not fit OpdGolden: {field_errors(exc)}", where, None, fix) from exc
        if golden.suite != spec.name:
            raise InputError(f"{what} is the golden table of suite {golden.suite!r}, not {spec.name!r}", where, None,
                             fix)
        contradictions = self.contradictions(spec, golden)
        if contradictions:
            raise InputError(f"{what} contradicts suite spec {spec.name}: {'; '.join(contradictions)}", where, None,
                             fix)
        return golden

    def run_points(self, spec: SuiteSpec, suite_dir: Path, result: SuiteResult,
                   version: Mapping[str, Path]) -> RunPoints:
        """Every judged (metric, eval point) the run reached, from its tracker (a run stopped early has the
        points up to its stop), against the golden table in use and the reference baseline."""
        base = super().run_points(spec, suite_dir, result, version)
        tracker = suite_dir / "tracker.jsonl"
        if not tracker.is_file():
            return base
        baseline = suite_dir / settings.BASELINE_TRACKER_FILE
        with tempfile.TemporaryDirectory(prefix="rl-verify-points-") as out:
            judged = compare_opd(tracker, Path(out), golden=version.get(self.baseline_file, data_file(spec.data)),
                                 baseline=baseline if baseline.is_file() else None, plot=False, suite=spec.name,
                                 eval_points=list(spec.eval_points))
        points = []
        for c in judged.checks:
            if c.passed is None or c.missing or c.step is None or c.baseline is None or c.current is None:
                continue  # reference only, not calibrated, not reached
            diff = c.current - c.baseline
            if c.method == "relative":
                diff = diff / abs(c.baseline) if c.baseline else math.inf
            points.append(ConfirmPoint(c.metric, c.step, diff, c.threshold or 0.0, c.breached))
        return RunPoints(result.verdict, result.failure_class, points, base.breached, base.not_repeatable)

    def judged_layout(self, spec: SuiteSpec, version: Mapping[str, Path]) -> Layout | None:
        """Every judged (metric, eval point) of the golden table in use: a complete run's points, whatever
        this run reached."""
        golden = load_golden(version.get(self.baseline_file, data_file(spec.data)))
        thresholds = {m: float(r.threshold) for m, r in golden.thresholds.items() if not r.reference_only}
        steps = {m: tuple(sorted(p for p in spec.eval_points if wanted_at(m, p, golden))) for m in thresholds}
        return Layout({m: t for m, t in thresholds.items() if steps[m]}, {m: s for m, s in steps.items() if s})

    def partial_checks(self, spec: SuiteSpec, suite_dir: Path, version: Mapping[str, Path]) -> list[Check]:
        """The comparison of what a run stopped early wrote: every eval point it reached, judged."""
        tracker = suite_dir / "tracker.jsonl"
        if not tracker.is_file():
            return []
        baseline = suite_dir / settings.BASELINE_TRACKER_FILE
        try:
            with tempfile.TemporaryDirectory(prefix="rl-verify-partial-") as out:
                judged = compare_opd(tracker, Path(out), golden=version.get(self.baseline_file, data_file(spec.data)),
                                     baseline=baseline if baseline.is_file() else None, plot=False, suite=spec.name,
                                     eval_points=list(spec.eval_points))
        except InputError:
            return []
        return judged.checks

    def spread(self, spec: SuiteSpec, version: Mapping[str, Any] | None) -> Spread | None:
        """From the version's statistics: the measured max deviation of each metric over its N runs (the
        shipped table's ``measured_max_dev``, a calibration's per-metric rows) -> sigma."""
        stats = (version or {}).get("statistics") or {}
        runs = (version or {}).get("runs")
        if not runs or runs < 2:
            return None
        golden = load_golden(data_file(spec.data))
        judged = {m: sum(1 for p in spec.eval_points if wanted_at(m, p, golden)) for m, r in golden.thresholds.items()
                  if not r.reference_only}
        measured: dict[str, tuple[float, int]] = {}
        for metric, dev in (stats.get("measured_max_dev") or {}).items():
            if metric in judged and dev:
                measured[metric] = (float(dev), judged[metric])
        for row in stats.get("metrics") or []:
            if row.get("metric") in judged and row.get("measured_max_dev"):
                measured[row["metric"]] = (float(row["measured_max_dev"]),
                                           int(row.get("measured_points") or judged[row["metric"]]))
        if not measured:
            return None
        sigma = {m: sigma_from_max_dev(dev, int(runs), points) for m, (dev, points) in measured.items()}
        df = {m: max_dev_df(int(runs), points) for m, (_, points) in measured.items()}
        kind = "calibration" if stats.get("metrics") else "shipped"
        return Spread(sigma, int(runs), f"{kind} baseline: measured max run-to-run deviation over N={runs} runs "
                                         "(sigma = max deviation / its expected value under normal noise)", df)

    def shipped(self, spec: SuiteSpec) -> tuple[Provenance, dict[str, bytes]]:
        raw = data_file(spec.data).read_bytes()
        golden = self.check_golden(spec, raw, str(data_file(spec.data)), f"shipped golden table {spec.data}",
                                   "fix the packaged data file")
        src = golden.source
        extra = src.model_extra or {}
        rule = f"measured max run-to-run deviation x {MARGIN:g} margin, N={src.runs}, {src.total_train_steps} steps"
        quote = (f"{src.runs}-run mean measured {src.measured} on the config above at "
                 f"`TOTAL_TRAIN_STEPS={src.total_train_steps}` (commit `{src.commit}`, {extra.get('stack')})")
        stats = {"kind": extra.get("kind"), "total_train_steps": src.total_train_steps, "stack": extra.get("stack"),
                 "config": extra.get("config"), "document": src.document, "data_file": spec.data,
                 "threshold_rule": rule,
                 "measured_max_dev": {m: r.measured_max_dev for m, r in golden.thresholds.items()}}
        return Provenance(
            source="shipped", commit=src.commit, runs=src.runs, dates=(src.measured,), statistics=stats,
            baseline_ref=spec.reference_baseline,
            note=f"Imported from the package ({spec.data}); {src.document}: \"{quote}\""
        ), {self.baseline_file: raw}

    def threshold_choices(self) -> list[str]:
        return [RUNBOOK_CHOICE, FALSE_ALARM_CHOICE]

    def propose(self, spec: SuiteSpec, trackers: Mapping[str, Path], current_data: Path,
                commit: str | None) -> Any:
        return opd_golden_proposal(spec, trackers, current_data, commit)


ENGINE = OpdEngine()
