"""Verification history: every run's ``report.json`` in the record store, as one table and trend charts.

Pure (pandas and matplotlib, no Airflow): the UI plugin calls it with the DAG's record folder. A
metric's trend is its worst error as a fraction of its threshold per run (1.0 = on the bound), so
metrics of different scales share one chart and a breach is any point above 1.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any, BinaryIO

from rl_verify.core.model import BITWISE, PASS, SHORTCUTS, UNCHANGED

log = logging.getLogger(__name__)

_RUN_TIME = re.compile(r"__(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})")


def run_type(dag_run_id: str) -> str:
    """"nightly" for a scheduled run, "manual" for a triggered one, else the id's prefix."""
    prefix = dag_run_id.split("__", 1)[0]
    return {"scheduled": "nightly", "manual": "manual"}.get(prefix, prefix or "unknown")


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    return None


def rows(record_dir: Any, limit: int = 50) -> list[dict[str, Any]]:
    """One row per run, suite and checked metric of the last ``limit`` runs found under ``record_dir``
    (a ``Path`` or an ``ObjectStoragePath``).

    A ``report.json`` that cannot be read is skipped with a warning (one broken record must not
    hide the history). Row keys: run, folder, started, type, commit, commit_ref, verdict (the verification's,
    over every run of a repeated suite), baselines, confirmation (its repeated suites and their runs),
    suite, suite_verdict (its first run's), metric, ratio (worst error / threshold; None when not
    computable), passed. A repeated verification stays one run: its first runs' metrics, its outcome.
    """
    found = []
    for path in sorted(record_dir.glob("*/report.json"), key=str) if record_dir.exists() else []:
        try:
            report = json.loads(path.read_bytes())
        except (OSError, ValueError) as err:
            log.warning("history: skipping unreadable %s (%s)", path, err)
            continue
        run = str(report.get("dag_run_id") or path.parent.name)
        stamp = _RUN_TIME.search(run)
        found.append((stamp.group(1) if stamp else "", run, path.parent.name, report))
    found.sort(key=lambda f: f[0])
    out: list[dict[str, Any]] = []
    for started, run, folder, report in found[-limit:]:
        base = {"run": run, "folder": folder, "started": started, "type": run_type(run),
                "commit": (report.get("commit") or "")[:10], "commit_ref": report.get("commit_ref") or "",
                "verdict": report.get("verdict") or "?", "baselines": baseline_versions(report),
                "confirmation": confirmation(report)}
        for suite in report.get("suites") or []:
            if (suite.get("outcome") or {}).get("outcome") in SHORTCUTS:
                # No run, no metric: one row so that the run is listed (its confirmation column says why).
                out.append({**base, "suite": suite.get("suite"), "suite_verdict": PASS, "metric": "",
                            "ratio": None, "passed": True})
                continue
            for check in suite.get("checks") or []:
                if check.get("passed") is None:
                    continue  # reference only or not calibrated: not judged, not trended
                error, threshold = _number(check.get("error")), _number(check.get("threshold"))
                ratio = None
                if error is not None and threshold:
                    ratio = abs(error) / abs(threshold) if math.isfinite(error) else math.inf
                out.append({**base, "suite": suite.get("suite"), "suite_verdict": suite.get("verdict"),
                            "metric": check.get("metric"), "ratio": ratio, "passed": bool(check.get("passed"))})
    return out


def _ref_label(ref: str, width: int = 24) -> str:
    """A commit ref as a tick label: whole (a cut "sim/regress-teache" names no branch), wrapped after a
    slash when long, and only a ref longer than two lines is shortened, with an ellipsis."""
    if len(ref) <= width:
        return ref
    cut = ref.rfind("/", 0, width + 1)
    head, tail = (ref[:cut + 1], ref[cut + 1:]) if cut > 0 else (ref[:width], ref[width:])
    return head + "\n" + (tail if len(tail) <= width else tail[:width - 1] + "…")


def table(history_rows: list[dict[str, Any]]):
    """A DataFrame with one row per run, suite and metric: the worst ratio and whether every check passed."""
    import pandas as pd

    frame = pd.DataFrame(history_rows, columns=["run", "folder", "started", "type", "commit", "commit_ref",
                                                "verdict", "baselines", "confirmation", "suite", "suite_verdict",
                                                "metric", "ratio", "passed"])
    if frame.empty:
        return frame
    frame["baselines"] = frame["baselines"].fillna("")
    frame["confirmation"] = frame["confirmation"].fillna("")
    keys = ["run", "folder", "started", "type", "commit", "commit_ref", "verdict", "baselines", "confirmation",
            "suite", "suite_verdict", "metric"]
    return (frame.groupby(keys, dropna=False, sort=False)
            .agg(ratio=("ratio", "max"), passed=("passed", "all")).reset_index()
            .sort_values(["started", "suite", "metric"]).reset_index(drop=True))


