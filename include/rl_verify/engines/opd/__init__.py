"""The opd engine: runbook section 2, every eval point against a golden table.

Everything about judging a run against a golden table (``OpdEngine``, the package's ``ENGINE``): the
comparison (``compare``), the card's criteria, the live check (``live``), the calibration proposal (the
runbook's x1.5 rule, ``calibration``), its data file's model (``thresholds``), its rules of runbook
section 3 (``rules``), the validation of a stored golden table and the provenance of the table that
ships. The suites that use it name ``"engine": "opd"`` in their spec.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rl_verify import settings
from rl_verify.core.confirm import Point as ConfirmPoint
from rl_verify.core.confirm import Layout, RunPoints, Spread
from rl_verify.core.deviation import max_dev_df, sigma_from_max_dev
from rl_verify.core.errors import InputError
from rl_verify.core.livecheck import compact_tracker, tracker_from_text
from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.provenance import Provenance
from rl_verify.core.report import text_table
from rl_verify.core.thresholds import Rule, field_errors, parse_json
from rl_verify.engines.base import Engine
from rl_verify.engines.opd.compare import SUITE, compare_opd, missing_reference_hint, point_check, wanted_at
from rl_verify.engines.opd.live import OpdLive
from rl_verify.engines.opd.rules import OPD_RULES
from rl_verify.engines.opd.thresholds import (FALSE_ALARM_CHOICE, GOLDEN_FILE, MARGIN, RUNBOOK_CHOICE, OpdGolden,
                                              load_golden)
from rl_verify.suites.card import fmt, threshold_text
from rl_verify.suites.spec import SuiteSpec, data_file

__all__ = ["ENGINE", "MARGIN", "OPD_RULES", "SUITE", "OpdEngine", "OpdGolden", "OpdLive", "compare_opd",
           "golden_criteria", "load_golden", "point_check", "wanted_at"]


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


class OpdEngine(Engine):
    """Judged against a golden table at every eval point."""

    name = "opd"
    describe = "every eval point against a golden table"
    baseline_file = GOLDEN_FILE
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
        # pandas, numpy: kept out of DAG parsing and of the triggerer.
        from rl_verify.engines.opd.calibration import opd_golden_proposal

        return opd_golden_proposal(spec, trackers, current_data, commit)


ENGINE = OpdEngine()
