"""A bisection's result page: the culprit, the evidence table (one row per probe, linked to its report) and a
plot of the followed metric across the range's commits. Pure (matplotlib, no Airflow): the bisection
DAG writes it into its record and the UI plugin serves it."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Mapping

from rl_verify.core.files import write_atomic
from rl_verify.core.names import short_sha

REPORT_MD = "bisection.md"
REPORT_HTML = "bisection.html"
PLOT = "bisection.png"


def _error(row: Mapping[str, Any]) -> str:
    if row.get("error") is None:
        return "n/a"
    fraction = f" ({row['fraction']:.0%} of its threshold)" if row.get("fraction") is not None else ""
    step = f" at step {row['step']}" if row.get("step") is not None else ""
    return f"{row['error']:.4g}{step}{fraction}"


def _outcome(row: Mapping[str, Any]) -> str:
    """A probe's outcome with how it ended early: stopped by its bisection, or aborted by its live check."""
    text = str(row["outcome"])
    if row.get("stopped"):
        text += f" (stopped: {row['stopped']})"
    for suite, where in (row.get("aborted_at") or {}).items():
        text += f" ({suite} aborted early at {where})"
    return text


def early_aborts(result: Mapping[str, Any]) -> str:
    """How many probes that read bad their live check stopped early, in words (a healthy commit's never is)."""
    bad = [r for r in result["probes"] if r.get("reading") == "bad"]
    aborted = [r for r in bad if r.get("aborted_at")]
    return f"{len(aborted)} of {len(bad)} probe(s) that read bad were aborted early by their live check"


def _report_cell(row: Mapping[str, Any]) -> str:
    """The report a probe's row links, or what it has instead ("stopped: no report" for a probe its bisection
    stopped before it wrote one)."""
    if row.get("report") and row.get("runs"):
        return str(row["report"])
    return "stopped: no report" if row.get("stopped") else "none"


def _attempts_cell(row: Mapping[str, Any]) -> str:
    """A probe's trainings tried again after an infrastructure failure (issue 55), each attempt in words; "-" when
    every training ran at its first attempt."""
    return " / ".join(row.get("attempts") or []) or "-"


def headline(result: Mapping[str, Any]) -> str:
    """One line: the culprit with its subject, author and date, or why there is none."""
    answer = result["answer"]
    culprit = answer.get("culprit")
    if culprit:
        return (f"Culprit: {short_sha(culprit['sha'])} {culprit['subject']} ({culprit['author']}, {culprit['date']})")
    return f"{answer['kind'].capitalize()}: {answer['reason']}"


def rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The evidence table's rows, in range order (a commit probed twice has two rows)."""
    index = {c["sha"]: i for i, c in enumerate(result["commits"])}
    return sorted(result["probes"], key=lambda r: (index.get(r["sha"], -1), r.get("run_id", "")))