def runs(frame) -> list[dict[str, Any]]:
    """The runs in the table, newest first: run, folder, started, type, commit, commit_ref, verdict,
    baselines, and ``baselines_changed`` (True when the baseline versions differ from the run before)."""
    if frame.empty:
        return []
    cols = ["run", "folder", "started", "type", "commit", "commit_ref", "verdict", "baselines", "confirmation"]
    out = frame[cols].drop_duplicates().sort_values("started", ascending=False).to_dict("records")
    for newer, older in zip(out, out[1:] + [None]):
        newer["baselines_changed"] = older is not None and newer["baselines"] != older["baselines"]
    return out


def confirmation(report: dict[str, Any]) -> str:
    """``opd: PASS (not reproduced) over 2 runs``: the suites of a report that ran more than once (schema 2)
    or not at all (``PASS (unchanged) since <commit>``), "" when every suite was judged by one run."""
    said = []
    for suite in report.get("suites") or []:
        outcome = suite.get("outcome") or {}
        runs = outcome.get("runs") or []
        if outcome.get("outcome") == UNCHANGED:
            verified = (outcome.get("unchanged") or {}).get("sha") or ""
            said.append(f"{suite.get('suite')}: {UNCHANGED} since {verified[:10]}, no training")
        elif outcome.get("outcome") == BITWISE:
            found = outcome.get("bitwise") or {}
            verified = (found.get("reference") or {}).get("sha") or ""
            said.append(f"{suite.get('suite')}: {BITWISE} against {verified[:10]}, {found.get('steps')} "
                        "deterministic steps")
        elif len(runs) > 1:
            said.append(f"{suite.get('suite')}: {outcome.get('outcome')} over {len(runs)} runs ("
                        + ", ".join(str(r.get("verdict")) for r in runs) + ")")
    return "; ".join(said)


def baseline_versions(report: dict[str, Any]) -> str:
    """``opd v2, grpo v1``: the baseline version each suite of a report was judged against ("" before
    versioned baselines)."""
    labels = report.get("baselines") or {}
    return ", ".join(f"{suite} {str(label).split(':', 1)[0]}" for suite, label in sorted(labels.items()))


def chart(frame, suite: str, out: Path | BinaryIO) -> Path | BinaryIO | None:
    """PNG of each checked metric's worst error/threshold per run for ``suite``, written to ``out``
    (a path or a binary file); None when the suite has no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = frame[(frame["suite"] == suite)] if not frame.empty else frame
    if data.empty:
        return None
    order = list(dict.fromkeys(data.sort_values("started")["run"]))
    labels = {r: f"{g.iloc[0]['started'][5:16]}\n{_ref_label(g.iloc[0]['commit_ref'])}"
              for r, g in data.groupby("run", sort=False)}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(order) + 3), 4.2))
    cap = 3.0  # a non-finite or huge ratio is drawn on the chart's top edge
    for metric, group in data.groupby("metric", sort=True):
        if group["ratio"].isna().all():
            continue  # a count check (threshold 0) has no ratio to trend
        group = group.set_index("run").reindex(order)
        ys = [min(v, cap) if v is not None and v == v else None for v in group["ratio"].tolist()]
        ax.plot(range(len(order)), [float("nan") if y is None else y for y in ys], marker="o", label=metric)
    ax.axhline(1.0, color="#c62828", linestyle="--", linewidth=1, label="threshold")
    for i, run in enumerate(order):
        verdict = data[data["run"] == run]["suite_verdict"].iloc[0]
        ax.axvspan(i - 0.4, i + 0.4, color="#ffebee" if verdict != "PASS" else "#e8f5e9", zorder=0)
    ax.set_xticks(range(len(order)), [labels[r] for r in order], fontsize=9, rotation=20, ha="right")
    ax.set_ylabel("worst error / threshold")
    ax.set_ylim(0, cap * 1.05)
    ax.set_title(f"{suite}: checked metrics over the last {len(order)} runs (red band = FAIL)")
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    if isinstance(out, Path):
        out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, format="png", bbox_inches="tight")  # keeps the outside legend and the title
    plt.close(fig)
    return out
