"""What a report says, whatever its format: the run-level facts (``ReportMeta``), the verdicts over suites
and runs, report.json's content, the decision at the top of a report that is not a PASS, and the files table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rl_verify.core.model import FAIL, PASS, SHORTCUTS, SuiteResult, strict_json_value
from rl_verify.core.report.words import ROLE_NAMES, styles_of


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
    #: node -> its environment as check_prerequisites saw it (gpu, gpu_count, driver, cuda, packages) and its
    #: ``fingerprint`` (issue 33): what a deterministic run's bits depend on beyond the checkout.
    environment: dict[str, dict[str, Any]] = field(default_factory=dict)


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


def rel_path(path: str, out_dir: Path | None) -> str:
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
        "environment": dict(meta.environment),
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
        entry["plots_relative"] = [rel_path(p, out_dir) for p in suite.plots]
        entry["outcome"] = meta.outcomes.get(suite.suite) or single_run_outcome(suite)
        data["suites"].append(entry)
    if len(suites) == 1:
        single = data["suites"][0]
        for key in ("suite", "failure_class", "checks", "trackers", "plots", "plots_relative", "checker", "details"):
            data[key] = single[key]
        data["suite_verdict"] = single["verdict"]
        data["abnormal"] = list(single["abnormal"])
        data["next_steps"] = list(single["next_steps"])
    return strict_json_value(data)


def single_run_outcome(suite: SuiteResult) -> dict[str, Any]:
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


def deciding_suites(suites: list[SuiteResult], outcomes: dict[str, dict[str, Any]]) -> list[SuiteResult]:
    """The suites whose outcome is not a PASS (FAIL, reproduced or at once, and INCONCLUSIVE): what the
    decision is about."""
    return [s for s in suites if suite_outcome(s, outcomes) not in (PASS, NOT_REPRODUCED, *SHORTCUTS)]


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


def short_commit(meta: ReportMeta) -> str:
    """The commit in one line: "sim/regress-teacher at 1a2b3c4d5e6f (baseline opd v1)"."""
    said = (f"{meta.commit_ref} at " if meta.commit_ref else "") + (meta.commit or meta.commit_hint or "unresolved")
    versions = "; ".join(f"{k}: {v}" for k, v in meta.baselines.items())
    return said + (f" (baselines {versions})" if versions else "")


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
            add(suite.suite, ROLE_NAMES.get(role, role), path)
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


def commit_items(meta: ReportMeta) -> list[tuple[str, str]]:
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
    items += [(f"environment {node}", environment_line(env)) for node, env in meta.environment.items()]
    return items


def environment_line(env: Mapping[str, Any]) -> str:
    """One node's environment in one line: "NVIDIA H200 x8, driver 580.159.04, CUDA 13.0, torch 2.8.0, sglang
    -, ... (fingerprint 0123abcd...)"; "-" for what the node could not say."""
    gpu = f"{env.get('gpu') or '-'} x{env.get('gpu_count') or 0}"
    packages = ", ".join(f"{name} {version or '-'}" for name, version in (env.get("packages") or {}).items())
    return (f"{gpu}, driver {env.get('driver') or '-'}, CUDA {env.get('cuda') or '-'}"
            + (f", {packages}" if packages else "") + f" (fingerprint {env.get('fingerprint') or '-'})")
