"""One training's fetch and comparison, tasks of the verification DAG (``fetch_<suite>``, ``compare_<suite>``
and their repeats'): its tracker, logs and baseline archived into the run's record, then judged by the suite's
engine; what the confirmation rule needs of the run is kept beside its result (``confirmation.POINTS_FILE``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from rl_verify import settings
from rl_verify.core import launch, retry
from rl_verify.core.errors import InputError
from rl_verify.core.live import aborted_result, describe_hit, full_aborted_checks, partial_plot
from rl_verify.core.model import BITWISE, SuiteResult, infrastructure_class
from rl_verify.core.tracker import read_tracker
from rl_verify.engines import engine_of, load_suite
from rl_verify.node import launcher as launchers
from rl_verify.node import ops as node
from rl_verify.node import remote
from rl_verify.orchestration import bitwise_lane, links
from rl_verify.orchestration.confirmation import POINTS_FILE
from rl_verify.orchestration.contract import Fetched, NodeFolders, Resolved
from rl_verify.orchestration.nodes import expanded_specs, node_settings, ssh_client, suite_node, version_files
from rl_verify.orchestration.notify import suite_line, suite_summary
from rl_verify.orchestration.training_job import ATTEMPTS_FILE, current_job
from rl_verify.store import baselines, record
from rl_verify.suites.spec import SuiteSpec

log = logging.getLogger(__name__)


def fetch(suite: str, resolved: Resolved, dag_run_id: str, attempt: int = 0) -> Fetched:
    """Archive the suite's tracker, logs, baseline and checker (``attempt`` > 0: of its repeat, into its
    own folder ``<suite>-r<k>``); fail on a wrong step count.

    The launch script's exit code is not trusted: the tracker's step-summary rows decide whether
    the run completed. What was fetched stays in the record even when this task fails.
    """
    if attempt == 0 and bitwise_lane.decided(dag_run_id, suite):
        raise AirflowSkipException(f"{suite}: {BITWISE}: the bitwise lane decided it, no full training to fetch")
    conn, folders = suite_node(resolved, suite)
    spec = expanded_specs([suite], node_settings(conn), folders["worktree"], resolved.get("baselines"))[0]
    name = settings.attempt_name(suite, attempt)
    with record.workspace(dag_run_id, parts=[name]) as run_dir:
        # The training's last attempt (issue 55): the earlier ones failed as infrastructure and are kept as attempts.
        tried = list(record.read_json(run_dir / name / ATTEMPTS_FILE) or [])
        return _fetch_into(run_dir / name, name, spec, conn, folders, tried)


def _fetch_into(dest: Path, suite: str, spec: SuiteSpec, conn: str, folders: NodeFolders,
                tried: list[dict[str, Any]]) -> Fetched:
    job = current_job(suite, tried)
    with ssh_client(conn) as client:
        meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest, job=job)
    meta["job"] = job
    meta["expected_steps"] = spec.expected_steps
    abort = record.read_json(dest / "abort.json") or {}
    hit = abort.get("log_rule") if abort.get("applied") and not abort.get("certain") else None
    # Stopped on a log rule: the short tracker is its consequence, not news. Ended by itself
    # after a rule matched: the line says why, the step count says how far it came.
    stopped_by_rule = bool(hit and not hit.get("at_exit"))
    if abort.get("applied") and abort.get("certain"):
        meta["early_abort"] = abort
    elif hit:
        happened = "the job ended after a log line" if hit.get("at_exit") else "stopped on a log rule"
        meta["problems"].append(f"{happened}: {describe_hit(hit)}")
    ended = meta.get("scheduler_end")
    if ended and launchers.end_class(ended) != launchers.end_class("CANCELLED ours"):
        # Slurm ended the job without its exit code (issue 45): the scheduler's words come first.
        meta["problems"].insert(0, f"Slurm ended job {meta.get('slurm_job_id') or '?'} before the training did: "
                                   f"{launchers.end_class(ended)} ({ended})")
    tracker = meta["files"].get("tracker")
    if not tracker and not stopped_by_rule:
        _explain_launch(meta, spec, hit)
    if tracker:
        try:
            meta["steps"] = read_tracker(tracker["local"], metrics=[]).steps
        except InputError as err:
            meta["problems"].append(f"tracker unreadable: {err}")
            meta["steps"] = 0
        if meta["steps"] != spec.expected_steps and "early_abort" in meta:
            log.info("%s was stopped early at step %d of %d (its FAIL was certain): partial tracker kept",
                     suite, meta["early_abort"]["step"], spec.expected_steps)
        elif meta["steps"] != spec.expected_steps and not stopped_by_rule:
            meta["problems"].append(f"wrong step count: the tracker has {meta['steps']} step-summary rows, "
                                    f"expected {spec.expected_steps} (launch script exit code "
                                    f"{meta.get('exit_code')}, not trusted)")
    if meta["other_experiments"]:
        log.warning("Several experiment folders in %s; using the newest, ignoring: %s",
                    meta["work_dir"], ", ".join(meta["other_experiments"]))
    if meta["problems"] and tried:  # every attempt, by name (issue 55): the report's finding says what each met
        meta["problems"].append(f"{len(tried)} attempt(s): " + " | ".join(retry.describe(tried)))
    record.write_json(dest / "fetch.json", meta)
    if meta["problems"]:
        # Not retried: the files on the node will not change by asking again.
        raise AirflowFailException(f"{suite}: " + "; ".join(meta["problems"]))
    return {"suite": suite, "steps": meta.get("steps"), "wall_time_s": meta.get("wall_time_s")}


def _explain_launch(meta: dict[str, Any], spec: SuiteSpec, hit: Mapping[str, Any] | None) -> None:
    """A launch that ended before its tracker: its own words (the trace's last command, the last lines it
    printed, a known cause's fix) go first in ``meta["problems"]``, where the report, the verdict and the
    notification read them."""
    logs = {Path(f["local"]).name: Path(f["local"]) for f in meta["files"].get("logs") or []}

    def text(name: str) -> str:
        path = logs.get(name)
        return path.read_text(errors="replace") if path and path.is_file() else ""

    said = launch.explain(text("job_stdout.log"), text("job_trace.log"),
                          [rule.model_dump() for rule in spec.log_rules])
    if said is None:
        return
    if hit and hit.get("line") and hit["line"] in said:
        # The exit rule quoted the same line: one finding, not two.
        meta["problems"] = [p for p in meta["problems"] if not p.startswith("the job ended after a log line")]
    meta["problems"].insert(0, f"the launch ended before any tracker (exit code {meta.get('exit_code')}): {said}")


def compare(suite: str, dag_run_id: str, attempt: int = 0) -> dict[str, Any]:
    """Run the engine on the archived files of the suite's run (``attempt`` > 0: of its repeat) and keep
    what the confirmation rule needs of it (``points.json``); an unusable fetch becomes an
    infrastructure FAIL."""
    name = settings.attempt_name(suite, attempt)
    parts = [name, "commit.json"] + ([f"{suite}/{baselines.RECORD_FOLDER}"] if attempt else [])
    with record.workspace(dag_run_id, parts=parts) as run_dir:
        return _compare_in(run_dir, suite, name, dag_run_id)


def verdict_lines(result: SuiteResult, report_link: str, name: str | None = None) -> list[str]:
    """What a failed ``compare_*`` task's log says first, before Airflow's traceback of the failure: the
    verdict and class, every breached metric with its steps, the first next step, the report's link.
    A person opening the task's log reads the diagnosis, not a crash."""
    summary = suite_summary(result)
    lines = [f"{name or result.suite}: {result.verdict}" + (f" ({result.failure_class})" if result.failure_class
                                                             else "")]
    for b in summary["breached"]:
        lines.append(f"  breached: {b['metric']} at step(s) {b.get('steps') or b.get('first_breach_step')}")
    if summary["missing"]:
        lines.append("  not measured: " + ", ".join(summary["missing"]))
    if summary["cause"]:
        lines.append(f"  cause: {summary['cause']}")
    if result.next_steps:
        lines.append(f"  next step: {result.next_steps[0].removeprefix('Inference: ')} (inference)")
    lines.append(f"  report: {report_link} (complete once the report task has run)")
    return lines


def _compare_in(run_dir: Path, suite: str, name: str | None = None, dag_run_id: str | None = None) -> dict[str, Any]:
    suite_dir = run_dir / (name or suite)
    version = version_files(run_dir / suite)  # the baseline version's files sit with the suite's first run
    meta = record.relocate(record.read_json(suite_dir / "fetch.json"), run_dir)
    out = suite_dir / "compare"
    spec = load_suite(suite)
    if meta is None:
        result = SuiteResult.infrastructure(suite, "nothing was fetched from the node (see fetch task log)")
    elif meta["problems"]:
        result = SuiteResult.infrastructure(suite, "; ".join(meta["problems"]),
                                            remote_work_dir=meta["work_dir"])
        ended = meta.get("scheduler_end")
        if ended and launchers.end_class(ended) != launchers.end_class("CANCELLED ours"):
            result.failure_class = infrastructure_class(launchers.end_class(ended))
            result.details["scheduler"] = {"job_id": meta.get("slurm_job_id"), "end": ended}
    elif meta.get("early_abort"):
        engine = engine_of(spec)
        result = aborted_result(suite, meta["early_abort"], engine.rules)
        data = engine.load_data(engine.data_in_use(spec, version))
        # The whole table (issue 35): every judged metric with its points up to the stop, judged or "not reached".
        abort = meta["early_abort"]
        result.checks = full_aborted_checks(result.checks, engine.partial_checks(spec, suite_dir, version),
                                            engine.judged_metrics(data), int(abort.get("step") or 0),
                                            abort.get("expected_steps"))
        png = partial_plot(suite, meta["early_abort"]["certain"], suite_dir / "tracker.jsonl",
                           suite_dir / settings.BASELINE_TRACKER_FILE,
                           lambda metric: engine.reference_points(data, metric), out)
        if png is not None:
            result.plots.append(str(png))
    else:
        commit = record.read_json(run_dir / "commit.json") or {}
        node_name = (commit.get("suite_nodes") or {}).get(suite, commit.get("node"))
        try:
            result = engine_of(spec).compare_archived(spec, suite_dir, out, meta, node_name, version)
        except InputError as err:
            result = SuiteResult.infrastructure(suite, f"cannot evaluate: {err}")
    if meta is not None:
        result.abnormal += fetch_findings(meta)
    watched = record.read_json(suite_dir / "abort.json")
    if watched and not watched.get("applied") and watched.get("certain"):
        why = "early_abort off" if watched.get("early_abort") is False else \
            "the job had ended before the live check read that step"
        result.abnormal.append(
            f"Live check: this run would have been aborted at step {watched['step']} of {watched['expected_steps']} "
            f"({why}): " + "; ".join(c["text"] for c in watched["certain"]))
    if watched and not watched.get("applied") and watched.get("log_rule"):
        hit = watched["log_rule"]
        result.abnormal.append(f"Live check: a log rule matched ({describe_hit(hit)}); early_abort was "
                               "off, so the run went on")
    record.write_json(suite_dir / "result.json", result.to_dict())
    points = engine_of(spec).run_points(spec, suite_dir, result, version)
    points.complete = not (meta or {}).get("early_abort")  # a run stopped early cannot clear a FAIL
    record.write_json(suite_dir / POINTS_FILE, asdict(points))
    if not result.passed:
        view = links.absolute(links.ui_base_url(), links.report_view_path(settings.DAG_ID, dag_run_id)) \
            if dag_run_id else str(run_dir)
        log.error("%s", "\n".join(verdict_lines(result, view, name)))
        # Marked failed so the grid shows which suite failed; the report and verdict still run (all_done).
        # The traceback Airflow prints below is its own handling of this failure, not a crash.
        raise AirflowFailException(f"FAIL ({result.failure_class}): {suite_line(suite_summary(result))} "
                                   "(the verdict, the next step and the report link are above)")
    log.info("%s: %s", name or suite, result.verdict)
    return result.to_dict()


def fetch_findings(meta: Mapping[str, Any]) -> list[str]:
    """What the fetch step noticed that the report must show (notes, ignored experiment folders)."""
    out = [f"fetch: {note}" for note in meta.get("notes") or []]
    if meta.get("other_experiments"):
        out.append(f"fetch: several experiment folders in {meta['work_dir']}; the newest was evaluated, not used: "
                   + ", ".join(meta["other_experiments"]))
    return out
