"""The verification run's report and verdict (the ``report`` and ``verdict`` tasks): the suites combined into
one report in the record store (each repeated run's own report too), who approved, the verdict's one line,
the run's note and the verdict notification.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from rl_verify import settings
from rl_verify.core import confirm, numbers
from rl_verify.core.model import UNCHANGED, SuiteResult
from rl_verify.core.report import (ReportMeta, render_markdown, suite_outcome, verification_verdict,
                                   write_report)
from rl_verify.node import placement, remote
from rl_verify.orchestration import airflow_api, bitwise_lane, links, notify
from rl_verify.orchestration.confirmation import OUTCOME_FILE
from rl_verify.orchestration.contract import Decision, ReportSummary
from rl_verify.orchestration.notify import suite_line, suite_summary, verdict_message
from rl_verify.orchestration.verification import CLEANUP_FILE, ENVIRONMENT_FILE, shortcut_notes
from rl_verify.store import record

log = logging.getLogger(__name__)


def report(dag_run_id: str, params: Mapping[str, Any], decision: Decision | None,
           gaps: list[str] | None = None) -> ReportSummary:
    """Combine the suites into one report in the record store, with the manifest of the whole record;
    print it; return a summary."""
    with record.workspace(dag_run_id) as run_dir:
        return _report_in(run_dir, dag_run_id, params, decision, gaps)


def _report_in(run_dir: Path, dag_run_id: str, params: Mapping[str, Any], decision: Decision | None,
               gaps: list[str] | None) -> ReportSummary:
    resolved = record.read_json(run_dir / "commit.json") or {}
    suites = resolved.get("suites") or _safe_suites(params)
    notes: list[str] = []
    overall = None
    decision = approval_decision(decision)
    decision["at"] = numbers.utc(decision["at"]) if decision["at"] else decision["at"]  # "2026-12-02 02:04:56 UTC"
    if decision["timed_out"]:
        overall = "NOT APPROVED"
        notes.append(f"NOT APPROVED (timed out): nobody answered the experiment card by {decision['at']}; "
                     "nothing was launched and the node was not touched.")
    elif decision["rejected"]:
        overall = "REJECTED"
        notes.append(f"Rejected by {decision['by']} at {decision['at']}: nothing was launched.")
    elif decision["not_needed"]:
        notes.append("No approval was asked: every suite is unchanged since its verified PASS, so nothing was "
                     "launched.")
    elif decision["by"]:
        notes.append(f"Approved by {decision['by']} at {decision['at']}"
                     + (f" (standing approval granted in scheduled run {decision['granted_in']}, verified against "
                        "its approval record)" if decision["standing"] else "")
                     + (f" (pre-approved as a probe of bisection {decision['bisection']}, verified against its "
                        "approval record)" if decision.get("bisection") else "") + ".")
    notes += gaps or []
    gpus = (record.read_json(run_dir / CLEANUP_FILE) or {}).get("gpus") or []
    notes += [f"Node after cleanup: {line}" for line in gpus]
    results = []
    outcomes: dict[str, dict[str, Any]] = {}
    for suite in suites if overall is None else []:
        data = record.relocate(record.read_json(run_dir / suite / "result.json"), run_dir)
        results.append(SuiteResult.from_dict(data) if data else SuiteResult.infrastructure(
            suite, "the suite did not reach comparison (an earlier task failed: see its log)"))
        outcome = record.read_json(run_dir / suite / OUTCOME_FILE)
        if outcome:
            outcomes[suite] = _with_run_reports(run_dir, dag_run_id, outcome)
    if not resolved:
        notes.append("The commit could not be resolved on the node (see resolve_commit's log).")
    notes += shortcut_notes(resolved) + bitwise_lane.report_notes(run_dir, suites)
    if resolved.get("sha") and overall is None:
        link = links.report_view_path(settings.verification_dag_of(dag_run_id), dag_run_id)
        try:
            notes += bitwise_lane.promote(dag_run_id, outcomes, resolved["sha"], link)
        except Exception as err:  # a reference not kept only costs the next run its lane
            log.warning("Could not keep the bitwise reference(s): %s: %s", type(err).__name__, err)
        try:
            notes += bitwise_lane.mark_blind(dag_run_id, outcomes, resolved["sha"], link)
        except Exception as err:  # a later run still reads the FAIL of this commit from the record
            log.warning("Could not mark the bitwise reference(s) blind: %s: %s", type(err).__name__, err)
    paths = {s: _paths(run_dir / s, run_dir) for s in suites}
    nodes = resolved.get("suite_nodes")
    meta = ReportMeta(commit=resolved.get("sha"), commit_ref=resolved.get("commit_ref") or params.get("commit"),
                      diff_stat=resolved.get("dirty_stat"), dag_run_id=dag_run_id,
                      node=placement.describe(nodes) if nodes else resolved.get("node") or params.get("node"),
                      paths=paths, notes=notes, overall=overall,
                      baselines={s: v["label"] for s, v in (resolved.get("baselines") or {}).items()},
                      outcomes=outcomes, environment=record.read_json(run_dir / ENVIRONMENT_FILE) or {})
    where = record.location(dag_run_id)
    meta.record_dir, meta.record_location = str(run_dir), where
    meta.files_url = links.files_path(settings.DAG_ID, dag_run_id)
    _write_run_reports(run_dir, results, outcomes, meta, where)
    written = write_report(run_dir, results, meta, shown_as=where)
    record.write_manifest(run_dir, shown_as=where)
    shown = render_markdown(results, meta).replace(str(run_dir), where)
    log.info("Report written to %s\n\n%s", where, shown)
    verdict = overall or verification_verdict(results, outcomes)
    failing = [r for r in results if suite_outcome(r, outcomes) in confirm.FAILING]
    classes = sorted({r.failure_class for r in failing if r.failure_class})
    return {"verdict": verdict, "failure_classes": classes, "record": where,
            "report": {k: f"{where}/{Path(v).name}" for k, v in written.items()},
            "failed_suites": [r.suite for r in failing],
            "suites": [suite_summary(r, outcomes.get(r.suite)) for r in results], "gpus": gpus}


def _with_run_reports(run_dir: Path, dag_run_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """``outcome`` with each run's report link (the UI plugin's route) when the suite ran more than once."""
    runs = outcome.get("runs") or []
    if len(runs) < 2:
        return outcome
    dag_id = settings.verification_dag_of(dag_run_id)
    return {**outcome, "runs": [{**r, "report": links.run_report_path(dag_id, dag_run_id, r["folder"])} for r in runs]}


def _write_run_reports(run_dir: Path, results: list[SuiteResult], outcomes: Mapping[str, dict[str, Any]],
                       meta: ReportMeta, where: str) -> None:
    """Each run of a repeated suite keeps its own report, by the runbook's thresholds, in its record folder."""
    by_suite = {r.suite: r for r in results}
    for suite, outcome in outcomes.items():
        runs = outcome.get("runs") or []
        if len(runs) < 2:
            continue
        for r in runs:
            folder = run_dir / r["folder"]
            data = record.relocate(record.read_json(folder / "result.json"), run_dir)
            result = SuiteResult.from_dict(data) if data else by_suite[suite]
            seed = r["seed"] if r.get("seed") is not None else "node default"
            note = (f"Run {r['attempt'] + 1} of {len(runs)} of {suite} (seed {seed}), judged by the runbook's "
                    f"thresholds. The verification's outcome for {suite}: {outcome['outcome']}: {outcome['reason']}")
            one = ReportMeta(commit=meta.commit, commit_ref=meta.commit_ref, diff_stat=meta.diff_stat,
                             dag_run_id=meta.dag_run_id, node=meta.node, paths={suite: _paths(folder, run_dir)},
                             notes=[note], baselines={k: v for k, v in meta.baselines.items() if k == suite},
                             record_dir=meta.record_dir, record_location=where, files_url=meta.files_url)
            write_report(folder, [result], one, shown_as=f"{where}/{r['folder']}", root=(run_dir, where))


