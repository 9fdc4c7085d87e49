"""The comparison engines, by the name a suite spec gives in its ``engine`` field.

This registry is the only place that maps a suite to code: the DAG's tasks, the card, the CLI and
the compare task all ask it, so a new suite that reuses an engine is one spec file plus its data
file. Engines are imported lazily (numpy, matplotlib and the checker subprocess are not needed to
parse the DAG).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_verify.nextsteps import GRPO_RULES, OPD_RULES

if TYPE_CHECKING:
    from pydantic import BaseModel

    from rl_verify.model import SuiteResult
    from rl_verify.suite import SuiteSpec


@dataclass(frozen=True)
class Engine:
    """What a suite's engine provides to the rest of the package."""

    name: str
    describe: str
    #: The suite's data file, validated (raises InputError naming the file and every bad field).
    load_data: Callable[[Path], "BaseModel"]
    #: Every fact the spec and its (loaded) data file state differently.
    contradictions: Callable[["SuiteSpec", Any], list[str]]
    #: Card lines (Markdown) of the acceptance criteria, from the spec and its loaded data file.
    criteria: Callable[["SuiteSpec", Any], list[str]]
    #: The verdict of a suite from the files its fetch task archived in ``suite_dir``, judged against
    #: the baseline version in use (its files, name -> local path; {}: what ships).
    compare_archived: Callable[["SuiteSpec", Path, Path, Mapping[str, Any], str | None, Mapping[str, Path]],
                               "SuiteResult"]
    #: Adds this engine's command-line options to a ``compare <suite>`` parser.
    cli_args: Callable[[argparse.ArgumentParser], None]
    #: The verdict from command-line arguments.
    cli_compare: Callable[[argparse.Namespace, "SuiteSpec", Path], "SuiteResult"]
    #: The live check of a training (``rl_verify.live``) from the spec, its baseline tracker and the
    #: baseline version's data model (None: the spec's data file), or None when nothing can be judged
    #: live (e.g. a GRPO run without its baseline).
    live: Callable[["SuiteSpec", Any, Any], Any]
    #: The remote path of the tracker the live check compares against (a spec field), if any.
    live_baseline: Callable[["SuiteSpec"], str | None]
    #: The engine-specific rules of runbook section 3 (``nextsteps.EngineRules``).
    rules: Any = None
    #: The file of a stored baseline version that holds what this engine judges against
    #: (``rl_verify.baselines``: the golden table or the baseline tracker).
    baseline_file: str = ""
    #: Version 1 of a suite's baseline: what ships today, as (``baselines.Provenance``, data files).
    shipped: Callable[["SuiteSpec"], tuple[Any, dict[str, bytes]]] | None = None
    #: True: ``baseline_file`` is in the schema of the spec's data file and replaces it (a golden
    #: table); False: it replaces the spec's baseline tracker on the node's share.
    baseline_is_data: bool = False
    #: A proposed baseline from N runs' trackers (run -> path) and the data file in use
    #: (``calibration.Proposal``; the commit the runs trained, when known).
    propose: Callable[["SuiteSpec", Mapping[str, Path], Path, str | None], Any] | None = None


# ----------------------------------------------------------------------------- grpo

def _grpo_data(path: Path) -> "BaseModel":
    from rl_verify.grpo import load_thresholds

    return load_thresholds(path)


def _grpo_contradictions(spec: "SuiteSpec", data: Any) -> list[str]:
    return []  # the thresholds file states no step count, eval point or budget


def _grpo_criteria(spec: "SuiteSpec", data: Any) -> list[str]:
    from rl_verify.card import grpo_criteria

    return grpo_criteria(spec, data)


def _grpo_archived(spec: "SuiteSpec", suite_dir: Path, out: Path, meta: Mapping[str, Any],
                   node_name: str | None, version: Mapping[str, Path]) -> "SuiteResult":
    from rl_verify import settings
    from rl_verify.grpo import compare_grpo
    from rl_verify.suite import data_file

    return compare_grpo(baseline=version.get("baseline.jsonl", suite_dir / "baseline.jsonl"),
                        current=suite_dir / "tracker.jsonl",
                        checker_dir=suite_dir / "checker" / "autotest", out_dir=out,
                        wall_time_s=meta.get("wall_time_s"), timeout_s=settings.CHECKER_TIMEOUT_S,
                        thresholds=data_file(spec.data), suite=spec.name, expected_steps=spec.expected_steps,
                        wall_time_budget_s=spec.wall_time_budget_s)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _grpo_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", required=True, help="baseline tracker.jsonl")
    parser.add_argument("--current", required=True, help="current run's tracker.jsonl")
    parser.add_argument("--checker-dir", required=True,
                        help="the checkout's autotest folder (holds utils/check_metric.py)")
    parser.add_argument("--out", required=True, help="output folder for report.json/md/html and plots")
    parser.add_argument("--commit", default=None, help="full SHA of the code under test")
    parser.add_argument("--wall-time-s", type=float, default=None, help="e2e wall time of the run in seconds")
    parser.add_argument("--timeout-s", type=_positive_float, default=600.0, help="checker timeout (default 600)")


