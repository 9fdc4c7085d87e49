"""One number style for everything a person reads (report, card, history, logs, notifications).

* **Digits per metric**: a metric's values and errors are shown with the number of decimals that
  gives three significant digits at the scale of its threshold (0.03 -> 4 decimals, 0.1 -> 3,
  0.0001 -> 6; a relative threshold is scaled by the baseline value), so every row of one metric
  has the same digits and nothing finer than the bound cares about is printed.
* **Units on every time**: ``time/step`` values and absolute errors in seconds ("44.9 s"), the e2e
  wall time as a duration ("46 s", "12 min 5 s") against a budget in minutes ("< 40 min").
* **Relative thresholds and errors as percentages** ("< 12%", "3.0%"), as the runbook writes them.
* **Times in UTC**, to the second: "2026-12-02 02:04:56 UTC".
* **An error rounded away is said to be**: the checker rounds step errors to 5 decimals, so an
  error of 0 between two different values is shown "< 0.00001 (rounded)", never "0".

Pure: no Airflow, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Iterable

#: Metrics whose values are seconds.
TIME_METRICS = ("time/step",)
WALL_TIME = "e2e wall time"
STEP_COUNT = "RL steps"
#: Significant digits shown at the scale of a metric's threshold.
SIGNIFICANT = 3
#: The checker rounds step-by-step errors to this many decimals (xtuner-contract.md).
CHECKER_ROUND = 5


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def decimals_at(scale: float | None, significant: int = SIGNIFICANT) -> int:
    """Decimals that show ``significant`` digits of a number of the size ``scale`` (0 for none)."""
    if not _finite(scale) or not scale:
        return significant
    return max(0, significant - 1 - math.floor(math.log10(abs(float(scale)))))


def non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


@dataclass(frozen=True)
class Style:
    """How one metric's numbers are written: decimals of its values and of its errors, its unit, and
    whether its errors and threshold are relative (shown as percentages)."""

    metric: str
    value_decimals: int
    error_decimals: int
    relative: bool = False
    unit: str = ""

    def value(self, value: float | None) -> str:
        """A baseline or current value ("-" for none)."""
        if value is None:
            return "-"
        if not _finite(value):
            return non_finite(float(value))
        if self.metric == WALL_TIME:
            return duration(float(value))
        if self.metric == STEP_COUNT:
            return f"{value:.0f}"
        return f"{value:.{self.value_decimals}f}" + (f" {self.unit}" if self.unit else "")

    def error(self, error: float | None, baseline: float | None = None, current: float | None = None) -> str:
        """An error; "< 0.00001 (rounded)" when the checker's rounding made two different values' error 0,
        "< 0.001" when a nonzero error is below the digits shown."""
        if error is None:
            return "-"
        if not _finite(error):
            return non_finite(float(error))
        if self.metric == WALL_TIME:
            return duration(float(error))
        if self.metric == STEP_COUNT:
            return f"{error:+.0f}" if error else "0"
        if error == 0 and _finite(baseline) and _finite(current) and baseline != current:
            return f"< {10 ** -CHECKER_ROUND:.{CHECKER_ROUND}f} (rounded)"
        scaled = error * 100 if self.relative else error
        unit = "%" if self.relative else (f" {self.unit}" if self.unit else "")
        decimals = self.error_decimals
        if scaled != 0 and abs(scaled) < 0.5 * 10 ** -decimals:
            return f"< {10 ** -decimals:.{decimals}f}{unit}"
        return f"{scaled:.{decimals}f}{unit}"

    def threshold(self, operator: str, threshold: float | None) -> str:
        """``< 12%``, ``<= 0.0001``, ``< 10 s``, ``< 40 min`` ("-" without a threshold)."""
        if threshold is None:
            return "-"
        if self.metric == WALL_TIME:
            return f"{operator} {duration(float(threshold))}"
        if self.metric == STEP_COUNT:
            return "equal step counts" if operator == "==" else f"{operator} {threshold:g}"
        return f"{operator} {threshold_number(threshold, self.relative)}" + (
            f" {self.unit}" if self.unit and not self.relative else "")


def threshold_number(threshold: float, relative: bool) -> str:
    """A threshold's number as the runbook writes it: ``12%`` when relative, ``0.0001`` otherwise (never
    in exponent notation)."""
    if relative:
        return f"{threshold * 100:g}%"
    text = f"{threshold:.10f}".rstrip("0").rstrip(".")
    return text or "0"


def unit_of(metric: str) -> str:
    """The unit of a metric's values ("s" for step times, "" for the unitless ones)."""
    return "s" if metric in TIME_METRICS or metric == WALL_TIME else ""


def style(metric: str, method: str, threshold: float | None, baselines: Iterable[float | None] = ()) -> Style:
    """The style of ``metric`` judged by ``method`` against ``threshold``; ``baselines``: its reference values
    (a relative threshold's scale is the threshold times the largest of them)."""
    relative = method in ("relative", "slowdown")
    if relative:
        sizes = [abs(float(b)) for b in baselines if _finite(b) and b]
        scale = (threshold or 0) * max(sizes) if sizes else None
        value_decimals = decimals_at(scale)
        error_decimals = decimals_at((threshold or 0) * 100)
    else:
        value_decimals = error_decimals = decimals_at(threshold)
    return Style(metric, value_decimals, error_decimals, relative, unit_of(metric))


def duration(seconds: float) -> str:
    """Seconds as a duration a person reads: "7 s", "46 s", "12 min 5 s", "40 min", "2 h 5 min"."""
    if not _finite(seconds):
        return non_finite(float(seconds))
    total = round(seconds)
    if total < 60:
        return f"{seconds:.0f} s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f} s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min {secs} s" if secs else f"{minutes} min"


def utc(moment: str | datetime | None) -> str:
    """An ISO timestamp or datetime as "2026-12-02 02:04:56 UTC" (naive values are taken as UTC); the
    text itself when it is no timestamp, "-" for none."""
    if moment is None or moment == "":
        return "-"
    if isinstance(moment, str):
        try:
            parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            return moment
    else:
        parsed = moment
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def share(value: float | None) -> str:
    """A probability as a percentage ("47.9%", "< 0.1%"; "-" for none)."""
    if value is None:
        return "-"
    return "< 0.1%" if 0 < value < 0.001 else f"{value:.1%}"
