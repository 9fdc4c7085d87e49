"""Test double of XTuner's ``autotest/utils/check_metric.py`` (the GRPO e2e checker).

Written only from the interface contract (docs: xtuner-contract.md), not from XTuner's code. It is
placed in the simulated XTuner checkout so that rl-verify drives it exactly as it drives the real
one: ``autotest/`` first on ``sys.path``, ``check_rl_result(...) -> (bool, str)``, the same side
effects (comparison PNG under ``$CWD/$GITHUB_RUN_ID``, Markdown appended to
``$GITHUB_STEP_SUMMARY``) and the same sharp edges (every line goes through ``json.loads``; a
different number of RL steps raises ``AssertionError``).
"""

import json
import logging

import numpy as np

from utils.metric_report import publish_comparison_report

logging.basicConfig(level=logging.INFO)
logger = logging.getLogger(__name__)

# Metrics compared as a percentile of the per-step errors instead of step by step.
RL_PERCENTILE_METRICS = {
    "response/rewards/mean": 80,
    "response/response_len/mean": 80,
}
STEP_MARKER = "response/rewards/mean"
ROUND_DIGITS = 5


def _load_step_rows(path):
    """All RL step-summary rows of a tracker; every line is parsed (a bad line raises)."""
    rows = []
    with open(path, "r", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if isinstance(record, dict) and STEP_MARKER in record:
                rows.append(record)
    return rows


def _series(rows, metric):
    return [float(row[metric]) for row in rows if metric in row]


def _error(base, cur, method):
    if method == "absolute":
        return abs(cur - base)
    if method == "relative":
        if base == 0:
            return 0.0 if cur == 0 else float("inf")
        return abs(cur - base) / abs(base)
    if method == "slowdown":
        if base == 0:
            return 0.0 if cur <= 0 else float("inf")
        return (cur - base) / abs(base)
    if method == "value":
        return cur
    raise ValueError(f"unknown check method: {method}")


def _within(error, operator, threshold):
    if operator == "<":
        return error < threshold
    if operator == "<=":
        return error <= threshold
    raise ValueError(f"unknown operator: {operator}")


def _check_one(metric_info, base_rows, cur_rows):
    """Return None when the metric passes (or is skipped), else the failure reason."""
    metric = metric_info["metric"]
    threshold = metric_info["threshold"]
    method = metric_info.get("method", "absolute")
    operator = metric_info.get("operator", "<")
    base = _series(base_rows, metric)
    cur = _series(cur_rows, metric)
    if not base and not cur:
        logger.warning("metric %s not found in base or current tracker, skipped", metric)
        return None
    if len(base) != len(cur):
        return f"length mismatch: base has {len(base)} values, current has {len(cur)}"
    errors = [_error(b, c, method) for b, c in zip(base, cur)]
    percentile = metric_info.get("aggregate", RL_PERCENTILE_METRICS.get(metric))
    if percentile is not None:
        aggregated = float(np.percentile(np.asarray(errors, dtype=float), percentile))
        logger.info("%s: p%s of %s errors = %s (threshold %s %s)", metric, percentile, method,
                    aggregated, operator, threshold)
        if not _within(aggregated, operator, threshold):
            return (f"p{percentile} {method} error {aggregated} not {operator} {threshold}")
        return None
    # The real checker names the failing step by its row index counted from 0 (observed: "at step 9"
    # for tracker step 10); the double does the same so the report's translation is exercised.
    for index, error in enumerate(errors):
        error = round(error, ROUND_DIGITS)
        if not _within(error, operator, threshold):
            return (f"at step {index}: {method} error {error} not {operator} {threshold} "
                    f"(base {base[index]}, current {cur[index]})")
    return None


def check_rl_result(case_name, base_path, cur_path, assert_info, phase=None):
    """Compare the current RL tracker against the baseline tracker.

    Returns ``(True, "All metrics check passed.")`` or
    ``(False, "Some metric check failed: {metric: reason, ...}")``. Raises ``AssertionError``
    when the two trackers hold a different number of RL steps.
    """
    base_rows = _load_step_rows(base_path)
    cur_rows = _load_step_rows(cur_path)
    logger.info("case %s%s: base RL steps %d, current RL steps %d", case_name,
                f" ({phase})" if phase else "", len(base_rows), len(cur_rows))
    assert len(cur_rows) == len(base_rows), (
        f"current RL steps is not equal to base RL steps, current: {len(cur_rows)}, base: {len(base_rows)}")

    failed = {}
    metrics = []
    for metric_info in assert_info.get("check_metrics", []):
        metrics.append(metric_info["metric"])
        reason = _check_one(metric_info, base_rows, cur_rows)
        if reason is not None:
            logger.error("metric %s check failed: %s", metric_info["metric"], reason)
            failed[metric_info["metric"]] = reason

    publish_comparison_report(case_name, base_rows, cur_rows, metrics, failed)
    if failed:
        return False, f"Some metric check failed: {failed}"
    return True, "All metrics check passed."
