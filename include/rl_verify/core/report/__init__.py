"""report.json / report.md / report.html for one or more suites (runbook section 4): ``write_report`` writes all
three; the modules of this package hold what a report says (``content``), its words (``words``) and its two
formats (``markdown``, ``html_page``).

Order of the human-readable reports: overall PASS/FAIL, abnormal findings (always at the top, so
they are seen first), then per suite: verdict, metric table (baseline vs current vs error vs
threshold per eval point/step, pass/fail, where each number comes from), plots; then tracker and
log paths, the commit under test, and the suggested next steps (marked as inference).

report.json is strict JSON (non-finite floats as the strings "NaN"/"Infinity"/"-Infinity", see
``rl_verify.core.model``). It always has an overall "verdict" and a "suites" list; with exactly one
suite it also carries that suite's keys at the top level (suite, checks, trackers, abnormal,
next_steps, ...), which is what the CLI report is read by.

No sentence is left empty: a section with nothing to say (no abnormal finding, no tracker, no next
step) is left out, and the commit line is written only when there is a commit or ``commit_hint``.
Steps are the tracker's own numbers; the table says which step its values come from (the eval
point, or the worst step of a step-by-step metric) and, separately, the first breaching step.

The HTML is self-contained (PNGs embedded as base64 data URIs) and every string that can come
from a tracker or a path is passed through ``html.escape``. All files are written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl_verify.core.files import write_atomic
from rl_verify.core.model import SuiteResult
from rl_verify.core.report.content import (INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, SCHEMA, ReportMeta, build_report,
                                           decision, deciding_suites, environment_line, file_rows, overall_verdict,
                                           suite_outcome,
                                           suites_summary, verification_verdict)
from rl_verify.core.report.html_page import confirmation_html, estimates_html, render_html
from rl_verify.core.report.markdown import confirmation_lines, estimates_lines, render_markdown
from rl_verify.core.report.words import (RULE_IN_WORDS, estimates_sentence, fmt_number, plot_caption, styles_of,
                                         text_table)

__all__ = ["INCONCLUSIVE", "NOT_REPRODUCED", "REPRODUCED", "RULE_IN_WORDS", "SCHEMA", "ReportMeta", "atomic_write",
           "build_report", "confirmation_html", "confirmation_lines", "deciding_suites", "decision", "environment_line",
           "estimates_html", "estimates_lines", "estimates_sentence", "file_rows", "fmt_number", "overall_verdict",
           "plot_caption", "render_html", "render_markdown", "styles_of", "suite_outcome", "suites_summary",
           "text_table", "verification_verdict", "write_report"]


def atomic_write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; a failed write leaves neither half a file nor a temp file."""
    return write_atomic(Path(path), text)


def write_report(out_dir: Path, suites: list[SuiteResult], meta: ReportMeta | None = None,
                 shown_as: str | None = None, root: tuple[Path, str] | None = None) -> dict[str, Path]:
    """Write report.json, report.md and report.html into ``out_dir`` (PNGs are already there).

    ``shown_as``: where a reader finds ``out_dir`` (the record's location when ``out_dir`` is a task's
    working copy): every path into ``out_dir`` the report names is shown there instead. ``root``: (the working
    copy ``out_dir`` lies in, where a reader finds it): paths into its other folders are shown there too (a
    repeat's report names its suite's golden table in the first run's folder).
    Returns {"json": path, "md": path, "html": path}.
    """
    out_dir = Path(out_dir)
    meta = meta or ReportMeta()
    data = build_report(suites, meta, out_dir)
    moves = [(out_dir, shown_as)] if shown_as is not None else []
    moves += [(Path(root[0]), root[1])] if root is not None else []

    def shown(text: str) -> str:
        for folder, where in moves:  # out_dir first: it lies inside root
            for form in dict.fromkeys((str(folder.resolve()), str(folder))):
                text = text.replace(form, where)
        return text

    return {
        "json": atomic_write(out_dir / "report.json", shown(json.dumps(data, indent=2, allow_nan=False) + "\n")),
        "md": atomic_write(out_dir / "report.md", shown(render_markdown(suites, meta, out_dir))),
        "html": atomic_write(out_dir / "report.html", shown(render_html(suites, meta))),
    }
