"""Baseline calibration statistics (issue 9): N runs of one reference commit -> a proposed baseline.

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
* GRPO proposal: :func:`grpo_baseline_rows` / :func:`write_grpo_baseline` make a tracker in XTuner's
  tracker format (one JSON object per line, integer ``step``, float scalars; a step-summary row per
  step carrying the marker; the step-0 eval values on an eval-only row) from the per-step means, so
  ``read_tracker`` and the checkout's ``check_rl_result`` read it like a run's tracker. The source
  runs are NOT written into the tracker: the contract says every line carries an integer step and
  float scalars, and the real checker ``json.loads`` every line, so a provenance row is not
  guaranteed to be tolerated. They go to a sidecar JSON next to it (:func:`grpo_baseline_provenance`).
* OPD proposal: :func:`opd_proposal` gives golden values (the means) at every eval point of the
  suite spec and thresholds = measured max deviation x margin (the runbook's "measured max run-to-run
  deviation x 1.5 margin") in the shape of ``data/opd_golden_*.json``, side by side with the current
  thresholds, with warnings (widening; runs that disagree too much: see :func:`opd_proposal`).
  :func:`proposal_table_markdown` renders it for the card and the closing note.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from rl_verify.core.errors import InputError
from rl_verify.core.thresholds import OpdGolden, Rule
from rl_verify.core.tracker import EVAL_PREFIX, MARKER, Tracker, read_tracker

COLUMNS = ["run", "step", "metric", "value"]
STAT_COLUMNS = ["metric", "step", "n", "mean", "std", "min", "max", "max_dev", "max_rel_dev", "worst_run"]
#: Items listed per kind of problem in one InputError; the rest are counted.
MAX_LISTED = 10
#: Proposed thresholds are rounded UP to this many significant digits (never tighter than the rule).
THRESHOLD_DIGITS = 4
DEFAULT_MARGIN = 1.5
MIN_RUNS = 2

FIX_RUNS = ("calibrate from at least 2 runs of the same commit and config (runbook defaults: 5 runs for GRPO, "
            "3 for OPD)")
FIX_STEPS = ("every run must train the same number of steps; re-run or leave out the run that stopped early "
             "(the checker refuses trackers with different step counts)")
FIX_MISSING = ("re-run or leave out the run that lacks the metric; every run must log the same metrics at the "
               "same steps")
FIX_NONFINITE = "a diverged run cannot be part of a baseline; leave it out and re-run"
FIX_ABSENT = "ask only for metrics the trackers log (check the metric names against the tracker)"

RULE_THRESHOLD = ("proposed threshold = the largest deviation of one run from the {n}-run mean over the eval points "
                  "x {margin} (relative metrics: as a fraction of the mean), rounded up to "
                  f"{THRESHOLD_DIGITS} significant digits")
RULE_WIDENING = "a proposed threshold wider than today's is flagged: widening a tolerance can hide a regression"
#: A proposal is warned about when healthy verifications would FAIL it this often (see false_alarm_rate).
FALSE_ALARM_LIMIT = 0.10
#: Largest N the few-runs warning searches for one that would bring the rate under the limit.
FALSE_ALARM_MAX_RUNS = 20
RULE_FEW_RUNS = ("the runs are too few for the rule when, with run-to-run noise that is independent and normal, a "
                 "fresh healthy run would FAIL one of the judged metrics' proposed tolerances in more than "
                 f"{FALSE_ALARM_LIMIT:.0%} of verifications (metrics taken as independent; estimated by simulation)")
RULE_DISAGREEMENT = ("the runs disagree too much to make a baseline for a metric when one of them, at some eval point, "
                     "is farther from the {n}-run mean than today's threshold allows: that run of the reference "
                     "commit would FAIL its own verification against the proposed golden value")


class _Problems:
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
    problems = _Problems()
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
                       problems: _Problems) -> None:
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
                 problems: _Problems) -> None:
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
    problems = _Problems()
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


def _runs_of(stats: pd.DataFrame) -> int:
    return int(stats["n"].max()) if not stats.empty else 0


# --- GRPO: a baseline tracker made of the per-step means ---------------------------------------------

def grpo_baseline_rows(stats: pd.DataFrame,
                       source_runs: Mapping[str, str | Path] | Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The baseline tracker's rows (XTuner's format): one step-summary row per step holding the marker
    ``response/rewards/mean`` and every metric's mean at that step (eval means of that step merged in,
    as XTuner merges them), and an eval-only row for eval means at a step without training (step 0).

    ``read_tracker`` reads the rows back with the same steps and values (floats are written exactly).
    When ``source_runs`` is given, every statistic must come from exactly that many runs. Raises
    ``InputError`` when the marker metric is missing or a training metric has a step without it.
    """
    problems = _Problems()
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


