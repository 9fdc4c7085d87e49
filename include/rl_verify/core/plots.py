"""One PNG per suite: a panel per checked metric, baseline vs current, threshold band around the
baseline, failing points marked. matplotlib is imported inside the function (Agg backend) so
importing this module stays cheap for the DAG parser.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

XY = tuple[float, float]


@dataclass
class Panel:
    """Data of one panel. ``baseline``/``current`` are (step, value) points; ``failing`` are the
    current points that break the bound; ``band`` is the method/threshold used to draw the band."""

    metric: str
    baseline: list[XY] = field(default_factory=list)
    current: list[XY] = field(default_factory=list)
    method: str = "absolute"
    threshold: float | None = None
    failing: list[XY] = field(default_factory=list)
    baseline_label: str = "baseline"
    note: str = ""


def band(value: float, method: str, threshold: float | None) -> tuple[float, float] | None:
    """(low, high) bounds around a baseline value for a method, or None when no band applies."""
    if threshold is None or not math.isfinite(value):
        return None
    if method == "absolute":
        return value - threshold, value + threshold
    if method == "relative":
        return value - abs(value) * threshold, value + abs(value) * threshold
    if method == "slowdown":
        return -math.inf, value + abs(value) * threshold
    return None


def _finite(points: list[XY]) -> list[XY]:
    return [(x, y) for x, y in points if math.isfinite(y)]


def plot_panels(path: str | Path, title: str, panels: list[Panel]) -> Path:
    """Draw ``panels`` into the PNG ``path`` (written atomically) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = max(len(panels), 1)
    cols = 2 if count > 1 else 1
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.0 * rows), squeeze=False)
    for index, axis in enumerate(axes.flat):
        if index >= len(panels):
            axis.axis("off")
            continue
        _draw(axis, panels[index])
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _draw(axis, panel: Panel) -> None:
    """One panel: band (fill), baseline, current, failing points, and the value-threshold line."""
    base = _finite(panel.baseline)
    cur = _finite(panel.current)
    if base and panel.method in ("absolute", "relative", "slowdown"):
        lows, highs, xs = [], [], []
        for x, y in base:
            b = band(y, panel.method, panel.threshold)
            if b is None:
                continue
            xs.append(x)
            lows.append(b[0] if math.isfinite(b[0]) else y)
            highs.append(b[1])
        if xs:
            axis.fill_between(xs, lows, highs, color="tab:blue", alpha=0.15, step=None,
                              label=f"threshold band ({panel.method} {panel.threshold:g})")
    if panel.method == "value" and panel.threshold is not None:
        axis.axhline(panel.threshold, color="tab:red", linestyle="--", linewidth=1, label="threshold")
    marker = "o" if len(base) <= 60 else None
    if base:
        axis.plot([x for x, _ in base], [y for _, y in base], color="tab:blue", marker=marker, markersize=3,
                  linewidth=1, label=panel.baseline_label)
    if cur:
        axis.plot([x for x, _ in cur], [y for _, y in cur], color="tab:orange",
                  marker="o" if len(cur) <= 60 else None, markersize=3, linewidth=1, label="current")
    fails = panel.failing
    if fails:
        finite = _finite(fails)
        if finite:
            axis.scatter([x for x, _ in finite], [y for _, y in finite], color="tab:red", marker="x", s=40,
                         zorder=5, label="failing")
        for x, y in fails:
            if not math.isfinite(y):  # NaN/Inf cannot be drawn at its value: mark the step instead
                axis.axvline(x, color="tab:red", linestyle=":", linewidth=1)
    axis.set_title(panel.metric + (f"  [{panel.note}]" if panel.note else ""), fontsize=10)
    axis.set_xlabel("step", fontsize=9)
    axis.tick_params(labelsize=7)
    axis.legend(fontsize=9, loc="best")
