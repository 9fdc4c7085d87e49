"""Baseline calibration statistics (issue 9): N runs of one reference commit -> what every engine's
proposal is computed from, and the proposal itself as a new baseline version (:class:`Proposal`).

Pure engine layer (pandas, no Airflow import). What each part promises:

* :func:`run_table` reads N trackers with the project's reader (:func:`rl_verify.core.tracker.read_tracker`)
  and returns one long table ``(run, step, metric, value)``. Training metrics come from RL
  step-summary rows only (the marker ``response/rewards/mean``; mini-batch rows never count; a step
  written twice keeps its last row, as everywhere else in the package); ``eval/...`` metrics come
  from whichever row carries them at that step, so step 0 is the eval-only row written before
  training (the OPD golden table needs it).
* Bad input raises one :class:`~rl_verify.core.errors.InputError` listing every problem found (each
  kind of problem names the runs, metrics and steps concerned, up to :data:`MAX_LISTED` items of
  that kind, then a count), with the fix for each kind: fewer than 2 runs (N < 2), a tracker that
  cannot be read, runs with different step counts (or not the suite's expected count), a metric
  present at a step in some runs and missing in others, a metric in no run, a NaN/Infinity value.
* :func:`step_statistics`: per (metric, step) ``n``, ``mean``, ``std`` (sample, ddof=1), ``min``,
  ``max``, ``max_dev`` = max |value - mean| over the runs, ``max_rel_dev`` = ``max_dev / |mean|``
  (the deviation of relative rules) and ``worst_run`` (the run that deviates most).

Each engine turns the statistics into its own proposal (``Engine.propose``: the grpo engine's baseline
tracker of per-step means, the opd engine's golden table), in ``rl_verify.engines.<name>.calibration``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from rl_verify.core.errors import InputError
from rl_verify.core.tracker import EVAL_PREFIX, Tracker, read_tracker

COLUMNS = ["run", "step", "metric", "value"]
STAT_COLUMNS = ["metric", "step", "n", "mean", "std", "min", "max", "max_dev", "max_rel_dev", "worst_run"]
#: Items listed per kind of problem in one InputError; the rest are counted.
MAX_LISTED = 10
MIN_RUNS = 2

FIX_RUNS = ("calibrate from at least 2 runs of the same commit and config (runbook defaults: 5 runs for GRPO, "
            "3 for OPD)")
FIX_STEPS = ("every run must train the same number of steps; re-run or leave out the run that stopped early "
             "(the checker refuses trackers with different step counts)")
FIX_MISSING = ("re-run or leave out the run that lacks the metric; every run must log the same metrics at the "
               "same steps")
FIX_NONFINITE = "a diverged run cannot be part of a baseline; leave it out and re-run"
FIX_ABSENT = "ask only for metrics the trackers log (check the metric names against the tracker)"


class Problems:
    """Problems of one kind each, listed (capped) and rendered into one InputError."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[str, list[str]]] = {}  # kind -> (fix, items)

    def add(self, kind: str, fix: str, item: str) -> None:
        self.kinds.setdefault(kind, (fix, []))[1].append(item)

    def raise_if_any(self, what: str) -> None:
        if not self.kinds:
            return
        parts, fixes = [], []
        for kind, (fix, items) in self.kinds.items():
            shown = "; ".join(items[:MAX_LISTED])
            more = f"; and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
            parts.append(f"{kind}: {shown}{more}")
            if fix not in fixes:
                fixes.append(fix)
        raise InputError(f"{what}: " + " | ".join(parts), None, None, "; ".join(fixes))


def tracker_values(tracker: Tracker, metrics: Sequence[str]) -> list[tuple[int, str, float]]:
    """(step, metric, value): training metrics from step-summary rows (last row of a step wins),
    eval metrics from the row carrying them at each step."""
    out: list[tuple[int, str, float]] = []
    training = [m for m in metrics if not m.startswith(EVAL_PREFIX)]
    evals = [m for m in metrics if m.startswith(EVAL_PREFIX)]
    for step in sorted({row.step for row in tracker.rows}):
        row = tracker.summary_at(step)
        out += [(step, m, row.values[m]) for m in training if row is not None and m in row.values]
    for step in sorted(tracker.evals):
        out += [(step, m, tracker.evals[step][m].value) for m in evals if m in tracker.evals[step]]
    return out


def run_table(trackers: Mapping[str, str | Path], metrics: Iterable[str],
              expected_steps: int | None = None) -> pd.DataFrame:
    """Long table ``run, step, metric, value`` of ``metrics`` from N trackers (run id -> tracker path).

    Every tracker is read with ``read_tracker``; problems (see the module docstring, plus each run's
    step count against ``expected_steps`` when given) are collected over all runs and raised once as
    ``InputError``. ``table.attrs`` holds ``trackers`` (run -> path), ``step_counts`` (run -> number
    of step-summary rows, what the checker counts) and ``abnormal`` (the reader's non-fatal notes).
    """
    metrics = list(dict.fromkeys(metrics))
    problems = Problems()
    if len(trackers) < MIN_RUNS:
        problems.add("too few runs", FIX_RUNS,
                     f"N = {len(trackers)} run(s) given ({', '.join(trackers) or 'none'}), N < {MIN_RUNS}: a mean "
                     "and a run-to-run deviation need at least 2 runs")
    records: list[tuple[str, int, str, float]] = []
    counts: dict[str, int] = {}
    abnormal: list[str] = []
    for run, path in trackers.items():
        try:
            tracker = read_tracker(path, metrics)
        except InputError as err:
            problems.add("unreadable tracker", err.fix or "re-copy the tracker", f"run {run}: {err.problem} "
                         f"({err.path}{'' if err.line is None else f':{err.line}'})")
            continue
        counts[run] = tracker.steps
        abnormal += tracker.abnormal
        records += [(run, step, metric, value) for step, metric, value in tracker_values(tracker, metrics)]
    table = pd.DataFrame.from_records(records, columns=COLUMNS)
    table = table.astype({"run": str, "step": int, "metric": str, "value": float})
    _check_step_counts(counts, {r: str(p) for r, p in trackers.items()}, expected_steps, problems)
    _check_table(table, [r for r in trackers if r in counts], metrics if counts else None, problems)
    problems.raise_if_any(f"cannot calibrate from {len(trackers)} run(s)")
    table.attrs.update(trackers={r: str(p) for r, p in trackers.items()}, step_counts=counts, abnormal=abnormal)
    return table