# --- OPD: golden values and thresholds ----------------------------------------------------------------

def ceil_significant(value: float, digits: int = THRESHOLD_DIGITS) -> float:
    """``value`` rounded up at ``digits`` significant digits (float noise below 1e-6 of a unit ignored)."""
    if value == 0 or not math.isfinite(value):
        return value
    scale = 10 ** (digits - 1 - math.floor(math.log10(abs(value))))
    return math.ceil(round(value * scale, 6)) / scale


def _deviation_column(rule: Rule) -> str:
    """Relative rules (relative, slowdown) measure deviation as a fraction of the mean."""
    return "max_dev" if rule.method in ("absolute", "value") else "max_rel_dev"


def _fmt_threshold(rule_method: str, value: float | None) -> str:
    if value is None:
        return "—"
    if rule_method in ("relative", "slowdown"):
        return f"{value * 100:.4g}%"
    return f"{value:.4g}"


def opd_proposal(stats: pd.DataFrame, current: OpdGolden, eval_points: Sequence[int],
                 margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
    """Golden values and thresholds proposed from N runs, side by side with ``current``.

    * ``eval_points``: the suite spec's (``load_suite(current.suite).eval_points`` when None).
    * ``golden``: step -> metric -> mean, for the metrics the current table holds golden values for,
      at every eval point where the runs have them (training metrics have none at step 0); the shape
      of the data file's ``golden``.
    * ``thresholds``: metric -> ``{method, operator, threshold, measured_max_dev[, reference_only]}``
      for every metric of ``current.thresholds`` (method, operator and reference_only kept), the
      shape of the data file's ``thresholds``: measured_max_dev = the largest deviation of one run
      from the N-run mean over the eval points (absolute; as a fraction of the mean for relative
      rules), threshold = measured_max_dev x ``margin`` rounded up to 4 significant digits.
    * ``metrics``: per metric the proposed and current threshold, change, where the deviation was
      measured (step, run) and the flags below; ``points``: per metric and eval point the proposed
      and current value with n/std/min/max.
    * ``warnings``: (1) widening: the proposed threshold is wider than today's (widening a tolerance
      can hide a regression); (2) disagreement: at some eval point a run is farther from the N-run
      mean than today's rule allows (``not current_rule.holds(deviation)``): a run of the reference
      commit would FAIL its own verification against the proposed golden value, so the N runs do
      not agree well enough to be averaged into a baseline without a human looking at them. The
      rule is tied to today's threshold on purpose: it is the project's definition of "the same
      result", it uses the rule's own method and operator, and it stays meaningful for metrics near
      zero where a coefficient of variation explodes. (3) a zero deviation (identical runs) gives a
      threshold that no run can meet with "<". (4) too few runs: the judged metrics' proposed tolerances
      would FAIL more than ``FALSE_ALARM_LIMIT`` of healthy verifications if run-to-run noise is
      independent and normal (:func:`suite_false_alarm_rate`); the runbook's x1.5 on N = 3 runs gives
      about 24% per metric judged at 6 eval points.
    * ``rules``: the three rules above in words.

    Raises ``InputError`` (all problems at once) for a bad margin, a threshold metric with no
    statistics at the eval points, or a golden metric of the current table missing at an eval point.
    """
    points = sorted(set(int(p) for p in eval_points))
    problems = _Problems()
    if not (math.isfinite(margin) and margin > 0):
        problems.add("bad margin", "give a positive margin (the runbook's is 1.5)", f"margin {margin!r}")
    at = stats.set_index(["metric", "step"]) if not stats.empty else None
    n = _runs_of(stats)
    golden_metrics = [m for m in current.thresholds if any(m in row for row in current.golden.values())]

    def stat(metric: str, step: int) -> Any:
        return at.loc[(metric, step)] if at is not None and (metric, step) in at.index else None

    golden: dict[int, dict[str, float]] = {}
    point_rows: list[dict[str, Any]] = []
    for step in points:
        for metric in golden_metrics:
            s, cur_value = stat(metric, step), current.value(step, metric)
            if s is None and cur_value is not None:
                problems.add("golden metric missing at an eval point", "calibrate with runs that reach every eval "
                             "point of the suite spec", f"{metric} at step {step} (today's golden {cur_value})")
            if s is None:
                continue
            golden.setdefault(step, {})[metric] = float(s["mean"])
            point_rows.append({"metric": metric, "step": step, "proposed": float(s["mean"]), "current": cur_value,
                               "n": int(s["n"]), "std": float(s["std"]), "min": float(s["min"]),
                               "max": float(s["max"]), "max_dev": float(s["max_dev"]),
                               "max_rel_dev": float(s["max_rel_dev"])})
    thresholds: dict[str, dict[str, Any]] = {}
    metric_rows: list[dict[str, Any]] = []
    for metric, rule in current.thresholds.items():
        col = _deviation_column(rule)
        measured = [(float(s[col]), step, str(s["worst_run"])) for step in points
                    if (s := stat(metric, step)) is not None]
        if not measured:
            problems.add("threshold metric not measured at any eval point", FIX_ABSENT,
                         f"{metric} (eval points {', '.join(map(str, points))})")
            continue
        deviation, dev_step, dev_run = max(measured, key=lambda m: m[0])
        proposed = ceil_significant(deviation * margin) if math.isfinite(margin) else math.nan
        entry: dict[str, Any] = {"method": rule.method, "operator": rule.operator, "threshold": proposed,
                                 "measured_max_dev": ceil_significant(deviation, 6)}
        if rule.reference_only:
            entry["reference_only"] = True
        thresholds[metric] = entry
        metric_rows.append({"metric": metric, "method": rule.method, "operator": rule.operator,
                            "reference_only": rule.reference_only, "measured_max_dev": deviation,
                            "measured_at_step": dev_step, "worst_run": dev_run, "measured_points": len(measured),
                            "golden_values": metric in golden_metrics,
                            "proposed_threshold": proposed,
                            "current_threshold": rule.threshold, "current_measured_max_dev": rule.measured_max_dev,
                            "change": proposed - rule.threshold, "widening": proposed > rule.threshold,
                            "disagreement": not rule.holds(deviation), "zero_deviation": deviation == 0})
    problems.raise_if_any("cannot propose an OPD golden table")
    alternative = false_alarm_thresholds(point_rows, metric_rows, n)
    for row in metric_rows:
        row["false_alarm_threshold"] = alternative["thresholds"].get(row["metric"])
    return {"suite": current.suite, "runs": n, "margin": margin, "eval_points": points, "golden": golden,
            "thresholds": thresholds, "metrics": metric_rows, "points": point_rows,
            "warnings": _opd_warnings(metric_rows, n, margin), "false_alarm": alternative,
            "rules": {"threshold": RULE_THRESHOLD.format(n=n, margin=margin), "widening": RULE_WIDENING,
                      "disagreement": RULE_DISAGREEMENT.format(n=n), "few_runs": RULE_FEW_RUNS,
                      "false_alarm": alternative["rule"]}}


@functools.lru_cache(maxsize=512)
def false_alarm_rate(n: int, points: int, margin: float, samples: int = 20_000) -> float:
    """The chance that a fresh healthy run breaks, at one of ``points`` eval points, a tolerance made by
    the rule from ``n`` runs (``margin`` x the largest deviation of a run from the n-run mean), when
    run-to-run noise is independent and normal. A Monte Carlo estimate with a fixed seed: the same
    answer every time (standard error under 0.004)."""
    rng = np.random.default_rng(20261026)
    runs = rng.standard_normal((samples, n, points))
    mean = runs.mean(axis=1)
    tolerance = margin * np.abs(runs - mean[:, None, :]).max(axis=(1, 2))
    fresh = rng.standard_normal((samples, points))
    return float((np.abs(fresh - mean) > tolerance[:, None]).any(axis=1).mean())


def suite_false_alarm_rate(n: int, points_per_metric: Sequence[int], margin: float) -> float:
    """The chance that a fresh healthy run FAILs at least one of the metrics (each judged at its number
    of eval points), the metrics taken as independent (:func:`false_alarm_rate`)."""
    return 1 - math.prod(1 - false_alarm_rate(n, p, margin) for p in points_per_metric)


def _few_runs_warning(metric_rows: list[dict[str, Any]], n: int, margin: float) -> str | None:
    """The few-runs warning (rule ``RULE_FEW_RUNS``), or None when the proposal holds often enough."""
    # Only tolerances around golden values come from the runs' spread (the others stay today's).
    judged = [m for m in metric_rows if m["golden_values"] and not m["reference_only"] and m["measured_points"]]
    if not judged or not (math.isfinite(margin) and margin > 0):
        return None
    points = [m["measured_points"] for m in judged]
    rate = suite_false_alarm_rate(n, points, margin)
    if rate <= FALSE_ALARM_LIMIT:
        return None
    enough = next((k for k in range(n + 1, FALSE_ALARM_MAX_RUNS + 1)
                   if suite_false_alarm_rate(k, points, margin) <= FALSE_ALARM_LIMIT), None)
    per_metric = false_alarm_rate(n, max(points), margin)
    advice = (f"N = {enough} runs would bring it to {suite_false_alarm_rate(enough, points, margin):.0%}"
              if enough else f"no N up to {FALSE_ALARM_MAX_RUNS} brings it under {FALSE_ALARM_LIMIT:.0%}")
    return (f"{n} runs are few for the x {margin} rule: if the runs differ only by normal run-to-run noise, a "
            f"fresh healthy run breaks one metric's proposed tolerance in about {per_metric:.0%} of runs, and about "
            f"{rate:.0%} of healthy verifications would FAIL on at least one of the {len(judged)} judged metrics "
            f"(rule: flagged above {FALSE_ALARM_LIMIT:.0%}); {advice}; or keep today's tolerances")


#: The false-alarm rate per verification the alternative thresholds hold by default.
FALSE_ALARM_TARGET = 0.05
RULE_FALSE_ALARM = ("alternative thresholds hold a false alarm of {alpha:.0%} per verification for these {n} runs: "
                    "per metric, the pooled sample standard deviation s of the runs at its eval points, and "
                    "threshold = t(1 - a/2, dof) * s * sqrt(1 + 1/N), the Student-t prediction bound of a fresh "
                    "run against the N-run mean, with a = 1 - (1 - {alpha:g})^(1/points) shared over every judged "
                    "point of every judged metric (normal, independent noise); rounded up to "
                    f"{THRESHOLD_DIGITS} significant digits")


def false_alarm_thresholds(point_rows: Sequence[Mapping[str, Any]], metric_rows: Sequence[Mapping[str, Any]], n: int,
                           alpha: float = FALSE_ALARM_TARGET) -> dict[str, Any]:
    """Thresholds that hold a false alarm of ``alpha`` per verification for the ``n`` runs given (rule
    ``RULE_FALSE_ALARM``, SciPy's Student-t quantile), for each metric judged against the N-run mean
    (golden values), and the N the runbook's x1.5 rule would need to hold the same rate."""
    from scipy.stats import t as student_t  # kept out of DAG parsing

    judged = [m for m in metric_rows if m["golden_values"] and not m["reference_only"]]
    spread: dict[str, tuple[float, int, int]] = {}
    for m in judged:
        mine = [p for p in point_rows if p["metric"] == m["metric"] and math.isfinite(p["std"])]
        if not mine:
            continue
        scale = [p["std"] / abs(p["proposed"]) if m["method"] == "relative" and p["proposed"] else p["std"]
                 for p in mine]
        pooled = math.sqrt(sum(v * v for v in scale) / len(scale))
        spread[m["metric"]] = (pooled, len(mine), len(mine) * (n - 1))
    total = sum(points for _, points, _ in spread.values())
    thresholds = {}
    if total and n >= 2:
        per_point = 1 - (1 - alpha) ** (1 / total)
        for metric, (pooled, _, dof) in spread.items():
            bound = student_t.ppf(1 - per_point / 2, dof) * pooled * math.sqrt(1 + 1 / n)
            thresholds[metric] = ceil_significant(bound) if bound > 0 else bound
    points = [points for _, points, _ in spread.values()]
    needed = next((k for k in range(2, FALSE_ALARM_MAX_RUNS + 1)
                   if suite_false_alarm_rate(k, points, DEFAULT_MARGIN) <= alpha), None) if points else None
    return {"alpha": alpha, "thresholds": thresholds, "runs": n,
            "runbook_rule_rate": suite_false_alarm_rate(n, points, DEFAULT_MARGIN) if points else None,
            "runbook_rule_runs_needed": needed, "rule": RULE_FALSE_ALARM.format(alpha=alpha, n=n)}


def _opd_warnings(metric_rows: list[dict[str, Any]], n: int, margin: float) -> list[str]:
    """Warning sentences for widening, disagreement, zero deviation and too few runs (see
    :func:`opd_proposal`)."""
    out = []
    for m in metric_rows:
        method = m["method"]
        dev = _fmt_threshold(method, m["measured_max_dev"])
        where = f"run {m['worst_run']} at step {m['measured_at_step']}"
        ref = " (reference only: never judged)" if m["reference_only"] else ""
        if m["disagreement"]:
            out.append(f"{m['metric']}{ref}: the {n} runs disagree too much to make a baseline: {where} is {dev} "
                       f"from the {n}-run mean, which already breaks today's threshold {m['operator']} "
                       f"{_fmt_threshold(method, m['current_threshold'])} (rule: a metric is flagged when one "
                       "source run would FAIL its own verification against the proposed golden value); look at "
                       "that run before promoting")
        if m["widening"]:
            out.append(f"{m['metric']}{ref}: proposed tolerance {m['operator']} "
                       f"{_fmt_threshold(method, m['proposed_threshold'])} is wider than today's {m['operator']} "
                       f"{_fmt_threshold(method, m['current_threshold'])} (measured max deviation {dev}, {where}, "
                       f"x {margin}): widening a tolerance can hide a regression")
        if m["zero_deviation"]:
            out.append(f"{m['metric']}{ref}: the {n} runs are identical at every eval point (deviation 0), so the "
                       f"proposed threshold is 0 and '{m['operator']} 0' "
                       + ("fails every run; calibrate with differing seeds or keep today's threshold"
                          if m["operator"] == "<" else "allows no run-to-run noise at all"))
    few = _few_runs_warning(metric_rows, n, margin)
    return out + ([few] if few else [])


def fmt_value(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.3g}"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def proposal_table_markdown(proposal: Mapping[str, Any], warnings: bool = True) -> str:
    """Markdown table ``metric | eval point | proposed value | current value | proposed threshold |
    current threshold | change``: one row per metric and eval point with a golden value (change =
    proposed - current value), one row "all" for a metric judged without golden values; the
    proposed threshold is marked (wider)/(tighter)/(same). Then the threshold rule in words and,
    when ``warnings``, the proposal's warnings as a list."""
    alternative = proposal.get("false_alarm") or {}
    head = ["metric", "eval point", "proposed value", "current value", "proposed threshold",
            "current threshold", "change"]
    if alternative.get("thresholds"):
        head.insert(5, f"threshold at {alternative['alpha']:.0%} false alarm")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    points = proposal.get("points", [])
    for m in proposal.get("metrics", []):
        method, op = m["method"], m["operator"]
        prop, cur = m["proposed_threshold"], m["current_threshold"]
        mark = "wider" if prop > cur else ("tighter" if prop < cur else "same")
        prop_cell = f"{op} {_fmt_threshold(method, prop)} ({mark})"
        cur_cell = f"{op} {_fmt_threshold(method, cur)}" + (" (reference only)" if m["reference_only"] else "")
        alt = m.get("false_alarm_threshold")
        alt_cell = [f"{op} {_fmt_threshold(method, alt)}" if alt is not None else "today's"] \
            if alternative.get("thresholds") else []
        mine = [p for p in points if p["metric"] == m["metric"]]
        for p in mine:
            change = "—" if p["current"] is None else f"{p['proposed'] - p['current']:+.4f}"
            cells = [m["metric"], str(p["step"]), fmt_value(p["proposed"]), fmt_value(p["current"]),
                     prop_cell, *alt_cell, cur_cell, change]
            lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
        if not mine:
            cells = [m["metric"], "all", "—", "—", prop_cell, *alt_cell, cur_cell, "—"]
            lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    rules = proposal.get("rules", {})
    out = "\n".join(lines) + "\n"
    if rules.get("threshold"):
        out += f"\nProposed value: mean of {proposal.get('runs')} runs at the eval point; " + rules["threshold"] + ".\n"
    if alternative.get("thresholds"):
        rate, needed = alternative.get("runbook_rule_rate"), alternative.get("runbook_rule_runs_needed")
        out += (f"\nWhat the thresholds will cost: with the runbook's x {proposal.get('margin')} on these "
                f"{proposal.get('runs')} runs, about {rate:.0%} of healthy verifications would FAIL (normal, "
                f"independent noise); "
                + (f"the x {proposal.get('margin')} rule would need N = {needed} runs to hold "
                   f"{alternative['alpha']:.0%}. " if needed else
                   f"no N up to {FALSE_ALARM_MAX_RUNS} makes the x {proposal.get('margin')} rule hold "
                   f"{alternative['alpha']:.0%}. ")
                + f"The {alternative['alpha']:.0%} column: {alternative['rule']}. The approver picks one set.\n")
    if warnings and proposal.get("warnings"):
        out += "\n**Warnings**\n\n" + "".join(f"- {w}\n" for w in proposal["warnings"])
    return out


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
