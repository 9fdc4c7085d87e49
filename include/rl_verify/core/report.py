"""report.json / report.md / report.html for one or more suites (runbook section 4).

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

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from rl_verify.core import numbers
from rl_verify.core.files import write_atomic
from rl_verify.core.model import FAIL, PASS, Check, SuiteResult, strict_json_value
from rl_verify.core.spread import DRIFT_WORDS

#: report.json's schema: 2 added each suite's ``outcome`` over its runs (README: "report.json").
SCHEMA = 2
#: The outcomes of a repeated suite (``rl_verify.core.confirm``) a verdict can take beside PASS/FAIL.
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "FAIL (reproduced)", "PASS (not reproduced)", "INCONCLUSIVE"


@dataclass
class ReportMeta:
    """Run-level facts for the report: the commit under test (full SHA, what was asked for, the diff stat of
    a dirty worktree), the DAG run and node(s), per suite the tracker and log paths (role -> path),
    notes (approval, rejection, schedule gaps) and an ``overall`` verdict that overrides the suites'
    (``REJECTED``, ``NOT APPROVED``)."""

    commit: str | None = None
    commit_ref: str | None = None
    diff_stat: str | None = None
    dag_run_id: str | None = None
    node: str | None = None
    paths: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    overall: str | None = None
    #: What to say when ``commit`` is None, in the reader's terms (a CLI flag, or the failed task).
    commit_hint: str | None = None
    #: suite -> the baseline version it was judged against, as one line (``baselines.describe``).
    baselines: dict[str, str] = field(default_factory=dict)
    #: suite -> its outcome over its runs (``confirm_<suite>``'s outcome.json; each run's ``report`` a link).
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The local copy of the run's record the report is written from: a path under it is a record file.
    record_dir: str | None = None
    #: Where a person finds the record (a folder, or the object store's URL), said once above the files table.
    record_location: str | None = None
    #: The UI plugin's route serving the record's files (``<files_url>/<path in the record>``); None: no link.
    files_url: str | None = None


def overall_verdict(suites: list[SuiteResult]) -> str:
    """PASS only when at least one suite ran and every suite passed."""
    if not suites:
        return FAIL
    return PASS if all(s.verdict == PASS for s in suites) else FAIL


def suite_outcome(suite: SuiteResult, outcomes: dict[str, dict[str, Any]]) -> str:
    """A suite's verdict over its runs: its outcome when it has one, else its (only) run's verdict."""
    return (outcomes.get(suite.suite) or {}).get("outcome") or suite.verdict


def verification_verdict(suites: list[SuiteResult], outcomes: dict[str, dict[str, Any]]) -> str:
    """FAIL when a suite FAILs (reproduced, or at once), else INCONCLUSIVE when one is, else PASS (a
    suite whose FAIL was not reproduced passes)."""
    if not suites:
        return FAIL
    said = [suite_outcome(s, outcomes) for s in suites]
    if any(v in (FAIL, REPRODUCED) for v in said):
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in said else PASS


def _rel(path: str, out_dir: Path | None) -> str:
    """``path`` relative to ``out_dir`` when it lies inside it (links that survive moving the folder)."""
    if out_dir is None:
        return path
    try:
        return str(Path(path).resolve().relative_to(out_dir.resolve()))
    except ValueError:
        return path


def build_report(suites: list[SuiteResult], meta: ReportMeta, out_dir: Path | None = None) -> dict[str, Any]:
    """The report.json content (strict-JSON-ready)."""
    computed = verification_verdict(suites, meta.outcomes)
    abnormal = [f"[{s.suite}] {a}" for s in suites for a in s.abnormal]
    if not suites:
        abnormal.insert(0, "No suite was evaluated.")
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "verdict": meta.overall or computed,
        "computed_verdict": computed,
        "first_run_verdict": overall_verdict(suites),
        "commit": meta.commit,
        "commit_ref": meta.commit_ref,
        "diff_stat": meta.diff_stat,
        "dag_run_id": meta.dag_run_id,
        "node": meta.node,
        "baselines": dict(meta.baselines),
        "notes": list(meta.notes),
        "paths": meta.paths,
        "record": meta.record_location,
        "files": file_rows(suites, meta),
        "abnormal": abnormal,
        "next_steps": [s for r in suites for s in r.next_steps],
        "nan_encoding": "non-finite numbers are written as the strings 'NaN', 'Infinity', '-Infinity'",
        "suites": [],
    }
    for suite in suites:
        entry = suite.to_dict()
        entry["plots_relative"] = [_rel(p, out_dir) for p in suite.plots]
        entry["outcome"] = meta.outcomes.get(suite.suite) or _single_run_outcome(suite)
        data["suites"].append(entry)
    if len(suites) == 1:
        single = data["suites"][0]
        for key in ("suite", "failure_class", "checks", "trackers", "plots", "plots_relative", "checker", "details"):
            data[key] = single[key]
        data["suite_verdict"] = single["verdict"]
        data["abnormal"] = list(single["abnormal"])
        data["next_steps"] = list(single["next_steps"])
    return strict_json_value(data)


# ----------------------------------------------------------------------------- formatting helpers

def fmt_number(value: float | None) -> str:
    """Compact display of a measurement; None -> "-" (no value), NaN/Infinity spelled out."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:.6g}"
    return str(value)


