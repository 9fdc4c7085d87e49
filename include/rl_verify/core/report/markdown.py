"""report.md: the report in Markdown (also what a task log prints), in the order the package docstring gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_verify.core import numbers
from rl_verify.core.model import PASS, SHORTCUTS, SuiteResult
from rl_verify.core.report.content import (ReportMeta, commit_items, decision, file_rows, rel_path, short_commit,
                                           suites_summary, verification_verdict)
from rl_verify.core.report.words import (HEADERS, RULE_IN_WORDS, UNCHANGED_COVERS, bitwise_lines, check_cells,
                                         evidence_lines,
                                         checker_line,
                                         estimates_sentence, in_units, md_cell, pct, plot_caption, sources_line,
                                         attempt_lines, spread_sentences, styles_of)


def confirmation_lines(outcome: dict[str, Any]) -> list[str]:
    """How sure a suite's verdict is, in Markdown lines: the outcome and the rule that decided it, every
    run with its own runbook verdict and report, and what the check can tell apart."""
    lines = [f"**{outcome['outcome']}**: {outcome.get('reason', '')}", ""]
    unchanged = outcome.get("unchanged")
    if unchanged:
        link = f" ([its report]({unchanged['report']}))" if unchanged.get("report") else ""
        files = unchanged.get("files") or []
        lines += [f"Verified PASS: `{unchanged['sha']}`{link}, run `{unchanged.get('run_id') or '-'}`.", "",
                  f"Files changed since ({len(files)}): " + (", ".join(f"`{md_cell(f)}`" for f in files) or "none"),
                  ""] + evidence_lines(unchanged, md_cell) + [UNCHANGED_COVERS, ""]
    lines += bitwise_lines(outcome.get("bitwise"))
    runs = outcome.get("runs") or []
    if runs:
        lines += ["| run | seed | runbook verdict | steps | report |", "|---|---|---|---|---|"]
        for r in runs:
            verdict = (r.get("verdict") or "-") + (f" ({r['failure_class']})" if r.get("failure_class") else "")
            steps = f"{r['steps']} of {r['expected_steps']}" if r.get("steps") is not None else "-"
            link = f"[report]({r['report']})" if r.get("report") else "-"
            lines.append(f"| {r['attempt'] + 1}{' (first)' if r['attempt'] == 0 else ' (repeat)'} | "
                         f"{r.get('seed') if r.get('seed') is not None else 'node default'} | {verdict} | {steps} | "
                         f"{link} |")
        lines.append("")
    said = attempt_lines(runs)
    lines += [*(f"- {line}" for line in said), *([""] if said else [])]
    return lines + spread_sentences(outcome) + ([""] if outcome.get("spread") else [])


def estimates_lines(outcome: dict[str, Any]) -> list[str]:
    """The error rates of the suite's check, in Markdown: the same for every verification against the same
    baseline version with the same rule (they do not depend on this run)."""
    lines: list[str] = []
    est = outcome.get("estimates") or {}
    if est.get("metrics"):
        lines += [estimates_sentence(est), "",
                  "| metric | run-to-run sigma | threshold | a healthy run breaches it | smallest shift detected "
                  "with 90% probability |", "|---|---|---|---|---|"]
        for metric, m in est["metrics"].items():
            lines.append(f"| {metric} | {in_units(m['sigma'], m['threshold'])} | "
                         f"{numbers.threshold_number(m['threshold'], False)} | {pct(m['healthy_breach'])} | "
                         f"{in_units(m['min_detectable_shift'], m['threshold'])} |")
        lines.append("")
    elif est.get("note"):
        lines += [f"Error rates: {est['note']}.", ""]
    return lines


def render_markdown(suites: list[SuiteResult], meta: ReportMeta | None = None, out_dir: Path | None = None) -> str:
    """The Markdown report (also suitable for printing to a task log)."""
    meta = meta or ReportMeta()
    computed = verification_verdict(suites, meta.outcomes)
    verdict = meta.overall or computed
    lines = [f"# RL accuracy verification: {verdict}", ""]
    summary = suites_summary(suites, meta.outcomes)
    lines.append(f"**{verdict}**" + (f" (computed {computed})" if verdict != computed else "")
                 + (f": {summary}" if summary else ": no suite evaluated"))
    lines.append("")
    items = decision(suites, meta) if verdict not in (PASS, "REJECTED", "NOT APPROVED") else []
    for d in items:  # the decision first (issue 35): next step with its reason, breached metrics, commit
        lines += [f"## {d['suite']}: {d['outcome']}" + (f" ({d['failure_class']})" if d["failure_class"] else ""), ""]
        if d["action"]:
            lines += [f"**Next step** (inference): {d['action']}", ""]
            lines += [f"**Why**: {d['why']}", ""] if d["why"] else []
        lines += [f"**Over its runs**: {d['reason']}", ""] if d["reason"] else []
        if d["breached"]:
            lines += ["| breached metric | outside at step(s) | worst |", "|---|---|---|"]
            lines += [f"| {md_cell(b['metric'])} | {md_cell(b['steps'])} | {md_cell(b['worst'] or '-')} |"
                      for b in d["breached"]] + [""]
        lines += [f"Not measured: {', '.join(d['missing'])}", ""] if d["missing"] else []
    if meta.commit or meta.commit_hint:
        lines += [f"**Commit**: `{short_commit(meta)}`", ""]
    abnormal = [f"[{s.suite}] {a}" for s in suites for a in s.abnormal]
    if abnormal:
        lines += ["## Abnormal findings", ""] + [f"- {a}" for a in abnormal] + [""]
    for note in meta.notes:
        lines.append(f"> {note}")
    if meta.notes:
        lines.append("")
    for suite in suites:
        if suite.suite in meta.outcomes:
            shortcut = meta.outcomes[suite.suite].get("outcome")
            lines += [f"## {suite.suite}: " + (f"{shortcut}, no full training" if shortcut in SHORTCUTS
                                                else "its runs"), ""]
            lines += confirmation_lines(meta.outcomes[suite.suite])
    for suite in suites:
        if (meta.outcomes.get(suite.suite) or {}).get("outcome") not in SHORTCUTS:  # no full run, no table
            lines += _suite_markdown(suite, out_dir)
    stats = [(s.suite, estimates_lines(meta.outcomes[s.suite])) for s in suites if s.suite in meta.outcomes]
    rules = list(dict.fromkeys(meta.outcomes[s.suite].get("rule") for s in suites
                               if s.suite in meta.outcomes and meta.outcomes[s.suite].get("rule")))
    if any(body for _, body in stats) or rules:
        lines += ["## How sure: the rule and its error rates", "", f"The rule: {RULE_IN_WORDS}", ""]
        lines += [f"Its formula (pre-registered): {rule}." for rule in rules] + ([""] if rules else [])
        for name, body in stats:
            lines += ([f"### {name}", ""] + body) if body else []
    files = file_rows(suites, meta)
    if files or meta.record_location:
        lines += ["## Files", ""]
        if meta.record_location:
            lines += [f"Record folder (every file of the run, with its sha256 in manifest.json): "
                      f"`{meta.record_location}`", ""]
        if files:
            lines += ["| suite | file | in the record | on the node |", "|---|---|---|---|"]
            for f in files:
                where = f"`{f['record']}`" if f["record"] else f"package: `{f['package']}`" if f["package"] else "-"
                lines.append(f"| {md_cell(f['suite'])} | {md_cell(f['what'])} | {md_cell(where)} | "
                             + (f"`{md_cell(f['node'])}`" if f["node"] else "-") + " |")
            lines.append("")
    commit = commit_items(meta)
    if commit:
        lines += ["## Commit under test", ""]
        for label, value in commit:
            if label == "diff stat":
                lines += ["- worktree was dirty; diff stat:", "", "```", value, "```"]
            else:
                lines.append(f"- {label}: `{value}`" if label != "commit hint" else f"- commit: {value}")
        lines.append("")
    steps = [f"[{suite.suite}] {step}" for suite in suites for step in suite.next_steps]
    if steps:
        lines += ["## Suggested next steps (inference, not measurement)", ""] + [f"- {s}" for s in steps] + [""]
    return "\n".join(lines)


def _suite_markdown(suite: SuiteResult, out_dir: Path | None) -> list[str]:
    lines = [f"## {suite.suite}: {suite.verdict}" + (f" ({suite.failure_class})" if suite.failure_class else ""), ""]
    checker = checker_line(suite)
    if checker:
        lines += [md_cell(checker), ""]
    if suite.checks:
        styles = styles_of(suite.checks)
        lines.append("| " + " | ".join(HEADERS) + " |")
        lines.append("|" + "---|" * len(HEADERS))
        for check in suite.checks:
            lines.append("| " + " | ".join(md_cell(c) for c in check_cells(check, styles)) + " |")
        lines.append("")
    sources = sources_line(suite)
    if sources:
        lines += [sources, ""]
    for plot in suite.plots:
        rel = rel_path(plot, out_dir)
        lines += [f"![{Path(plot).name}]({rel})", f"*{plot_caption(plot)}*", ""]
    if suite.plots:
        lines.append("")
    return lines
