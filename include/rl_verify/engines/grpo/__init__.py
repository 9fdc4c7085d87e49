"""The grpo engine: runbook section 1, everything about judging a run against a baseline tracker.

The comparison (``compare``, with the checkout's own checker run by ``checker``), the card's criteria, the
live check (``live``), the calibration proposal (``calibration``), its data file's model (``thresholds``),
its rules of runbook section 3 (``rules``), the validation of a stored baseline version and the provenance
of the baseline that ships (``GrpoEngine``, the package's ``ENGINE``). The suites that use it name
``"engine": "grpo"`` in their spec.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_verify import settings
from rl_verify.core.errors import InputError
from rl_verify.core.livecheck import compact_tracker, tracker_from_text
from rl_verify.core.confirm import Layout, RunPoints, Spread
from rl_verify.core.deviation import max_dev_df, max_dev_factor, percentile_dev_factor
from rl_verify.core.confirm import Point as ConfirmPoint
from rl_verify.core.deviation import sigma_from_max_dev
from rl_verify.core.model import TIMING_METRICS, SuiteResult
from rl_verify.core.tracker import MARKER, Tracker, read_tracker
from rl_verify.core.provenance import Provenance
from rl_verify.engines.base import TRACKER_FILE, Engine
from rl_verify.engines.grpo.checker import (CHECKER_RUN_ID, CheckerOutcome, checker_reasons, failed_metrics,
                                            run_checker, translate_checker_step)
from rl_verify.engines.grpo.compare import (STEP_ROUND, SUITE, WALL_TIME, compare_grpo, metric_check,
                                            percentile_fail_count, step_errors, stepwise_breach)
from rl_verify.engines.grpo.live import GrpoLive
from rl_verify.engines.grpo.rules import GRPO_RULES
from rl_verify.engines.grpo.thresholds import GrpoThresholds, load_thresholds
from rl_verify.suites.card import fmt, threshold_text
from rl_verify.suites.spec import SuiteSpec, data_file

__all__ = ["CHECKER_RUN_ID", "ENGINE", "GRPO_RULES", "STEP_ROUND", "SUITE", "WALL_TIME", "CheckerOutcome",
           "GrpoEngine", "GrpoLive", "GrpoThresholds", "checker_reasons", "compare_grpo", "failed_metrics",
           "grpo_criteria", "load_thresholds", "metric_check", "percentile_fail_count", "run_checker",
           "step_errors", "stepwise_breach", "translate_checker_step"]


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


def confirm_points(data: GrpoThresholds, base: Tracker, cur: Tracker, breached: set[str]) -> list[ConfirmPoint]:
    """The confirmation rule's points of one run (``GrpoEngine.run_points``): per checked metric but time, the
    signed difference at each step the run reached (paired by position), and the final eval's."""
    points = []
    for rule in data.rules:
        if rule.metric in TIMING_METRICS:
            continue
        q = data.percentile_metrics.get(rule.metric)
        for b, c in zip(base.series(rule.metric), cur.series(rule.metric)):
            diff = c.value - b.value
            if rule.method == "relative":
                diff = diff / abs(b.value) if b.value else math.inf
            error = rule.error(b.value, c.value)
            over = not rule.holds(error) if q is not None else stepwise_breach(rule, error)
            points.append(ConfirmPoint(rule.metric, c.step, diff, float(rule.threshold),
                                       rule.metric in breached and over))
    final = data.final_eval
    bp, cp = base.last.get(final.metric), cur.last.get(final.metric)
    if bp is not None and cp is not None:
        points.append(ConfirmPoint(final.metric, cp.step, cp.value - bp.value, float(final.threshold),
                                   final.metric in breached and not final.holds(final.error(bp.value, cp.value))))
    return points


