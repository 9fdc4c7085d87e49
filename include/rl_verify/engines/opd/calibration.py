"""The opd engine's calibration: N runs' trackers -> a proposed golden table.

:func:`opd_proposal` gives golden values (the means) at every eval point of the suite spec and thresholds =
measured max deviation x margin (the runbook's "measured max run-to-run deviation x 1.5 margin") in the shape
of the golden data file, side by side with the current thresholds, with warnings (widening; runs that
disagree too much; too few runs for the rule: see :func:`opd_proposal`) and the alternative thresholds that
hold a stated false-alarm rate (:func:`false_alarm_thresholds`). :func:`proposal_table_markdown` renders it
for the card and the closing note; :func:`opd_golden_proposal` is the engine's ``propose``. pandas, numpy:
imported by the engine only when it proposes (kept out of DAG parsing and the triggerer).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl_verify.core.calibration import FIX_ABSENT, Problems, Proposal, cell, fmt_value, run_table, runs_of, \
    step_statistics
from rl_verify.core.thresholds import Rule
from rl_verify.engines.opd.thresholds import (FALSE_ALARM_CHOICE, FALSE_ALARM_FILE, GOLDEN_FILE, MARGIN,
                                              RUNBOOK_CHOICE, OpdGolden, load_golden)
from rl_verify.suites.spec import SuiteSpec

#: Proposed thresholds are rounded UP to this many significant digits (never tighter than the rule).
THRESHOLD_DIGITS = 4
DEFAULT_MARGIN = 1.5

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


def opd_golden_proposal(spec: SuiteSpec, trackers: Mapping[str, str | Path], current_data: Path,
                        commit: str | None = None) -> Proposal:
    """A golden table (``golden.json``, the data file's schema) of the means at every eval point and
    thresholds = max deviation x 1.5, with the current table side by side and the warnings."""
    current = load_golden(current_data)
    stats = step_statistics(run_table(trackers, list(current.thresholds), spec.expected_steps))
    proposal = opd_proposal(stats, current, spec.eval_points, margin=MARGIN)
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
    markdown = proposal_table_markdown(proposal, warnings=False)  # the warnings travel in Proposal.warnings
    if kept:
        markdown += (f"\nKept at today's threshold: {', '.join(kept)} (judged against the reference baseline "
                     "tracker, which these runs do not calibrate).\n")
    files = {GOLDEN_FILE: (json.dumps(golden, indent=2) + "\n").encode("utf-8")}
    choices: dict[str, dict[str, str]] = {RUNBOOK_CHOICE: {}}
    alternative = proposal["false_alarm"]
    if alternative["thresholds"] and alternative["alpha"] == 0.05:  # the label says 5%
        label = FALSE_ALARM_CHOICE
        held = {**golden, "source": {**source, "note": source["note"].split(";")[0] + f"; thresholds: {label} ("
                                     + alternative["rule"] + ")"},
                "thresholds": {m: {**t, "threshold": alternative["thresholds"].get(m, t["threshold"])}
                               for m, t in golden["thresholds"].items()}}
        files[FALSE_ALARM_FILE] = (json.dumps(held, indent=2) + "\n").encode("utf-8")
        choices[label] = {GOLDEN_FILE: FALSE_ALARM_FILE}
        statistics["false_alarm"] = alternative
    return Proposal(files, json.loads(json.dumps(statistics, default=float)), markdown,
                    list(proposal["warnings"]), choices)


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
    problems = Problems()
    if not (math.isfinite(margin) and margin > 0):
        problems.add("bad margin", "give a positive margin (the runbook's is 1.5)", f"margin {margin!r}")
    at = stats.set_index(["metric", "step"]) if not stats.empty else None
    n = runs_of(stats)
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