def fmt_result(check: Check) -> str:
    if check.missing:
        return "missing"
    return {True: "pass", False: "FAIL", None: "n/a"}[check.passed]


def fmt_threshold(check: Check) -> str:
    if check.threshold is None:
        return "-"
    return f"{check.operator} {fmt_number(check.threshold)}"


def fmt_step(check: Check) -> str:
    return "all steps" if check.step is None else str(check.step)


def fmt_first_breach(check: Check) -> str:
    return "-" if check.first_breach_step is None or not check.breached else str(check.first_breach_step)


def _single_run_outcome(suite: SuiteResult) -> dict[str, Any]:
    """The outcome of a suite that has no confirmation record (the CLI, a run before the confirmation)."""
    return {"suite": suite.suite, "outcome": suite.verdict, "reason": "one run, its runbook verdict", "runs": [
        {"attempt": 0, "verdict": suite.verdict, "failure_class": suite.failure_class}]}


def suites_summary(suites: list[SuiteResult], outcomes: dict[str, dict[str, Any]] | None = None) -> str:
    """"grpo FAIL (accuracy), opd PASS": each suite's verdict with its failure class; a repeated suite says
    its outcome and its runs' verdicts ("opd PASS (not reproduced): run 1 FAIL (accuracy), run 2 PASS")."""
    parts = []
    for s in suites:
        outcome = (outcomes or {}).get(s.suite) or {}
        runs = outcome.get("runs") or []
        if len(runs) > 1:
            said = ", ".join(f"run {r['attempt'] + 1} {r.get('verdict') or '?'}"
                             + (f" ({r['failure_class']})" if r.get("failure_class") else "") for r in runs)
            parts.append(f"{s.suite} {outcome['outcome']}: {said}")
        else:
            parts.append(f"{s.suite} {outcome.get('outcome') or s.verdict}"
                         + (f" ({s.failure_class})" if s.failure_class else ""))
    return ", ".join(parts)


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "< 0.1%" if 0 < value < 0.001 else f"{value:.1%}"


#: The confirmation rule in words a reader without statistics follows (its formula is the outcome's ``rule``).
RULE_IN_WORDS = ("Training is noisy: a healthy commit sometimes misses a threshold by chance. So a FAIL that noise "
                 "could explain is not believed at once: the suite is trained again at the same commit with new seeds. "
                 "The FAIL stands only if the new runs, taken together, still miss the baseline by far more than "
                 "run-to-run noise explains; it is cleared when a new run ends close enough to the baseline. A NaN, "
                 "a crash, a wrong step count or a miss no noise produces is a FAIL at once, without repeating.")


def deciding_suites(suites: list[SuiteResult], outcomes: dict[str, dict[str, Any]]) -> list[SuiteResult]:
    """The suites whose outcome is not a PASS (FAIL, reproduced or at once, and INCONCLUSIVE): what the
    decision is about."""
    return [s for s in suites if suite_outcome(s, outcomes) not in (PASS, NOT_REPRODUCED)]