def _grpo_cli_compare(args: argparse.Namespace, spec: "SuiteSpec", out: Path) -> "SuiteResult":
    from rl_verify.grpo import compare_grpo
    from rl_verify.suite import data_file

    return compare_grpo(Path(args.baseline), Path(args.current), Path(args.checker_dir), out,
                        wall_time_s=args.wall_time_s, timeout_s=args.timeout_s, thresholds=data_file(spec.data),
                        suite=spec.name, expected_steps=spec.expected_steps,
                        wall_time_budget_s=spec.wall_time_budget_s)


def _grpo_live(spec: "SuiteSpec", baseline: Any, data: Any = None) -> Any:
    from rl_verify.grpo import load_thresholds
    from rl_verify.live import GrpoLive
    from rl_verify.suite import data_file

    if baseline is None:
        return None  # the checker compares against the baseline tracker: nothing to judge without it
    return GrpoLive(load_thresholds(data_file(spec.data)), baseline, spec.expected_steps, spec.wall_time_budget_s)


def _grpo_propose(spec: "SuiteSpec", trackers: Mapping[str, Path], data: Path, commit: str | None) -> Any:
    from rl_verify.calibration import grpo_proposal

    return grpo_proposal(spec, trackers, data)


def _opd_propose(spec: "SuiteSpec", trackers: Mapping[str, Path], data: Path, commit: str | None) -> Any:
    from rl_verify.calibration import opd_golden_proposal

    return opd_golden_proposal(spec, trackers, data, commit)


def _grpo_shipped(spec: "SuiteSpec") -> tuple[Any, dict[str, bytes]]:
    from rl_verify import baselines
    from rl_verify.errors import InputError
    from rl_verify.grpo import load_thresholds
    from rl_verify.suite import data_file

    if not spec.baseline:
        raise InputError(f"suite {spec.name} names no baseline tracker", None, None,
                         "set the spec's baseline (the share path of the baseline tracker)")
    source = load_thresholds(data_file(spec.data)).source
    runs = baselines.RUNBOOK_GRPO_RUNS
    return baselines.Provenance(
        source="shipped", runs=runs, baseline_ref=spec.baseline,
        statistics={"kind": f"average of {runs} historical runs", "recorded": source.get("baseline"),
                    "document": source.get("document")},
        note=(f"The baseline tracker on the GPU node's share ({spec.baseline}), referenced, not copied; "
              f"{source.get('document')}: \"{baselines.RUNBOOK_GRPO_QUOTE}\"")), {}


# ----------------------------------------------------------------------------- opd

def _opd_data(path: Path) -> "BaseModel":
    from rl_verify.opd import load_golden

    return load_golden(path)


def _opd_contradictions(spec: "SuiteSpec", golden: Any) -> list[str]:
    out = []
    if golden.eval_points != sorted(spec.eval_points):
        out.append(f"eval_points are {list(spec.eval_points)} but {spec.data} has golden values at steps "
                   f"{golden.eval_points}")
    if golden.source.total_train_steps != spec.expected_steps:
        out.append(f"expected_steps is {spec.expected_steps} but {spec.data} was measured at total_train_steps "
                   f"{golden.source.total_train_steps}")
    return out


def _opd_criteria(spec: "SuiteSpec", data: Any) -> list[str]:
    from rl_verify.card import golden_criteria

    return golden_criteria(spec, data)


def missing_reference_hint(spec: SuiteSpec, path: str, node_name: str | None) -> str:
    """Why a suite has no reference baseline and how to provide one, in a DAG user's terms."""
    return (f"there is no reference baseline at {path} on node {node_name or '?'}: to compare them, put the tracker "
            f"of a {spec.expected_steps}-step run of the baseline config there (the suite spec's reference_baseline, "
            f"{spec.reference_baseline}; CI_SHARE_BASELINE comes from the node connection's extras, an Airflow "
            "Variable or the environment)")


