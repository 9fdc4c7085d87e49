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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_verify import settings
from rl_verify.core.errors import InputError
from rl_verify.core.livecheck import compact_tracker, tracker_from_text
from rl_verify.core.model import SuiteResult
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
        # pandas, numpy: kept out of DAG parsing and of the triggerer.
        from rl_verify.engines.grpo.calibration import grpo_proposal

        return grpo_proposal(spec, trackers, current_data)


ENGINE = GrpoEngine()