def markdown(result: Mapping[str, Any]) -> str:
    """The result as Markdown (what the task log prints and the record keeps)."""
    subjects = {c["sha"]: c["subject"] for c in result["commits"]}
    lines = [f"# Bisection {result['good']}..{result['bad']} ({', '.join(result['suites'])})", "",
             f"**{headline(result)}**", "", result["answer"]["reason"], ""]
    if result["answer"].get("skipped"):
        lines += ["Skipped (could not be checked out or launched): "
                  + ", ".join(f"{short_sha(c['sha'])} {c['subject']}" for c in result["answer"]["skipped"]), ""]
    lines += [f"{len(result['probes'])} probe(s), {result['runs']} training run(s) in {result['wall_s'] / 60:.1f} min "
              f"on {', '.join(result['nodes'])}; {early_aborts(result)}.", "",
              "| commit | subject | node | runs | outcome | followed metric: error at first breach | "
              "infrastructure attempts | report |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows(result):
        lines.append(f"| `{short_sha(r['sha'])}` | {subjects.get(r['sha'], '')} | {r.get('node', '')} "
                     f"| {r.get('runs', 0)} "
                     f"| {_outcome(r)} "
                     f"| {r.get('metric') or ''} {_error(r)} | {_attempts_cell(r).replace('|', '/')} "
                     f"| {_report_cell(r)} |")
    return "\n".join(lines) + "\n"


def plot(result: Mapping[str, Any]) -> bytes | None:
    """PNG: the followed metric's error (as a fraction of its threshold) of each probe across the range's
    commits, the threshold at 1, the culprit marked; None when no probe measured it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = result["commits"]
    index = {c["sha"]: i for i, c in enumerate(commits)}
    points = [(index[r["sha"]], r["fraction"], r["outcome"]) for r in result["probes"]
              if r.get("fraction") is not None and r["sha"] in index]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(commits) + 2), 3.6), dpi=110)
    for x, y, outcome in points:
        bad = "FAIL" in outcome
        ax.scatter([x], [y], color="#c0392b" if bad else "#27ae60", marker="x" if bad else "o", s=46, zorder=3)
    ax.axhline(1.0, color="#7f8c8d", linestyle="--", linewidth=1, label="threshold")
    culprit = result["answer"].get("culprit")
    if culprit and culprit["sha"] in index:
        ax.axvline(index[culprit["sha"]] - 0.5, color="#c0392b", linewidth=1,
                   label=f"culprit {short_sha(culprit['sha'])}")
    ax.set_xticks(range(len(commits)), [short_sha(c["sha"])[:7] for c in commits], rotation=60, fontsize=8)
    metric = next((r["metric"] for r in result["probes"] if r.get("metric")), "followed metric")
    ax.set_ylabel("|error| / threshold", fontsize=9)
    ax.set_title(f"{metric} across the range (good left, bad right)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def html_page(result: Mapping[str, Any], png: bytes | None) -> str:
    """The result page (self-contained; every shown value escaped)."""
    e = html.escape
    subjects = {c["sha"]: c["subject"] for c in result["commits"]}
    culprit = result["answer"].get("culprit")
    tone = "#c0392b" if culprit else "#7f6000"
    body = [f"<h1>Bisection {e(result['good'])}..{e(result['bad'])} ({e(', '.join(result['suites']))})</h1>",
            f'<p style="font-size:1.25em;color:{tone}"><b>{e(headline(result))}</b></p>',
            f"<p>{e(result['answer']['reason'])}</p>"]
    if result["answer"].get("skipped"):
        body.append("<p>Skipped (could not be checked out or launched): " + e(", ".join(
            f"{short_sha(c['sha'])} {c['subject']}" for c in result["answer"]["skipped"])) + "</p>")
    body.append(f"<p>{len(result['probes'])} probe(s), {result['runs']} training run(s) in "
                f"{result['wall_s'] / 60:.1f} min on {e(', '.join(result['nodes']))}; {e(early_aborts(result))}.</p>")
    if png:
        body.append(f'<img alt="followed metric across the range" style="max-width:100%" '
                    f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    body.append('<div style="overflow-x:auto"><table><thead><tr><th>commit</th><th>subject</th><th>node</th>'
                "<th>runs</th><th>outcome</th><th>followed metric: error at first breach</th>"
                "<th>infrastructure attempts</th><th>report</th></tr></thead><tbody>")
    for r in rows(result):
        link = (f'<a href="{e(r["report"])}">report</a>' if r.get("report") and r.get("runs") else
                e(_report_cell(r)) + (f' (<a href="{e(r["run_page"])}">run</a>)' if r.get("run_page") else ""))
        body.append(f"<tr><td><code>{e(short_sha(r['sha']))}</code></td><td>{e(subjects.get(r['sha'], ''))}</td>"
                    f"<td>{e(str(r.get('node', '')))}</td><td>{int(r.get('runs') or 0)}</td>"
                    f"<td>{e(_outcome(r))}</td><td>{e(str(r.get('metric') or ''))} {e(_error(r))}</td>"
                    f"<td>{e(_attempts_cell(r))}</td><td>{link}</td></tr>")
    body.append("</tbody></table></div>")
    style = ("body{font-family:system-ui,sans-serif;margin:1.2em;max-width:1400px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Bisection</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def write(run_dir: Path, result: Mapping[str, Any]) -> dict[str, Path]:
    """Write bisection.md, bisection.html (also as report.html: the run's report tab shows it too) and, when a
    probe measured the followed metric, bisection.png into ``run_dir``."""
    png = plot(result)
    page = html_page(result, png)
    out = {"md": write_atomic(run_dir / REPORT_MD, markdown(result)),
           "html": write_atomic(run_dir / REPORT_HTML, page), "report": write_atomic(run_dir / "report.html", page)}
    if png:
        out["png"] = write_atomic(run_dir / PLOT, png)
    return out