def breached_metrics(suite: SuiteResult) -> list[dict[str, Any]]:
    """One entry per breached metric of a suite: ``metric``, ``steps`` (where it was outside, in the tracker's
    steps), ``worst`` (its largest error and threshold, as the table shows them) and ``shape``."""
    styles = styles_of(suite.checks) if suite.checks else {}
    out: dict[str, dict[str, Any]] = {}
    for check in suite.checks:
        if not check.breached:
            continue
        entry = out.setdefault(check.metric, {"metric": check.metric, "steps": [], "worst": None, "ratio": -1.0,
                                              "shape": check.shape_text})
        said = check.breach_steps or (str(check.step) if check.step is not None else
                                      (str(check.first_breach_step) if check.first_breach_step is not None else ""))
        if said and said not in entry["steps"]:
            entry["steps"].append(said)
        ratio = _ratio(check.error, check.threshold)
        if ratio > entry["ratio"]:
            st = styles[check.metric]
            entry["ratio"] = ratio
            entry["worst"] = (f"error {st.error(check.error, check.baseline, check.current)} vs "
                              f"{st.threshold(check.operator, check.threshold)}"
                              + (f" at step {check.step}" if check.step is not None else ""))
    return [{**e, "steps": ", ".join(e["steps"]) or "-"} for e in out.values()]


def _ratio(error: float | None, threshold: float | None) -> float:
    if error is None or threshold in (None, 0) or not isinstance(error, (int, float)) or math.isnan(error):
        return math.inf if isinstance(error, float) and math.isnan(error) else 0.0
    return abs(float(error)) / abs(float(threshold))


def first_step_parts(step: str) -> tuple[str, str]:
    """A next step split into what to do and why ("first, suspect X. Why: ..." -> ("suspect X", "...")), the
    "Inference:" prefix dropped; a step without a stated reason gives ("the step", "")."""
    text = step.removeprefix("Inference: ").removeprefix("first, ")
    action, sep, why = text.partition(". Why: ")
    return (action, why.rstrip(".")) if sep else (text, "")


def decision(suites: list[SuiteResult], meta: ReportMeta) -> list[dict[str, Any]]:
    """Per deciding suite: its ``outcome``, the ``reason`` it has it, its first next step (``action`` and
    ``why``) and its breached metrics: what the top of a FAIL report says, in this order."""
    out = []
    for s in deciding_suites(suites, meta.outcomes):
        outcome = meta.outcomes.get(s.suite) or {}
        action, why = first_step_parts(s.next_steps[0]) if s.next_steps else ("", "")
        out.append({"suite": s.suite, "outcome": suite_outcome(s, meta.outcomes), "failure_class": s.failure_class,
                    "reason": outcome.get("reason") if len(outcome.get("runs") or []) > 1 else "",
                    "action": action, "why": why, "breached": breached_metrics(s),
                    "missing": sorted({c.metric for c in s.checks if c.missing})})
    return out


def _short_commit(meta: ReportMeta) -> str:
    """The commit in one line: "sim/regress-teacher at 1a2b3c4d5e6f (baseline opd v1)"."""
    said = (f"{meta.commit_ref} at " if meta.commit_ref else "") + (meta.commit or meta.commit_hint or "unresolved")
    versions = "; ".join(f"{k}: {v}" for k, v in meta.baselines.items())
    return said + (f" (baselines {versions})" if versions else "")


def estimates_sentence(est: dict[str, Any]) -> str:
    """What the check tells apart, said once per baseline version and rule: these figures are the version's
    (its spread and judged points) and the rule's, the same in every report against that version."""
    return (f"Error rates of this check against this baseline version (the same in every verification against it "
            f"with this rule; they do not depend on this run; estimated: {est.get('simulated')}; spread: "
            f"{est.get('spread')}): one healthy run FAILs the runbook's thresholds "
            f"{_pct(est.get('single_run_false_alarm'))} of the time; after confirmation a healthy verification FAILs "
            f"{_pct(est.get('false_alarm'))} of the time, ends INCONCLUSIVE {_pct(est.get('inconclusive'))}, and "
            f"takes {est.get('mean_runs', 0):.2f} runs on average.")