def _check_step_counts(counts: Mapping[str, int], paths: Mapping[str, str], expected: int | None,
                       problems: Problems) -> None:
    """Runs must hold the same number of step-summary rows (and ``expected`` when given)."""
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"run {r} has {n} steps ({paths.get(r, '?')})" for r, n in counts.items())
        problems.add("runs have different step counts", FIX_STEPS, listed)
    if expected is not None:
        for run, n in counts.items():
            if n != expected:
                problems.add(f"runs not at the suite's expected {expected} steps", FIX_STEPS,
                             f"run {run} has {n} steps ({paths.get(run, '?')})")


def _check_table(table: pd.DataFrame, runs: Sequence[str], metrics: Sequence[str] | None,
                 problems: Problems) -> None:
    """N >= 2 (counted in the table when no tracker list was checked), every (metric, step) in every
    run, finite values, every asked metric somewhere."""
    for metric in metrics or []:
        if not (table["metric"] == metric).any():
            problems.add("metric in no run", FIX_ABSENT, f"{metric} is in no run's tracker")
    present = table.groupby(["metric", "step"])["run"].agg(lambda s: set(s))
    missing: dict[tuple[str, str], list[int]] = {}
    for (metric, step), have in present.items():
        for run in runs:
            if run not in have:
                missing.setdefault((run, metric), []).append(int(step))
    for (run, metric), steps in missing.items():
        shown = ", ".join(str(s) for s in steps[:MAX_LISTED]) + (" ..." if len(steps) > MAX_LISTED else "")
        problems.add("metric missing at a step in some run", FIX_MISSING,
                     f"run {run}: {metric} missing at step(s) {shown} (present there in the other runs)")
    bad = table[~table["value"].map(math.isfinite)]
    for row in bad.itertuples(index=False):
        what = "NaN" if math.isnan(row.value) else ("Infinity" if row.value > 0 else "-Infinity")
        problems.add("non-finite values", FIX_NONFINITE, f"run {row.run}: {row.metric} is {what} at step {row.step}")


def step_statistics(table: pd.DataFrame) -> pd.DataFrame:
    """Per (metric, step): ``n``, ``mean``, ``std`` (sample, ddof=1), ``min``, ``max``, ``max_dev``
    (max |value - mean| over the runs), ``max_rel_dev`` (``max_dev / |mean|``; 0 when both are 0,
    inf when only the mean is 0) and ``worst_run`` (the run with that deviation; the first on ties).

    Checks the table itself (fewer than 2 runs, a metric missing at a step in some run, non-finite
    values) and raises one ``InputError`` listing every problem. Rows sorted by metric, then step.
    """
    runs = sorted(table["run"].unique()) if not table.empty else []
    problems = Problems()
    if len(runs) < MIN_RUNS:
        problems.add("too few runs", FIX_RUNS, f"the table holds N = {len(runs)} run(s), N < {MIN_RUNS}")
    _check_table(table, runs, None, problems)
    problems.raise_if_any("cannot compute run-to-run statistics")
    grouped = table.groupby(["metric", "step"], sort=True)["value"]
    stats = grouped.agg(n="count", mean="mean", std="std", min="min", max="max")
    frame = table.reset_index(drop=True).join(stats["mean"], on=["metric", "step"])
    frame["dev"] = (frame["value"] - frame["mean"]).abs()
    worst = frame.loc[frame.groupby(["metric", "step"], sort=True)["dev"].idxmax()].set_index(["metric", "step"])
    stats["max_dev"] = worst["dev"]
    stats["worst_run"] = worst["run"]
    stats["max_rel_dev"] = [_relative(d, m) for d, m in zip(stats["max_dev"], stats["mean"])]
    stats = stats.reset_index()
    stats["n"] = stats["n"].astype(int)
    stats["step"] = stats["step"].astype(int)
    return stats[STAT_COLUMNS]


def _relative(deviation: float, mean: float) -> float:
    if mean == 0:
        return 0.0 if deviation == 0 else math.inf
    return deviation / abs(mean)


def runs_of(stats: pd.DataFrame) -> int:
    return int(stats["n"].max()) if not stats.empty else 0


def fmt_value(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.3g}"


def cell(text: str) -> str:
    return text.replace("|", "\\|")

# --- a proposal as a new baseline version ---------------------------------------------------------------

class Proposal(NamedTuple):
    """A suite's proposed baseline from N runs: the files of a new version, its statistics summary, the
    tables a person reads (Markdown, without the warnings), the warnings (each reader lists them once),
    and the choices the approver has: label -> {version file name: proposal file to write there} (the
    first is the default; {} keeps ``files`` as they are)."""

    files: dict[str, bytes]
    statistics: dict[str, Any]
    markdown: str
    warnings: list[str]
    choices: dict[str, dict[str, str]] = {}