def grpo_prior(spec: SuiteSpec, data: GrpoThresholds, runs: int, measured: Mapping[str, Any]) -> Spread:
    """The prior spread of ``GrpoEngine.spread`` (its docstring): sigma and degrees of freedom per metric."""
    steps = spec.expected_steps
    sigma: dict[str, float] = {}
    df: dict[str, float] = {}
    for rule in [r for r in data.rules if r.metric not in TIMING_METRICS] + [data.final_eval]:
        dev = (measured.get(rule.metric) or {}).get("max_dev")
        if dev and rule.method == "absolute" and rule.metric != data.final_eval.metric:  # every step, N runs
            sigma[rule.metric] = sigma_from_max_dev(float(dev), runs, steps)
            df[rule.metric] = max_dev_df(runs, steps)
            continue
        q = data.percentile_metrics.get(rule.metric)
        if rule.metric == data.final_eval.metric:
            factor = max_dev_factor(runs, 1)
        elif q is not None:
            factor = percentile_dev_factor(runs, steps, float(q))[0]
        else:
            factor = max_dev_factor(runs, steps)
        sigma[rule.metric] = float(rule.threshold) / (1.5 * factor)
        # Nobody measured it: a spread is worth at most what the baseline's own N runs at one point give, N - 1
        # degrees of freedom (not the many a measured max deviation over the steps would be).
        df[rule.metric] = float(runs - 1)
    source = (f"calibration baseline: measured max run-to-run deviation over N={runs} runs where recorded; the "
              "thresholds elsewhere" if measured else f"shipped baseline (mean of {runs} runs, no spread recorded)")
    return Spread(sigma, runs, source + ": each threshold read as 1.5 x the expected max deviation "
                  "of the baseline's runs in the statistic the check compares (the runbook's rule for thresholds, "
                  f"read backwards), on N - 1 = {runs - 1} degrees of freedom; the mismatch bound itself stays the "
                  "runbook's absolute one", df,
                  points_per_metric=steps)


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
                            wall_time_budget_s=spec.wall_time_budget_s, plot=plot,
                            timing_judged=not meta.get("recorded_evidence"))

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

    # --- confirming a FAIL (core.confirm; issue 43) -------------------------------------------------
    def run_points(self, spec: SuiteSpec, suite_dir: Path, result: SuiteResult,
                   version: Mapping[str, Path]) -> RunPoints:
        """Every judged (metric, step) the run reached against the baseline tracker, paired by position as the
        checker pairs them: the signed difference (relative for a relative method) at each training step of
        each checked metric but time, and of the final ``eval/accuracy``. A point is breached when the run's
        verdict on its metric is a breach and the step's own error breaks the bound (the p80 metrics: one of
        the steps that made the percentile breach; the mismatch bound: the runbook's absolute bound at that
        step)."""
        base = super().run_points(spec, suite_dir, result, version)
        tracker = suite_dir / "tracker.jsonl"
        baseline = version.get(TRACKER_FILE, suite_dir / settings.BASELINE_TRACKER_FILE)
        if not tracker.is_file() or not Path(baseline).is_file():
            return base
        data = load_thresholds(data_file(spec.data))
        points = confirm_points(data, read_tracker(baseline), read_tracker(tracker),
                                {c.metric for c in result.checks if c.breached})
        return RunPoints(result.verdict, result.failure_class, points, base.breached, base.not_repeatable,
                         complete=len(read_tracker(tracker).series(MARKER)) >= spec.expected_steps)

    def judged_layout(self, spec: SuiteSpec, version: Mapping[str, Path]) -> Layout | None:
        """A complete run's judged points: every training step of each checked metric but time (the p80 metrics
        judged by their percentile), and the final ``eval/accuracy``."""
        data = load_thresholds(data_file(spec.data))
        steps = tuple(range(1, spec.expected_steps + 1))
        thresholds = {r.metric: float(r.threshold) for r in data.rules if r.metric not in TIMING_METRICS}
        layout_steps = {m: steps for m in thresholds}
        thresholds[data.final_eval.metric] = float(data.final_eval.threshold)
        layout_steps[data.final_eval.metric] = (spec.expected_steps,)
        return Layout(thresholds, layout_steps, {m: float(q) for m, q in data.percentile_metrics.items()
                                                 if m in thresholds})

    def spread(self, spec: SuiteSpec, version: Mapping[str, Any] | None) -> Spread | None:
        """The prior spread of every judged metric's per-step difference. The runbook records none for GRPO
        (its thresholds come from the GRPO e2e spec; the baseline is the mean of 5 runs): its thresholds are read
        as the runbook's own rule for thresholds, 1.5 x the expected max deviation of the baseline's N runs in
        the statistic the check compares (p80 over the steps, every step, the final point), on the degrees of
        freedom such a reading is worth; a calibrated version's measured max deviations instead where it
        records them for an absolute metric. The repeats and the node's healthy nights move it
        (``core.spread``)."""
        runs = int((version or {}).get("runs") or load_thresholds(data_file(spec.data)).source.runs or 0)
        if runs < 2:
            return None
        return grpo_prior(spec, load_thresholds(data_file(spec.data)), runs,
                          ((version or {}).get("statistics") or {}).get("max_dev") or {})

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
        # pandas, numpy: kept out of DAG parsing and of the triggerer.
        from rl_verify.engines.grpo.calibration import grpo_proposal

        return grpo_proposal(spec, trackers, current_data)


ENGINE = GrpoEngine()