def confirmation_lines(outcome: dict[str, Any]) -> list[str]:
    """How sure a suite's verdict is, in Markdown lines: the outcome and the rule that decided it, every
    run with its own runbook verdict and report, and what the check can tell apart."""
    lines = [f"**{outcome['outcome']}**: {outcome.get('reason', '')}", ""]
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
    return lines + spread_sentences(outcome) + ([""] if outcome.get("spread") else [])


def spread_sentences(outcome: dict[str, Any]) -> list[str]:
    """The spread the rule decided with, in sentences (plain text, for Markdown and HTML alike): the drift
    alarm first, then its sources and, per metric, its sigma against the prior's."""
    learned = outcome.get("spread") or {}
    if not learned:
        return []
    out = [f"{DRIFT_WORDS}: {'; '.join(learned['drift'])}."] if learned.get("drift") else []
    per_metric = "; ".join(
        f"{m} {fmt_number(v['sigma'])}" + (f" ({v['moved']:.2f}x the prior's {fmt_number(v['prior_sigma'])}"
                                           f"{', df ' + format(v['df'], 'g') if v.get('df') is not None else ''})"
                                           if v.get("moved") is not None else "")
        for m, v in (learned.get("metrics") or {}).items())
    sources = "; ".join(learned.get("sources") or [])
    out.append(f"The spread that decided (run-to-run sigma per metric, pooled): {sources}. Per metric: {per_metric}.")
    return out


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
            lines.append(f"| {metric} | {_in_units(m['sigma'], m['threshold'])} | "
                         f"{numbers.threshold_number(m['threshold'], False)} | {_pct(m['healthy_breach'])} | "
                         f"{_in_units(m['min_detectable_shift'], m['threshold'])} |")
        lines.append("")
    elif est.get("note"):
        lines += [f"Error rates: {est['note']}.", ""]
    return lines


def _md_cell(text: str) -> str:
    """Markdown table cell: no pipes or newlines from tracker strings can break the table."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def _in_units(value: float | None, threshold: float | None) -> str:
    """A spread or a shift of a metric with the digits its errors are shown with (``numbers.decimals_at``
    of its threshold), so that the confirmation's table reads like the metric's own table."""
    if value is None:
        return "-"
    return f"{float(value):.{numbers.decimals_at(threshold)}f}"


def styles_of(checks: Sequence[Check]) -> dict[str, numbers.Style]:
    """One number style per metric (``rl_verify.core.numbers``): every row of a metric shows the same digits."""
    out: dict[str, numbers.Style] = {}
    for metric in dict.fromkeys(c.metric for c in checks):
        rows = [c for c in checks if c.metric == metric]
        judged = next((c for c in rows if c.threshold is not None), rows[0])
        out[metric] = numbers.style(metric, judged.method, judged.threshold, [c.baseline for c in rows])
    return out


def _check_cells(check: Check, styles: dict[str, numbers.Style] | None = None) -> list[str]:
    st = (styles or {}).get(check.metric) or styles_of([check])[check.metric]
    note = check.note + (f"; shape: {check.shape_text}" if check.shape_text else "")
    return [check.metric, fmt_step(check), fmt_first_breach(check), st.value(check.baseline),
            st.value(check.current), st.error(check.error, check.baseline, check.current),
            st.threshold(check.operator, check.threshold), check.method, fmt_result(check), check.source, note]


HEADERS = ["metric", "values at step (eval point, or worst step)", "first breach at step", "baseline", "current",
           "error", "threshold", "method", "result", "source", "note"]
RESULT_COLUMN = HEADERS.index("result")
#: Columns of words that may wrap anywhere (the others are numbers and short words, kept on one line).
TEXT_COLUMNS = {HEADERS.index("metric"), HEADERS.index("note")}


def _sources_line(suite: SuiteResult) -> str | None:
    """Where the table's numbers come from; None when no tracker was read (nothing to say). The files
    themselves are in the report's files table: one place for every path."""
    if not suite.trackers:
        return None
    names = ", ".join(_ROLE_NAMES.get(role, role) for role in suite.trackers)
    return (f"Measurements: every baseline/current number comes from the {names} (see Files; line numbers in the "
            "note column)."
            + (" The e2e wall time is the launch-to-end duration given by the caller (in a DAG run: the job's "
               "start and end on the node)."
               if any(c.metric == "e2e wall time" for c in suite.checks) else ""))


