"""report.html: the self-contained page (PNGs inlined, every tracker or path string escaped) that reads top-down
as a decision; what the Airflow UI's report tab shows."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from rl_verify.core import numbers
from rl_verify.core.model import FAIL, PASS, SHORTCUTS, SuiteResult
from rl_verify.core.report.content import (INCONCLUSIVE, ReportMeta, commit_items, decision, file_rows, short_commit,
                                           suite_outcome, suites_summary, verification_verdict)
from rl_verify.core.report.words import (HEADERS, RESULT_COLUMN, RULE_IN_WORDS, TEXT_COLUMNS, UNCHANGED_COVERS,
                                         check_cells, evidence_lines,
                                         checker_line, estimates_sentence, in_units, pct, plot_caption, sources_line,
                                         attempt_lines, spread_sentences, styles_of)
from rl_verify.core.spread import DRIFT_WORDS


def confirmation_html(outcome: dict[str, Any]) -> list[str]:
    """:func:`confirmation_lines` as escaped HTML (each run's report a link in the same frame)."""
    e = html.escape
    out = [f"<p><b>{e(outcome['outcome'])}</b>: {e(outcome.get('reason', ''))}</p>"]
    unchanged = outcome.get("unchanged")
    if unchanged:
        link = f' (<a href="{e(unchanged["report"])}">its report</a>)' if unchanged.get("report") else ""
        files = unchanged.get("files") or []
        out += [f"<p>Verified PASS: <code>{e(unchanged['sha'])}</code>{link}, run "
                f"<code>{e(unchanged.get('run_id') or '-')}</code>.</p>",
                f"<p>Files changed since ({len(files)}): "
                + (", ".join(f"<code>{e(f)}</code>" for f in files) or "none") + "</p>"]
        out += [f"<p>{e(line)}</p>" for line in evidence_lines(unchanged, lambda text: text) if line]
        out += [f"<p>{e(UNCHANGED_COVERS)}</p>"]
    found = outcome.get("bitwise")
    if found:
        ref = found.get("reference") or {}
        link = f' (<a href="{e(ref["report"])}">its report</a>)' if ref.get("report") else ""
        out += [f"<p>Reference: <code>{e(ref.get('sha') or '-')}</code>{link}, run "
                f"<code>{e(ref.get('run_id') or '-')}</code>, {e(ref.get('self_check') or 'self-checked')}; "
                f"environment <code>{e(str(found.get('environment')))}</code>.</p>",
                "<table><tr><th>step</th><th>metrics compared</th><th>bits</th></tr>"
                + "".join(f"<tr><td>{e(str(c['step']))}</td><td>{e(str(c['metrics']))}</td><td>identical</td></tr>"
                          for c in found.get("compared") or []) + "</table>",
                f"<p>{e(str(found.get('steps_seen')))} of {e(str(found.get('steps')))} deterministic steps identical"
                + (f", in {found['seconds']:.0f} s" if found.get("seconds") is not None else "") + ".</p>",
                f"<p>{e(found.get('covers') or '')}</p>"]
    runs = outcome.get("runs") or []
    if runs:
        out.append("<div class=\"wide\"><table><tr><th>run</th>"
                   "<th>seed</th><th>runbook verdict</th><th>steps</th><th>report</th></tr>")
        for r in runs:
            verdict = (r.get("verdict") or "-") + (f" ({r['failure_class']})" if r.get("failure_class") else "")
            steps = f"{r['steps']} of {r['expected_steps']}" if r.get("steps") is not None else "-"
            link = f'<a href="{e(r["report"])}">report</a>' if r.get("report") else "-"
            seed = r.get("seed") if r.get("seed") is not None else "node default"
            css = "FAIL" if r.get("verdict") == FAIL else "pass"
            out.append(f"<tr><td>{r['attempt'] + 1}{' (first)' if r['attempt'] == 0 else ' (repeat)'}</td>"
                       f"<td>{e(str(seed))}</td><td class=\"{css}\">{e(verdict)}</td><td>{e(steps)}</td>"
                       f"<td>{link}</td></tr>")
        out.append("</table></div>")
    for line in attempt_lines(runs):
        out.append(f"<p class=\"attempts\">{e(line)}</p>")
    for sentence in spread_sentences(outcome):
        css = " class=\"abn\"" if sentence.startswith(DRIFT_WORDS) else ""
        out.append(f"<p{css}>{e(sentence)}</p>")
    return out


def estimates_html(outcome: dict[str, Any]) -> list[str]:
    """:func:`estimates_lines` as escaped HTML."""
    e = html.escape
    out: list[str] = []
    est = outcome.get("estimates") or {}
    if est.get("metrics"):
        out.append(f"<p>{e(estimates_sentence(est))}</p>")
        out.append("<div class=\"wide\"><table><tr><th>metric</th>"
                   "<th>run-to-run sigma</th><th>threshold</th><th>a healthy run "
                   "breaches it</th><th>smallest shift detected with 90% probability</th></tr>")
        for metric, m in est["metrics"].items():
            out.append(f"<tr><td>{e(metric)}</td><td>{e(in_units(m['sigma'], m['threshold']))}</td>"
                       f"<td>{e(numbers.threshold_number(m['threshold'], False))}</td>"
                       f"<td>{e(pct(m['healthy_breach']))}</td>"
                       f"<td>{e(in_units(m['min_detectable_shift'], m['threshold']))}</td></tr>")
        out.append("</table></div>")
    elif est.get("note"):
        out.append(f"<p>Error rates: {e(est['note'])}.</p>")
    return out


def _data_uri(path: str) -> str | None:
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


def _suite_html(suite: SuiteResult) -> list[str]:
    """One suite's section: its runbook verdict, checker line, metric table, sources and plots."""
    e = html.escape
    out = [f"<h3>{e(suite.suite)}: <span class=\"{e(suite.verdict)}\">{e(suite.verdict)}</span>"
           f"{e(f' ({suite.failure_class})' if suite.failure_class else '')}</h3>"]
    checker = checker_line(suite)
    if checker:
        out.append(f"<p>{e(checker)}</p>")
    if suite.checks:
        styles = styles_of(suite.checks)
        out.append("<div class=\"wide\"><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
        for check in suite.checks:
            cells = check_cells(check, styles)
            out.append("<tr>" + "".join(
                f"<td class=\"n {e(cell)}\">{e(cell)}</td>" if i == RESULT_COLUMN else
                f"<td class=\"{'t' if i in TEXT_COLUMNS else 'n'}\">{e(cell)}</td>"
                for i, cell in enumerate(cells)) + "</tr>")
        out.append("</table></div>")
    sources = sources_line(suite)
    if sources:
        out.append(f"<p>{e(sources)}</p>")
    for plot in suite.plots:
        uri = _data_uri(plot)
        if uri:
            out.append(f"<figure><img alt=\"{e(Path(plot).name)}\" src=\"{uri}\">"
                       f"<figcaption>{e(plot_caption(plot))}</figcaption></figure>")
        else:
            out.append(f"<p>plot missing: {e(plot)}</p>")
    return out


def _decision_html(items: list[dict[str, Any]]) -> list[str]:
    """The top of a report that is not a PASS: per deciding suite its next step with the reason, then its
    breached metrics with their steps."""
    e = html.escape
    out = ['<div class="decision">']
    for d in items:
        cls = f" ({d['failure_class']})" if d["failure_class"] else ""
        out.append(f"<h2 id=\"next-{e(d['suite'])}\">{e(d['suite'])}: {e(d['outcome'])}{e(cls)}</h2>")
        if d["action"]:
            out.append(f"<p class=\"next\"><b>Next step</b> (inference): {e(d['action'])}</p>")
            if d["why"]:
                out.append(f"<p class=\"why\"><b>Why</b>: {e(d['why'])}</p>")
        if d["reason"]:
            out.append(f"<p class=\"why\"><b>Over its runs</b>: {e(d['reason'])}</p>")
        if d["breached"]:
            out.append('<div class="wide"><table class="breached"><tr><th>breached metric</th><th>outside at step(s)'
                       "</th><th>worst</th></tr>")
            out += [f"<tr><td class=\"t\"><b>{e(b['metric'])}</b></td><td class=\"t\">{e(b['steps'])}</td>"
                    f"<td class=\"t\">{e(b['worst'] or '-')}</td></tr>" for b in d["breached"]]
            out.append("</table></div>")
        if d["missing"]:
            out.append(f"<p>Not measured: {e(', '.join(d['missing']))}</p>")
    out.append("</div>")
    return out


def render_html(suites: list[SuiteResult], meta: ReportMeta | None = None) -> str:
    """Self-contained HTML report: PNGs inlined, every tracker/path string escaped.

    It reads top-down as a decision (issue 35): the verdict and the suites that decide it; for a report that
    is not a PASS, each such suite's next step with its reason and its breached metrics with their steps; the
    commit; then the abnormal findings and notes; then the details, runbook order (metric tables, plots,
    files, commit, every next step), the statistics in a collapsible section and the rule stated once. A
    PASS report shows its verdict, commit and notes; its tables are one click away."""
    meta = meta or ReportMeta()
    e = html.escape
    computed = verification_verdict(suites, meta.outcomes)
    verdict = meta.overall or computed
    color = {PASS: "#1a7f37", INCONCLUSIVE: "#9a6700"}.get(verdict, "#cf222e")
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
           f"<title>RL accuracy verification: {e(verdict)}</title>",
           # Wide tables fit the frame Airflow gives the report tab (about 1064 px at a 1280 px window):
           # cells wrap anywhere rather than push the table past the page, and a table that still cannot
           # fit scrolls inside its own box (div.wide) instead of being cut off.
           "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
           # Numbers never break mid-digit (td.n); names, notes and paths (td.t) break anywhere.
           "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}"
           "td.n{white-space:nowrap}td.t,td code{overflow-wrap:anywhere}"
           ".wide{max-width:100%;overflow-x:auto}.wide table{width:100%}"
           ".FAIL{color:#cf222e;font-weight:bold}"
           ".pass{color:#1a7f37}.abn{background:#fff3cd;padding:.5em}img{max-width:100%}"
           "h1{margin:.2em 0 .3em}.decision h2{font-size:1.15em;margin:.8em 0 .2em}.decision p{margin:.25em 0}"
           ".decision table.breached{width:auto;font-size:13px}p.next{font-size:1.05em}"
           "details{margin:.6em 0}summary{cursor:pointer;font-weight:bold}</style></head><body>",
           f"<h1>RL accuracy verification: <span style=\"color:{color}\">{e(verdict)}</span></h1>"]
    summary = suites_summary(suites, meta.outcomes) or "no suite evaluated"
    out.append(f"<p><b>{e(verdict)}</b>{e(f' (computed {computed})' if verdict != computed else '')}: {e(summary)}</p>")
    items = decision(suites, meta) if verdict not in (PASS, "REJECTED", "NOT APPROVED") else []
    out += _decision_html(items) if items else []
    if meta.commit or meta.commit_hint:
        out.append(f"<p><b>Commit</b>: <code>{e(short_commit(meta))}</code></p>")
    abnormal = [f"[{s.suite}] {a}" for s in suites for a in s.abnormal]
    if abnormal:
        out.append("<div class=\"abn\"><h2>Abnormal findings</h2><ul>")
        out += [f"<li>{e(a)}</li>" for a in abnormal]
        out.append("</ul></div>")
    for note in meta.notes:
        out.append(f"<blockquote>{e(note)}</blockquote>")
    deciding = {d["suite"] for d in items}
    if suites:
        out.append("<h2>Metrics</h2>")
    for suite in suites:
        runs = confirmation_html(meta.outcomes[suite.suite]) if suite.suite in meta.outcomes else []
        body = runs + _suite_html(suite)
        if suite.suite in deciding:
            out += body
        elif suite_outcome(suite, meta.outcomes) in SHORTCUTS:  # no full run, no table: what it rests on, in sight
            out.append(f"<h3>{e(suite.suite)}: {e(suite_outcome(suite, meta.outcomes))}, no full training</h3>")
            out += runs
        else:  # a passing suite: one line, its table one click away
            out.append(f"<details><summary>{e(suite.suite)}: {e(suite_outcome(suite, meta.outcomes))} (its runs, "
                       "table and plots)</summary>")
            out += body
            out.append("</details>")
    stats = [(s.suite, estimates_html(meta.outcomes[s.suite])) for s in suites if s.suite in meta.outcomes]
    rules = list(dict.fromkeys(meta.outcomes[s.suite].get("rule") for s in suites
                               if s.suite in meta.outcomes and meta.outcomes[s.suite].get("rule")))
    if any(body for _, body in stats) or rules:
        out.append("<details class=\"stats\"><summary>How sure: the rule and its error rates</summary>")
        out.append(f"<p><b>The rule</b>: {e(RULE_IN_WORDS)}</p>")
        for rule in rules:
            out.append(f"<details><summary>details: the rule's formula</summary><p>Pre-registered: {e(rule)}.</p>"
                       "</details>")
        for name, body in stats:
            if body:
                out.append(f"<h3>{e(name)}</h3>")
                out += body
        out.append("</details>")
    files = file_rows(suites, meta)
    if files or meta.record_location:
        out.append("<details><summary>Files: the record, trackers and logs</summary>")
        if meta.record_location:
            folder = (f'<a href="{e(meta.files_url)}">record folder</a>' if meta.files_url else "record folder")
            out.append(f"<p>{folder} (every file of the run, with its sha256 in manifest.json): "
                       f"<code>{e(meta.record_location)}</code></p>")
        if files:
            out.append('<div class="wide"><table><tr><th>suite</th><th>file</th><th>in the record</th>'
                       "<th>on the node</th></tr>")
            for f in files:
                if f["record"]:
                    name = f"<code>{e(f['record'])}</code>"
                    cell = f'<a href="{e(meta.files_url + "/" + f["record"])}">{name}</a>' if meta.files_url else name
                elif f["package"]:
                    cell = f"package: <code>{e(f['package'])}</code>"
                else:
                    cell = "-"
                node = f"<code>{e(f['node'])}</code>" if f["node"] else "-"
                out.append(f"<tr><td>{e(f['suite'])}</td><td class=\"t\">{e(f['what'])}</td><td class=\"t\">{cell}</td>"
                           f"<td class=\"t\">{node}</td></tr>")
            out.append("</table></div>")
        out.append("</details>")
    commit = commit_items(meta)
    if commit:
        out.append("<h2>Commit under test</h2><ul>")
        for label, value in commit:
            if label == "diff stat":
                out.append(f"<li>worktree was dirty; diff stat:<pre>{e(value)}</pre></li>")
            elif label == "commit hint":
                out.append(f"<li>commit: {e(value)}</li>")
            else:
                out.append(f"<li>{e(label)}: <code>{e(value)}</code></li>")
        out.append("</ul>")
    steps = [f"[{suite.suite}] {step}" for suite in suites for step in suite.next_steps
             if suite.suite in deciding or not items]
    if steps:
        out.append("<h2>Suggested next steps (inference, not measurement)</h2><ul>")
        out += [f"<li>{e(step)}</li>" for step in steps]
        out.append("</ul>")
    out.append("</body></html>")
    return "\n".join(out)