def _safe_suites(params: Mapping[str, Any]) -> list[str]:
    try:
        return remote.validate_suites(params.get("suites"))
    except remote.BadInput:
        return []


def _paths(suite_dir: Path, run_dir: Path) -> dict[str, str]:
    meta = record.relocate(record.read_json(suite_dir / "fetch.json"), run_dir) or {}
    files = meta.get("files", {})
    out = {}
    if files.get("tracker"):
        out["remote tracker"] = files["tracker"]["remote"]
        out["archived tracker"] = files["tracker"]["local"]
    for log_file in files.get("logs", []):
        # Keyed by the archived copy's name (the node's stdout.log is archived as job_stdout.log): the
        # report's files table pairs a record file with the node path it came from by that name.
        out[f"remote log {Path(log_file['local']).name}"] = log_file["remote"]
        out[f"archived log {Path(log_file['local']).name}"] = log_file["local"]
    return out


def approval_decision(decision: Decision | None) -> dict[str, Any]:
    """Who approved or rejected, when, whether by standing approval (and granted in which run) or
    whether nobody answered in time (from approve's XCom)."""
    if not decision:
        return {"rejected": False, "timed_out": False, "by": None, "at": None, "standing": False, "granted_in": None,
                "bisection": None, "not_needed": False}
    return {"rejected": "Reject" in (decision.get("chosen_options") or []),
            "timed_out": bool(decision.get("timed_out")), "by": decision.get("by"), "at": decision.get("at"),
            "standing": bool(decision.get("standing")), "granted_in": decision.get("granted_in"),
            "bisection": decision.get("bisection"), "not_needed": bool(decision.get("not_needed"))}


