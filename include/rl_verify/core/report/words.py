"""The report's words and numbers, shared by its Markdown and HTML: how a value, a threshold, a step, a rate
and a metric's row are written, the rule in words, the spread and error-rate sentences, and plot captions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_verify.core import numbers, retry
from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.spread import DRIFT_WORDS


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


def pct(value: float | None) -> str:
    if value is None:
        return "-"
    return "< 0.1%" if 0 < value < 0.001 else f"{value:.1%}"


#: The confirmation rule in words a reader without statistics follows (its formula is the outcome's ``rule``).
#: What a PASS (unchanged) covers and what it does not (a shortcut verdict says both).
UNCHANGED_COVERS = ("What this covers: every path of the checkout the suite's spec says can move its numbers is "
                    "the same as at the verified PASS, so the same training gives the same numbers. What it does "
                    "not cover: anything outside the checkout (the node's drivers and packages, the data and "
                    "models on its share); run with lane = full to train anyway.")
EVIDENCE_COVERS = ("What the executed-code evidence covers: every process of the reference's full run (trainer, "
                   "rollout workers) recorded the checkout lines it ran, and none of the changed lines is among them. "
                   "What it does not cover: a change whose effect comes through a line that did run (a changed value "
                   "read elsewhere), code that is not Python, and any process the evidence did not reach.")


def evidence_lines(unchanged: dict[str, Any], cell: Any) -> list[str]:
    """A PASS (unchanged) decided by executed-code evidence (issue 44): the changed lines, none of which ran, and
    what that covers; [] for a PASS (unchanged) of the path rules."""
    found = unchanged.get("evidence")
    if not found:
        return []
    lines = found.get("lines") or []
    return [f"Changed lines, none of which ran in any process of the reference's full run ({len(lines)}): "
            + (", ".join(cell(line) for line in lines[:40]) or "none") + (" ..." if len(lines) > 40 else ""),
            "", EVIDENCE_COVERS, ""]


RULE_IN_WORDS = ("Training is noisy: a healthy commit sometimes misses a threshold by chance. So a FAIL that noise "
                 "could explain is not believed at once: the suite is trained again at the same commit with new seeds. "
                 "The FAIL stands only if the new runs, taken together, still miss the baseline by far more than "
                 "run-to-run noise explains; it is cleared when a new run ends close enough to the baseline. A NaN, "
                 "a crash, a wrong step count or a miss no noise produces is a FAIL at once, without repeating.")


def estimates_sentence(est: dict[str, Any]) -> str:
    """What the check tells apart, said once per baseline version and rule: these figures are the version's
    (its spread and judged points) and the rule's, the same in every report against that version."""
    return (f"Error rates of this check against this baseline version (the same in every verification against it "
            f"with this rule; they do not depend on this run; estimated: {est.get('simulated')}; spread: "
            f"{est.get('spread')}): one healthy run FAILs the runbook's thresholds "
            f"{pct(est.get('single_run_false_alarm'))} of the time; after confirmation a healthy verification FAILs "
            f"{pct(est.get('false_alarm'))} of the time, ends INCONCLUSIVE {pct(est.get('inconclusive'))}, and "
            f"takes {est.get('mean_runs', 0):.2f} runs on average.")


def attempt_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Each run's attempts after infrastructure failures (issue 55), one line each, for the runs that had any:
    "Run 1, attempt 1 on rl_gpu_node (job grpo): infrastructure (transient): ...; tried again: ..."."""
    lines = []
    for r in runs:
        tried = r.get("attempts") or []
        if tried:
            run = f"Run {int(r.get('attempt') or 0) + 1}"
            lines += [f"{run}, {line}" for line in retry.describe(tried)]
    return lines


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
    persist = {m: v["correlation"] for m, v in (learned.get("metrics") or {}).items() if v.get("correlation")}
    if persist:
        out.append("The rule takes a run's noise as persisting from step to step (AR(1)): neighbouring judged points "
                   "correlate by " + ", ".join(f"{m} {rho:.2f}" for m, rho in persist.items()) + ". A metric's "
                   "points are summed over their own variance (correlated points count for less than their "
                   "number), and its degrees of freedom count effective points.")
    return out


def md_cell(text: str) -> str:
    """Markdown table cell: no pipes or newlines from tracker strings can break the table."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def in_units(value: float | None, threshold: float | None) -> str:
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


def check_cells(check: Check, styles: dict[str, numbers.Style] | None = None) -> list[str]:
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


#: What each path role of ``ReportMeta.paths`` and ``SuiteResult.trackers`` names, in the files table.
ROLE_NAMES = {"current": "current tracker", "baseline": "baseline tracker", "golden": "golden table"}


def sources_line(suite: SuiteResult) -> str | None:
    """Where the table's numbers come from; None when no tracker was read (nothing to say). The files
    themselves are in the report's files table: one place for every path."""
    if not suite.trackers:
        return None
    names = ", ".join(ROLE_NAMES.get(role, role) for role in suite.trackers)
    return (f"Measurements: every baseline/current number comes from the {names} (see Files; line numbers in the "
            "note column)."
            + (" The e2e wall time is the launch-to-end duration given by the caller (in a DAG run: the job's "
               "start and end on the node)."
               if any(c.metric == "e2e wall time" for c in suite.checks) else ""))


def checker_line(suite: SuiteResult) -> str | None:
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


def plot_caption(path: str) -> str:
    """What a plot shows: the checker's own figure (GRPO's check_rl_result draws one) is said to be that,
    so a second set of curves is not mistaken for another run."""
    name = Path(path).name
    if "/checker/" in path.replace("\\", "/"):
        return (f"The checkout's check_rl_result's own plot ({name}): the same baseline and current trackers, "
                "drawn by the checker")
    return f"Baseline (reference) and current per metric, with the threshold band shaded where judged ({name})"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain text columns (two spaces apart); None and "" show as ``-`` (the CLI's tables)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def bitwise_lines(found: dict[str, Any] | None) -> list[str]:
    """A PASS (bitwise)'s evidence in Markdown: the reference (commit, its report), k, the environment's
    fingerprint, every compared step with its metric count, the lane's wall time, and what it does not cover."""
    if not found:
        return []
    ref = found.get("reference") or {}
    link = f" ([its report]({ref['report']}))" if ref.get("report") else ""
    lines = [f"Reference: `{ref.get('sha') or '-'}`{link}, run `{ref.get('run_id') or '-'}`, "
             f"{ref.get('self_check') or 'self-checked'}; environment `{found.get('environment')}`, "
             f"key `{found.get('key')}`.", "",
             "| step | metrics compared | bits |", "|---|---|---|"]
    lines += [f"| {c['step']} | {c['metrics']} | identical |" for c in found.get("compared") or []]
    lines += ["", f"{found.get('steps_seen')} of {found.get('steps')} deterministic steps identical"
              + (f", in {found['seconds']:.0f} s" if found.get("seconds") is not None else "") + ".", ""]
    return lines + ([found["covers"], ""] if found.get("covers") else [])
