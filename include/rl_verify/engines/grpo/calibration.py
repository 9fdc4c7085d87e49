"""The grpo engine's calibration: N runs' trackers -> a baseline tracker of their per-step means.

:func:`grpo_baseline_rows` / :func:`write_grpo_baseline` make a tracker in XTuner's tracker format (one JSON
object per line, integer ``step``, float scalars; a step-summary row per step carrying the marker; the step-0
eval values on an eval-only row) from the per-step means (``core.calibration.step_statistics``), so
``read_tracker`` and the checkout's ``check_rl_result`` read it like a run's tracker. The source runs are NOT
written into the tracker: the contract says every line carries an integer step and float scalars, and the
real checker ``json.loads`` every line, so a provenance row is not guaranteed to be tolerated. They go to a
sidecar JSON next to it (:func:`grpo_baseline_provenance`). :func:`grpo_proposal` is the engine's
``propose``. pandas: imported by the engine only when it proposes (kept out of DAG parsing and the triggerer).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from rl_verify.core.calibration import Problems, Proposal, cell, fmt_value, run_table, step_statistics
from rl_verify.core.tracker import EVAL_PREFIX, MARKER
from rl_verify.engines.base import TRACKER_FILE
from rl_verify.engines.grpo.thresholds import load_thresholds
from rl_verify.suites.spec import SuiteSpec


def grpo_proposal(spec: SuiteSpec, trackers: Mapping[str, str | Path], current_data: Path) -> Proposal:
    """GRPO: the baseline tracker of per-step means over every metric the checker and the final eval
    judge (``baseline.jsonl``), with the largest run-to-run deviation of each metric."""
    thresholds = load_thresholds(current_data)
    metrics = [MARKER] + [r.metric for r in thresholds.rules] + [thresholds.final_eval.metric]
    stats = step_statistics(run_table(trackers, metrics, spec.expected_steps))
    rows = grpo_baseline_rows(stats, list(trackers))
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
        lines.append(f"| {cell(row.metric)} | {steps} | {fmt_value(mean)} | {row.max_dev:.4g} (step "
                     f"{row.step}, run {cell(str(row.worst_run))}) |")
    markdown = (f"Proposed baseline tracker: per-step mean of {len(trackers)} runs, {len(rows)} lines "
                "(XTuner's tracker format; the checkout's check_rl_result reads it).\n\n" + "\n".join(lines) + "\n")
    return Proposal({TRACKER_FILE: text.encode("utf-8")}, {"runs": len(trackers), "max_dev": summary},
                    markdown, [])


def grpo_baseline_rows(stats: pd.DataFrame,
                       source_runs: Mapping[str, str | Path] | Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The baseline tracker's rows (XTuner's format): one step-summary row per step holding the marker
    ``response/rewards/mean`` and every metric's mean at that step (eval means of that step merged in,
    as XTuner merges them), and an eval-only row for eval means at a step without training (step 0).

    ``read_tracker`` reads the rows back with the same steps and values (floats are written exactly).
    When ``source_runs`` is given, every statistic must come from exactly that many runs. Raises
    ``InputError`` when the marker metric is missing or a training metric has a step without it.
    """
    problems = Problems()
    if stats.empty or not (stats["metric"] == MARKER).any():
        problems.add("no step marker", f"include {MARKER} in the calibrated metrics",
                     f"the statistics have no {MARKER}, the key that makes a row a step-summary row")
    if source_runs is not None:
        wrong = stats[stats["n"] != len(source_runs)]
        for row in wrong.itertuples(index=False):
            problems.add("statistics not from the source runs", "pass the statistics of exactly these runs",
                         f"{row.metric} at step {row.step} is the mean of {row.n} run(s), not of the "
                         f"{len(source_runs)} source runs")
    marker_steps = set(stats.loc[stats["metric"] == MARKER, "step"])
    rows: list[dict[str, Any]] = []
    for step, group in stats.groupby("step", sort=True):
        values = {str(m): float(v) for m, v in sorted(zip(group["metric"], group["mean"]))}
        if step in marker_steps or all(m.startswith(EVAL_PREFIX) for m in values):
            rows.append({"step": int(step), **values})
            continue
        orphans = [m for m in values if not m.startswith(EVAL_PREFIX)]
        problems.add("training metric without a step-summary row", f"include {MARKER} at every training step",
                     f"step {step}: {', '.join(orphans)} but no {MARKER}")
    problems.raise_if_any("cannot write a GRPO baseline tracker")
    return rows


def grpo_baseline_provenance(stats: pd.DataFrame,
                             source_runs: Mapping[str, str | Path] | Sequence[str]) -> dict[str, Any]:
    """The sidecar record of a GRPO baseline tracker: what it is, the source runs (run -> tracker path
    when a mapping is given), N, the step count, the metrics and the per-step statistics."""
    runs = ({str(r): str(p) for r, p in source_runs.items()} if isinstance(source_runs, Mapping)
            else {str(r): None for r in source_runs})
    return {
        "kind": f"GRPO baseline tracker: per-step mean of {len(runs)} runs (rl_verify.core.calibration)",
        "runs": len(runs),
        "source_runs": runs,
        "steps": int(stats.loc[stats["metric"] == MARKER, "step"].nunique()),
        "metrics": sorted(stats["metric"].unique()),
        "statistics": _records(stats),
    }


def _records(stats: pd.DataFrame) -> list[dict[str, Any]]:
    """Statistics as JSON-ready dicts (inf written as the string "Infinity")."""
    out = []
    for row in stats.to_dict("records"):
        out.append({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
        for key in ("max_rel_dev",):
            if isinstance(out[-1][key], float) and math.isinf(out[-1][key]):
                out[-1][key] = "Infinity"
    return out


class BaselineFiles(NamedTuple):
    tracker: Path
    provenance: Path


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_grpo_baseline(stats: pd.DataFrame, path: str | Path,
                        source_runs: Mapping[str, str | Path] | Sequence[str]) -> BaselineFiles:
    """Write the baseline tracker to ``path`` (one JSON object per line, newline-terminated) and its
    provenance to ``<path without suffix>.provenance.json`` (with the tracker's sha256), both atomically.
    Raises ``InputError`` as :func:`grpo_baseline_rows` does; nothing is written then."""
    path = Path(path)
    rows = grpo_baseline_rows(stats, source_runs)
    text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
    record = grpo_baseline_provenance(stats, source_runs)
    record["tracker"] = {"file": path.name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                         "lines": len(rows)}
    provenance = path.with_suffix(".provenance.json")
    _write_atomic(path, text)
    _write_atomic(provenance, json.dumps(record, indent=2) + "\n")
    return BaselineFiles(path, provenance)