def _checker_line(suite: SuiteResult) -> str | None:
    """The checker's own words, with its step numbers translated into the tracker's."""
    if suite.checker is None:
        return None
    reason = f" (reason: {suite.checker['reason']})" if suite.checker.get("reason") else ""
    line = (f"Checker (checkout's check_rl_result): ok={suite.checker.get('ok')}{reason}: "
            f"{suite.checker.get('message', '')}")
    translations = suite.details.get("checker_step_translations") or []
    if translations:
        line += " [in tracker steps: " + "; ".join(translations) + "]"
    return line


# ----------------------------------------------------------------------------- Markdown

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
            lines += [f"| {_md_cell(b['metric'])} | {_md_cell(b['steps'])} | {_md_cell(b['worst'] or '-')} |"
                      for b in d["breached"]] + [""]
        lines += [f"Not measured: {', '.join(d['missing'])}", ""] if d["missing"] else []
    if meta.commit or meta.commit_hint:
        lines += [f"**Commit**: `{_short_commit(meta)}`", ""]
    abnormal = [f"[{s.suite}] {a}" for s in suites for a in s.abnormal]
    if abnormal:
        lines += ["## Abnormal findings", ""] + [f"- {a}" for a in abnormal] + [""]
    for note in meta.notes:
        lines.append(f"> {note}")
    if meta.notes:
        lines.append("")
    for suite in suites:
        if suite.suite in meta.outcomes:
            lines += [f"## {suite.suite}: its runs", ""] + confirmation_lines(meta.outcomes[suite.suite])
    for suite in suites:
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
                lines.append(f"| {_md_cell(f['suite'])} | {_md_cell(f['what'])} | {_md_cell(where)} | "
                             + (f"`{_md_cell(f['node'])}`" if f["node"] else "-") + " |")
            lines.append("")
    commit = _commit_items(meta)
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


#: What each path role of ``ReportMeta.paths`` and ``SuiteResult.trackers`` names, in the files table.
_ROLE_NAMES = {"current": "current tracker", "baseline": "baseline tracker", "golden": "golden table"}


def file_rows(suites: list[SuiteResult], meta: ReportMeta) -> list[dict[str, Any]]:
    """The report's files, one row per file: ``suite``, ``what``, ``record`` (its path in the run's record,
    or None), ``node`` (the path it was fetched from on the node, or None) and ``package`` (a file of the
    installed package, such as the shipped golden table, or None). Files of the record are named by their
    path inside it, never by a task's working copy, which is gone when the task ends."""
    root = Path(meta.record_dir).resolve() if meta.record_dir else None

    def in_record(path: str) -> str | None:
        if root is None:
            return None
        try:
            return Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            return None

    rows: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(suite: str, what: str, path: str | None = None, node: str | None = None) -> None:
        rel = in_record(path) if path else None
        key = rel or path or node or ""
        if key in seen:
            return
        seen.add(key)
        rows.append({"suite": suite, "what": what, "record": rel, "node": node,
                     "package": path if path and rel is None else None})

    for suite in suites:
        paths = meta.paths.get(suite.suite, {})
        if "archived tracker" in paths or "remote tracker" in paths:
            add(suite.suite, "current tracker", paths.get("archived tracker"), paths.get("remote tracker"))
        for role, path in paths.items():
            if role.startswith("archived log "):
                name = role.removeprefix("archived log ")
                add(suite.suite, f"log {name}", path, paths.get(f"remote log {name}"))
            elif role.startswith("remote log ") and f"archived log {role.removeprefix('remote log ')}" not in paths:
                add(suite.suite, f"log {role.removeprefix('remote log ')}", None, path)
        for role, path in suite.trackers.items():
            add(suite.suite, _ROLE_NAMES.get(role, role), path)
        if suite.checker:
            for key, what in (("step_summary", "checker step summary"), ("stdout", "checker stdout"),
                              ("stderr", "checker stderr")):
                if suite.checker.get(key):
                    add(suite.suite, what, str(suite.checker[key]))
    for suite_name, paths in meta.paths.items():  # suites without a result (an earlier task failed)
        if suite_name not in {s.suite for s in suites}:
            for role, path in paths.items():
                add(suite_name, role, None if role.startswith("remote") else path,
                    path if role.startswith("remote") else None)
    return rows