def _opd_archived(spec: "SuiteSpec", suite_dir: Path, out: Path, meta: Mapping[str, Any],
                  node_name: str | None, version: Mapping[str, Path]) -> "SuiteResult":
    from rl_verify.opd import compare_opd
    from rl_verify.suite import data_file

    baseline = suite_dir / "baseline.jsonl"
    missing = meta.get("reference_baseline_missing")
    return compare_opd(current=suite_dir / "tracker.jsonl", out_dir=out,
                       golden=version.get("golden.json", data_file(spec.data)),
                       baseline=baseline if baseline.exists() else None, suite=spec.name,
                       eval_points=list(spec.eval_points),
                       missing_reference=missing_reference_hint(spec, missing, node_name) if missing else None)


def _opd_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--current", required=True, help="current run's tracker.jsonl")
    parser.add_argument("--out", required=True, help="output folder for report.json/md/html and plots")
    parser.add_argument("--golden", default=None, help="golden file (default: the suite's data file)")
    parser.add_argument("--baseline", default=None,
                        help="baseline tracker for metrics the golden table lacks (response_len, time/step)")
    parser.add_argument("--commit", default=None, help="full SHA of the code under test")


def _opd_cli_compare(args: argparse.Namespace, spec: "SuiteSpec", out: Path) -> "SuiteResult":
    from rl_verify.opd import compare_opd
    from rl_verify.suite import data_file

    return compare_opd(Path(args.current), out, golden=Path(args.golden) if args.golden else data_file(spec.data),
                       baseline=Path(args.baseline) if args.baseline else None, suite=spec.name,
                       eval_points=list(spec.eval_points),
                       missing_reference="no --baseline tracker was given (pass --baseline BASE.jsonl, a "
                                         "tracker of a run of the baseline config, to compare them)")


def _opd_live(spec: "SuiteSpec", baseline: Any, data: Any = None) -> Any:
    from rl_verify.live import OpdLive
    from rl_verify.opd import load_golden
    from rl_verify.suite import data_file

    path = data_file(spec.data)
    golden = load_golden(path) if data is None else data
    return OpdLive(golden, path if data is None else Path("golden.json"), list(spec.eval_points),
                   spec.wall_time_budget_s, baseline)


def _opd_shipped(spec: "SuiteSpec") -> tuple[Any, dict[str, bytes]]:
    from rl_verify import baselines
    from rl_verify.suite import data_file

    raw = data_file(spec.data).read_bytes()
    golden = baselines.check_golden(spec, raw, str(data_file(spec.data)), f"shipped golden table {spec.data}",
                                    "fix the packaged data file")
    src = golden.source
    extra = src.model_extra or {}
    stats = {"kind": extra.get("kind"), "total_train_steps": src.total_train_steps, "stack": extra.get("stack"),
             "config": extra.get("config"), "document": src.document, "data_file": spec.data,
             "threshold_rule": baselines.RUNBOOK_OPD_THRESHOLD_RULE,
             "measured_max_dev": {m: r.measured_max_dev for m, r in golden.thresholds.items()}}
    return baselines.Provenance(
        source="shipped", commit=src.commit, runs=src.runs, dates=(src.measured,), statistics=stats,
        baseline_ref=spec.reference_baseline,
        note=f"Imported from the package ({spec.data}); {src.document}: \"{baselines.RUNBOOK_OPD_QUOTE}\""
    ), {baselines.GOLDEN_FILE: raw}


ENGINES: dict[str, Engine] = {
    "grpo": Engine("grpo", "the checkout's check_rl_result + final eval/accuracy + wall time", _grpo_data,
                   _grpo_contradictions, _grpo_criteria, _grpo_archived, _grpo_cli_args, _grpo_cli_compare,
                   _grpo_live, lambda spec: spec.baseline, GRPO_RULES,
                   baseline_file="baseline.jsonl", shipped=_grpo_shipped, baseline_is_data=False,
                   propose=_grpo_propose),
    "opd": Engine("opd", "every eval point against a golden table", _opd_data, _opd_contradictions,
                  _opd_criteria, _opd_archived, _opd_cli_args, _opd_cli_compare,
                  _opd_live, lambda spec: spec.reference_baseline, OPD_RULES,
                  baseline_file="golden.json", shipped=_opd_shipped, baseline_is_data=True, propose=_opd_propose),
}


def engine_of(spec: "SuiteSpec") -> Engine:
    """The engine a spec names (``load_suite`` has already refused an unknown one)."""
    return ENGINES[spec.engine]