def verdict(summary: ReportSummary | None, dag_run_id: str = "") -> str:
    """Fail the DAG run when the verdict is FAIL (after the report exists), in one line with the report's link."""
    if not summary:
        raise RuntimeError("no report was written (see the report task's log): the verdict is unknown")
    if summary["verdict"] in ("REJECTED", "NOT APPROVED"):
        raise AirflowSkipException(f"{summary['verdict']}: nothing was launched")
    view = links.absolute(links.ui_base_url(),
                          links.report_view_path(settings.verification_dag_of(dag_run_id), dag_run_id))
    said = [f"{s['suite']} {s['outcome']} ({s['runs']} runs)" if s.get("runs", 1) else
            f"{s['suite']} {s['outcome']}, " + ("no training" if s["outcome"] == UNCHANGED else "no full training")
            for s in summary.get("suites") or [] if s.get("runs", 1) != 1]
    if summary["verdict"] == "FAIL":
        line = verdict_message(summary, view)
    else:
        line = f"{summary['verdict']}" + (f": {'; '.join(said)}" if said else "") + f"; report: {view}"
    # The verdict is the log's first line (issue 35): the notification and the run's note log after it.
    if summary["verdict"] == "FAIL":  # a reproduced FAIL, a FAIL noise cannot produce, or infrastructure
        step = _first_next_step(dag_run_id)
        log.error("%s", line + (f"\n  next step: {step} (inference)" if step else "") + f"\n  report: {view}")
    elif summary["verdict"] == "INCONCLUSIVE":
        log.warning("%s", line)
    else:
        log.info("PASS: every suite of %s passes%s; report: %s",
                 ", ".join(s["suite"] for s in summary.get("suites") or []), f" ({'; '.join(said)})" if said else "",
                 view)
    _notify_verdict(summary, dag_run_id)
    _note_run(dag_run_id, run_note(summary, line, view))
    if summary["verdict"] == "FAIL":
        # Not retried: the verdict will not change. Airflow's traceback below is how it records the failure.
        raise AirflowFailException(line)
    return "INCONCLUSIVE" if summary["verdict"] == "INCONCLUSIVE" else "PASS"


#: About what the run's header shows of its note at a 1280 px window before it cuts the line off.
NOTE_FITS = 100


def run_note(summary: ReportSummary, line: str, view: str) -> str:
    """The run's note (shown in its header, cut off at about :data:`NOTE_FITS` characters): the verdict line
    when it fits; a FAIL naming more than fits says its first breach and how many more ("+2 more"), so what
    shows is whole. The report follows as a Markdown link (the run's Verification report tab shows it too)."""
    said = line.replace(f"; report: {view}", "")
    if summary.get("verdict") == "FAIL" and len(said) > NOTE_FITS:
        failed = [s for s in summary.get("suites") or [] if s.get("outcome", s["verdict"]) in confirm.FAILING]
        breaches = [(s["suite"], b) for s in failed for b in s.get("breached") or []]
        if breaches:
            suite, first = breaches[0]
            short = suite_line({"suite": suite, "breached": [first]})
            classes = " + ".join(summary.get("failure_classes") or ["unknown"])
            more = len(breaches) - 1 + sum(1 for s in failed if not s.get("breached"))
            said = f"FAIL ({classes}): {short}" + (f" (+{more} more)" if more else "")
    return f"{said} ([report]({view}))"


def _note_run(dag_run_id: str, note: str) -> None:
    """The verdict line as the DAG run's note (through the REST API; the Task SDK cannot write notes)."""
    try:
        airflow_api.set_run_note(settings.AIRFLOW_API_CONN_ID, settings.verification_dag_of(dag_run_id), dag_run_id,
                                 note)
    except Exception as err:  # the verdict task's own message says the same
        log.warning("Could not set the run's note through %r (%s): the verdict is in this log and the report",
                    settings.AIRFLOW_API_CONN_ID, err)


def _first_next_step(dag_run_id: str, report: Mapping[str, Any] | None = None) -> str | None:
    """The first suggested next step of the first failing suite of the run's report (None: none)."""
    report = report if report is not None else (record.get_json(dag_run_id, "report.json") or {})
    failing = [s for s in report.get("suites") or [] if s.get("next_steps")
               and (s.get("outcome") or {}).get("outcome", s.get("verdict")) in confirm.FAILING]
    return failing[0]["next_steps"][0].removeprefix("Inference: ") if failing else None


def _notify_verdict(summary: ReportSummary, dag_run_id: str) -> None:
    """Post the verdict with the commit and the first suggested next step of a failing suite."""
    report = record.get_json(dag_run_id, "report.json") or {}
    commit = f"{report.get('commit_ref') or '?'} ({(report.get('commit') or '')[:10] or 'unresolved'})"
    step = _first_next_step(dag_run_id, report)
    notify.send(*notify.verdict(summary, commit, dag_run_id, step), failure=summary["verdict"] != "PASS")