def _commit_items(meta: ReportMeta) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    if meta.commit:
        items.append(("commit", meta.commit))
    elif meta.commit_hint:
        items.append(("commit hint", meta.commit_hint))
    for label, value in (("requested ref", meta.commit_ref), ("diff stat", meta.diff_stat),
                         ("DAG run", meta.dag_run_id), ("node", meta.node)):
        if value:
            items.append((label, value))
    items += [(f"baseline {suite}", label) for suite, label in meta.baselines.items()]
    return items


def _suite_markdown(suite: SuiteResult, out_dir: Path | None) -> list[str]:
    lines = [f"## {suite.suite}: {suite.verdict}" + (f" ({suite.failure_class})" if suite.failure_class else ""), ""]
    checker = _checker_line(suite)
    if checker:
        lines += [_md_cell(checker), ""]
    if suite.checks:
        styles = styles_of(suite.checks)
        lines.append("| " + " | ".join(HEADERS) + " |")
        lines.append("|" + "---|" * len(HEADERS))
        for check in suite.checks:
            lines.append("| " + " | ".join(_md_cell(c) for c in _check_cells(check, styles)) + " |")
        lines.append("")
    sources = _sources_line(suite)
    if sources:
        lines += [sources, ""]
    for plot in suite.plots:
        rel = _rel(plot, out_dir)
        lines += [f"![{Path(plot).name}]({rel})", f"*{plot_caption(plot)}*", ""]
    if suite.plots:
        lines.append("")
    return lines


# ----------------------------------------------------------------------------- HTML

def confirmation_html(outcome: dict[str, Any]) -> list[str]:
    """:func:`confirmation_lines` as escaped HTML (each run's report a link in the same frame)."""
    e = html.escape
    out = [f"<p><b>{e(outcome['outcome'])}</b>: {e(outcome.get('reason', ''))}</p>"]
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
            out.append(f"<tr><td>{e(metric)}</td><td>{e(_in_units(m['sigma'], m['threshold']))}</td>"
                       f"<td>{e(numbers.threshold_number(m['threshold'], False))}</td>"
                       f"<td>{e(_pct(m['healthy_breach']))}</td>"
                       f"<td>{e(_in_units(m['min_detectable_shift'], m['threshold']))}</td></tr>")
        out.append("</table></div>")
    elif est.get("note"):
        out.append(f"<p>Error rates: {e(est['note'])}.</p>")
    return out


def plot_caption(path: str) -> str:
    """What a plot shows: the checker's own figure (GRPO's check_rl_result draws one) is said to be that,
    so a second set of curves is not mistaken for another run."""
    name = Path(path).name
    if "/checker/" in path.replace("\\", "/"):
        return (f"The checkout's check_rl_result's own plot ({name}): the same baseline and current trackers, "
                "drawn by the checker")
    return f"Baseline (reference) and current per metric, with the threshold band shaded where judged ({name})"


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
    checker = _checker_line(suite)
    if checker:
        out.append(f"<p>{e(checker)}</p>")
    if suite.checks:
        styles = styles_of(suite.checks)
        out.append("<div class=\"wide\"><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
        for check in suite.checks:
            cells = _check_cells(check, styles)
            out.append("<tr>" + "".join(
                f"<td class=\"n {e(cell)}\">{e(cell)}</td>" if i == RESULT_COLUMN else
                f"<td class=\"{'t' if i in TEXT_COLUMNS else 'n'}\">{e(cell)}</td>"
                for i, cell in enumerate(cells)) + "</tr>")
        out.append("</table></div>")
    sources = _sources_line(suite)
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
        out.append(f"<p><b>Commit</b>: <code>{e(_short_commit(meta))}</code></p>")
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
    commit = _commit_items(meta)
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


# ----------------------------------------------------------------------------- writing

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


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain text columns (two spaces apart); None and "" show as ``-`` (the CLI's tables)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
