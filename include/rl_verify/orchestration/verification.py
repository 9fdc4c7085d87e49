"""The task bodies of the verification DAG (``dags/rl_accuracy_verification.py``).

Each function takes plain values (params, the typed XCom values of ``orchestration.contract``, the DAG
run id) and returns JSON-ready typed dicts; the DAG's ``@task`` functions only call them. Heavy
modules (paramiko, the providers, pandas, matplotlib) are imported only where they are used, so the
DAG file parses fast and without touching the network.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from rl_verify import engines, settings
from rl_verify.core import confirm, launch, numbers
from rl_verify.core import spread as core_spread
from rl_verify.core.errors import InputError
from rl_verify.core.live import aborted_result, describe_hit, full_aborted_checks, partial_plot
from rl_verify.core.model import SuiteResult
from rl_verify.core.names import repeat_seed, run_key, short_sha
from rl_verify.core.report import (ReportMeta, render_markdown, suite_outcome, verification_verdict,
                                   write_report)
from rl_verify.core.tracker import read_tracker
from rl_verify.engines import engine_of, load_suite
from rl_verify.node import ops as node
from rl_verify.node import placement, remote
from rl_verify.orchestration import airflow_api, links, notify, spread_history
from rl_verify.orchestration.notify import suite_line, suite_summary, verdict_message
from rl_verify.orchestration.contract import (Card, Decision, Fetched, NodeFolders, Prerequisites, ReportSummary,
                                              Resolved)
from rl_verify.orchestration.nodes import (check_nodes, expanded_specs, no_retry_on, node_problems, node_settings,
                                           pool_problems, ssh_client, suite_node, suites_by_node, version_files)
from rl_verify.store import baselines, record
from rl_verify.suites import card
from rl_verify.suites.spec import SuiteSpec

log = logging.getLogger(__name__)

#: What the confirmation rule needs of one run (``core.confirm.RunPoints``), beside its result.json.
POINTS_FILE = settings.POINTS_FILE
#: A suite's outcome over its runs (``confirm_<suite>``), beside its first run's files.
OUTCOME_FILE = "outcome.json"
#: What cleanup saw of the node's GPUs after stopping the run (``gpus``: one line per node), in the run's record.
CLEANUP_FILE = "cleanup.json"


# --- configuration (read at run time, never at parse time) ----------------------------------------

def validated_params(params: Mapping[str, Any], run_type: str = "manual") -> dict[str, Any]:
    """commit, suites, where each suite trains (``suite_nodes``), early_abort and the budget of extra runs
    (``repeats``; a scheduled run takes RL_VERIFY_SCHEDULED_REPEATS) from the run's params, validated
    before anything reaches a shell."""
    suites = remote.validate_suites(params.get("suites"))
    return {"commit": remote.validate_commit(params.get("commit")), "suites": suites,
            "suite_nodes": placement.suite_nodes(params.get("node"), suites),
            "early_abort": _validate_flag(params.get("early_abort", True), "early_abort"),
            "baseline_pins": baselines.parse_pins(params.get("baseline_versions", ""), suites),
            "repeats": settings.SCHEDULED_REPEATS if run_type == "scheduled" else
            _validate_repeats(params.get("repeats", settings.DEFAULT_REPEATS))}


def _validate_repeats(value: Any) -> int:
    if value is None:
        return settings.DEFAULT_REPEATS
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= settings.MAX_REPEATS:
        raise remote.BadInput(f"param 'repeats' must be a whole number from 0 to {settings.MAX_REPEATS} (extra runs "
                              f"that may confirm a FAIL noise could have produced), got {value!r}")
    return value


def _validate_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise remote.BadInput(f"param {name!r} must be true or false, got {value!r}")
    return value


# --- tasks --------------------------------------------------------------------------------------

def resolve_commit(params: Mapping[str, Any], dag_run_id: str, run_type: str = "manual") -> Resolved:
    """Validate params, nodes and record store, then create the run's clean worktree at the commit on
    every node the run uses (the same commit on each)."""
    with no_retry_on(remote.BadInput, ValueError):
        p = validated_params(params, run_type)
        nodes = placement.nodes_in_order(p["suite_nodes"])
        per_node = {conn: node_problems(conn) for conn in nodes}
        problems = [line for lines in per_node.values() for line in lines]
        problems += pool_problems([conn for conn, lines in per_node.items() if not lines])
        if problems:
            raise ValueError(f"{len(problems)} problem(s) with the node(s) of this run; nothing was launched:\n"
                             + "\n".join(f"  - {line}" for line in problems))
    with no_retry_on(OSError):
        # A run whose record cannot be kept must not touch a node at all.
        where = record.ensure_store_writable(dag_run_id)
    with no_retry_on(InputError):
        versions = _baselines_in_use(p["suites"], p["baseline_pins"], dag_run_id)
    key = run_key(dag_run_id)
    found: dict[str, dict[str, Any]] = {}
    for conn in nodes:
        values = node_settings(conn)
        with ssh_client(conn) as client:
            reaped = node.reap(client, values[settings.REMOTE_RUNS_DIR_KEY], values[settings.NODE_CHECKOUT_KEY],
                               key, settings.REAP_AFTER_DAYS)
            for folder in reaped:
                log.info("Reaped run folder older than %d days on %s: %s", settings.REAP_AFTER_DAYS, conn, folder)
            with no_retry_on(node.NodeError):
                found[conn] = node.resolve_commit(client, values[settings.NODE_CHECKOUT_KEY],
                                                  values[settings.REMOTE_RUNS_DIR_KEY], key, p["commit"])
    if len({r["sha"] for r in found.values()}) > 1:
        raise AirflowFailException(
            f"commit {p['commit']!r} is not the same commit on every node ("
            + ", ".join(f"{conn}: {short_sha(r['sha'])}" for conn, r in found.items())
            + "): give a full SHA, or update the nodes' checkouts so that they agree")
    resolved: Resolved = {**found[nodes[0]], "run_key": key, "suites": p["suites"],  # type: ignore[typeddict-item]
                          "node": nodes[0], "suite_nodes": p["suite_nodes"],
                          "nodes": {c: {"run_dir": r["run_dir"], "worktree": r["worktree"]} for c, r in found.items()},
                          "early_abort": p["early_abort"], "record": where, "baselines": versions,
                          "repeats": p["repeats"]}
    record.put_json(dag_run_id, "commit.json", resolved)
    log.info("Commit under test: %s (%s); %s", resolved["sha"], p["commit"],
             "; ".join(f"worktree {r['worktree']} on {c}" for c, r in found.items()))
    log.info("Where the suites train: %s; record: %s", placement.describe(p["suite_nodes"]), where)
    for suite, version in versions.items():
        log.info("Baseline of %s: %s%s", suite, version["label"], "" if version["current"] else " (pinned)")
    if resolved["dirty_stat"]:
        log.warning("Worktree is dirty:\n%s", resolved["dirty_stat"])
    return resolved


def _baselines_in_use(suites: list[str], pins: Mapping[str, int], dag_run_id: str) -> dict[str, Any]:
    """Choose each suite's baseline version and copy its files into the run's record
    (``<suite>/baseline-version/``): what the run is judged against stays with its verdict."""
    versions = baselines.in_use(suites, pins)
    with record.workspace(dag_run_id, parts=[]) as run_dir:
        for suite, version in versions.items():
            for name, data in baselines.version_files(suite, version["version"]).items():
                record.write_atomic(run_dir / suite / baselines.RECORD_FOLDER / name, data)
    return versions


def check_prerequisites(resolved: Resolved) -> Prerequisites:
    """Check every input of every selected suite and whether each node is busy: one SSH round trip
    per node; every problem of every node is listed before failing."""
    groups = {conn: (suites, suite_node(resolved, suites[0])[1]["worktree"])
              for conn, suites in suites_by_node(resolved).items()}
    ok = check_nodes(groups, resolved["run_key"], resolved.get("baselines"))
    return {"ok": ok, "missing": [], "busy": []}


def experiment_card(resolved: Resolved, prereq: Prerequisites, dag_run_id: str,
                    notes: list[str] | None = None) -> Card:
    """Render the card (Markdown) the approver sees, and its experiment fingerprint.

    ``notes`` are shown on the card above the fingerprint (e.g. schedule ticks that never started).
    """
    specs = []
    for conn, suites in suites_by_node(resolved).items():
        specs += expanded_specs(suites, node_settings(conn), suite_node(resolved, suites[0])[1]["worktree"],
                                resolved.get("baselines"))
    specs.sort(key=lambda spec: resolved["suites"].index(spec.name))
    versions = resolved.get("baselines") or {}
    with record.workspace(dag_run_id, parts=[f"{s}/{baselines.RECORD_FOLDER}" for s in versions]) as run_dir:
        def data_path(spec: SuiteSpec) -> Path:
            return engine_of(spec).data_in_use(spec, version_files(run_dir / spec.name))

        repeats = resolved.get("repeats")
        sections = card.card_sections(specs, prereq["ok"], resolved.get("suite_nodes") or resolved["node"],
                                      engines.criteria(specs, data_path), {s: v["label"] for s, v in versions.items()},
                                      repeats)
        fingerprint = card.experiment_fingerprint(specs, lambda spec: json.loads(data_path(spec).read_text()),
                                                  {s: v["version"] for s, v in versions.items()}, repeats)
        markdown = card.render_card(resolved, sections, dag_run_id, fingerprint, notes)
        record.write_atomic(run_dir / "card.md", markdown)
    log.info("Experiment card:\n%s", markdown)
    return {"markdown": markdown, "fingerprint": fingerprint, "gaps": list(notes or [])}


def fetch(suite: str, resolved: Resolved, dag_run_id: str, attempt: int = 0) -> Fetched:
    """Archive the suite's tracker, logs, baseline and checker (``attempt`` > 0: of its repeat, into its
    own folder ``<suite>-r<k>``); fail on a wrong step count.

    The launch script's exit code is not trusted: the tracker's step-summary rows decide whether
    the run completed. What was fetched stays in the record even when this task fails.
    """
    conn, folders = suite_node(resolved, suite)
    spec = expanded_specs([suite], node_settings(conn), folders["worktree"], resolved.get("baselines"))[0]
    name = settings.attempt_name(suite, attempt)
    with record.workspace(dag_run_id, parts=[name]) as run_dir:
        return _fetch_into(run_dir / name, name, spec, conn, folders)


def _fetch_into(dest: Path, suite: str, spec: SuiteSpec, conn: str, folders: NodeFolders) -> Fetched:
    with ssh_client(conn) as client:
        meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest, job=suite)
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


# --- confirming a FAIL noise could have produced (core.confirm) ----------------------------------

def _run_points(run_dir: Path, suite: str, attempt: int) -> confirm.RunPoints | None:
    data = record.read_json(run_dir / settings.attempt_name(suite, attempt) / POINTS_FILE)
    if data is None:
        return None
    return confirm.RunPoints(data["verdict"], data["failure_class"],
                             [confirm.Point(**p) for p in data.get("points") or []], dict(data.get("breached") or {}),
                             list(data.get("not_repeatable") or []), bool(data.get("complete", True)))


def _spread(run_dir: Path, suite: str) -> confirm.Spread | None:
    spec = load_suite(suite)
    version = record.read_json(run_dir / suite / baselines.RECORD_FOLDER / baselines.VERSION_FILE)
    return engine_of(spec).spread(spec, version)


def _runs(run_dir: Path, suite: str) -> list[confirm.RunPoints]:
    """The suite's runs that reached their comparison, in order, up to the first that did not."""
    runs = []
    for attempt in range(settings.MAX_REPEATS + 1):
        points = _run_points(run_dir, suite, attempt)
        if points is None:
            break
        runs.append(points)
    return runs


def _learned_spread(run_dir: Path, suite: str, dag_run_id: str, repeats: list[confirm.RunPoints],
                    drift: bool) -> confirm.Spread | None:
    """The spread the rule decides with: the version's, learned from the repeats and the spread history."""
    resolved = record.read_json(run_dir / "commit.json") or {}
    return spread_history.learned(_spread(run_dir, suite), load_suite(suite), resolved, dag_run_id, repeats,
                                  drift=drift)


def _decision(run_dir: Path, suite: str, budget: int, dag_run_id: str,
              drift: bool = False) -> tuple[confirm.Decision, int, confirm.Spread | None]:
    """The rule's decision over the suite's runs in the record so far, how many repeats it saw, and the spread
    it decided with (its drift alarm only with ``drift``: the outcome's, not each gate's)."""
    runs = _runs(run_dir, suite)
    if not runs:
        return confirm.Decision(confirm.FAIL, "the first run reached no comparison (see its tasks)"), 0, None
    first, repeats = runs[0], runs[1:]
    learned = _learned_spread(run_dir, suite, dag_run_id, repeats, drift)
    return confirm.decide(first, repeats, learned, confirm.Rule(budget=budget), budget), len(repeats), learned


def _confirm_parts(suite: str) -> list[str]:
    return ["commit.json", settings.STOPPED_BY_BISECTION_FILE, f"{suite}/{baselines.RECORD_FOLDER}"] + [
        f"{settings.attempt_name(suite, k)}/{name}" for k in range(settings.MAX_REPEATS + 1)
        for name in (POINTS_FILE, "result.json", "fetch.json")]


def repeat_gate(suite: str, attempt: int, dag_run_id: str) -> bool:
    """Whether the suite's repeat ``attempt`` trains: the runs so far are all there, the budget allows it
    and the confirmation rule asks for another run. False skips the repeat's tasks."""
    with record.workspace(dag_run_id, parts=_confirm_parts(suite)) as run_dir:
        resolved = record.read_json(run_dir / "commit.json") or {}
        budget = int(resolved.get("repeats", 0))
        if suite not in (resolved.get("suites") or []) or attempt > budget:
            log.info("No repeat %d of %s: %s", attempt, suite, "not selected" if suite not in
                     (resolved.get("suites") or []) else f"the budget is {budget} extra run(s)")
            return False
        stopped = record.read_json(run_dir / settings.STOPPED_BY_BISECTION_FILE)
        if stopped:
            log.info("No repeat %d of %s: this probe was stopped by bisection %s (%s)", attempt, suite,
                     stopped.get("bisection"), stopped.get("why"))
            return False
        decision, seen, learned = _decision(run_dir, suite, budget, dag_run_id)
        if seen != attempt - 1:
            log.info("No repeat %d of %s: run %d has no comparison (see its tasks)", attempt, suite, attempt)
            return False
        if decision.outcome is not None:
            log.info("No repeat %d of %s: %s (%s)", attempt, suite, decision.outcome, decision.reason)
            return False
        stop = confirm.stop_early(_run_points(run_dir, suite, 0), learned)
        record.write_json(run_dir / settings.attempt_name(suite, attempt) / settings.STOP_EARLY_FILE, stop)
        log.warning("%s: repeat %d of %d at the same commit with a new seed: %s. It stops early only on a "
                    "certain FAIL that decides the outcome: %s", suite, attempt, budget, decision.reason,
                    ", ".join(f"{m} {'either way' if s == 0 else 'up' if s > 0 else 'down'} by >= {d:.4g}"
                              for m, (s, d) in stop.items()) or "none")
        return True


def confirm_outcome(suite: str, dag_run_id: str) -> dict[str, Any]:
    """The suite's outcome over its runs (``outcome.json``): the rule's decision, every run's own runbook
    verdict, and what the check can and cannot tell apart (healthy breach chance per metric, the false
    alarm after confirmation, the smallest shift detected with 90% probability). A FAIL, reproduced or at
    once, fails the task (the grid shows which suite failed)."""
    with record.workspace(dag_run_id, parts=_confirm_parts(suite)) as run_dir:
        resolved = record.read_json(run_dir / "commit.json") or {}
        if suite not in (resolved.get("suites") or []):
            raise AirflowSkipException(f"suite {suite} not selected for this run")
        budget = int(resolved.get("repeats", 0))
        decision, seen, learned = _decision(run_dir, suite, budget, dag_run_id, drift=True)
        if decision.outcome is None:  # a repeat the rule asked for did not reach its comparison
            decision = confirm.Decision(confirm.FAIL, f"repeat {seen + 1} did not reach its comparison (see its "
                                        "tasks): an infrastructure failure", decision.evidence, decision.rule)
        runs = [_run_summary(run_dir, resolved, suite, k) for k in range(seen + 1)]
        outcome = {"suite": suite, "outcome": decision.outcome, "reason": decision.reason, "rule": decision.rule,
                   "evidence": decision.evidence, "budget": budget, "runs": runs,
                   "spread": spread_history.describe(learned), "estimates": _estimates(run_dir, suite, budget)}
        record.write_json(run_dir / suite / OUTCOME_FILE, outcome)
        spread_history.keep(suite, dag_run_id, spread_history.spread_key(load_suite(suite), resolved),
                            decision.outcome, _runs(run_dir, suite))
        for alarm in (learned.drift if learned is not None else ()):
            log.warning("%s: drift alarm: %s", suite, alarm)
    log.info("%s: %s: %s", suite, decision.outcome, decision.reason)
    if decision.outcome in confirm.FAILING:
        raise AirflowFailException(f"{suite} {decision.outcome}: {decision.reason}")
    return outcome


def _run_summary(run_dir: Path, resolved: Mapping[str, Any], suite: str, attempt: int) -> dict[str, Any]:
    name = settings.attempt_name(suite, attempt)
    result = record.read_json(run_dir / name / "result.json") or {}
    fetched = record.read_json(run_dir / name / "fetch.json") or {}
    return {"attempt": attempt, "folder": name, "verdict": result.get("verdict"),
            "failure_class": result.get("failure_class"),
            "seed": resolved.get("seed") if attempt == 0 else repeat_seed(resolved.get("run_key", ""), attempt),
            "steps": fetched.get("steps"), "expected_steps": fetched.get("expected_steps"),
            "record": f"{resolved.get('record', '')}/{name}"}


def _estimates(run_dir: Path, suite: str, budget: int) -> dict[str, Any]:
    """What the check can tell apart for this suite and baseline version (normal, independent noise with
    the version's spread): per judged metric the chance that a healthy run breaches it and the smallest
    shift detected with 90% probability, and the whole procedure's false alarm and mean runs."""
    first, spread = _run_points(run_dir, suite, 0), _spread(run_dir, suite)
    if spread is None or first is None or not first.points:
        return {"spread": None, "note": "the baseline version records no run-to-run spread (or the engine judges "
                                        "no point comparisons): one repeat decides, no error rate is estimated"}
    # Every point a complete run is judged at against this version, not the points this run reached: a run
    # stopped early at step 5 would otherwise state lower error rates than a PASS on the same version (issue 35).
    spec = load_suite(suite)
    layout = engine_of(spec).judged_layout(spec, version_files(run_dir / suite)) or confirm.Layout.of(first.points)
    # Seeded simulations of the same inputs give the same figures: computed once per baseline spread, judged
    # points and budget (tens of seconds on a busy core), kept in the record store for every later run.
    key = {"code": _confirm_code(), "thresholds": layout.thresholds, "steps": layout.steps, "sigma": spread.sigma,
           "df": spread.df, "runs": spread.runs, "source": spread.source, "budget": budget}
    return record.cached_json("estimates", key, lambda: estimate(layout, spread, budget))


def estimate(layout: confirm.Layout, spread: confirm.Spread, budget: int) -> dict[str, Any]:
    """The figures of ``_estimates`` for one layout of judged points, spread and repeat budget (its source is
    part of their cache key: ``_confirm_code``)."""
    rule = confirm.Rule(budget=budget)
    healthy = confirm.simulate(layout, spread, rule, samples=1000, seed=1)
    metrics = {}
    for metric in layout.thresholds:
        if metric in spread.sigma:
            metrics[metric] = {
                "sigma": spread.sigma[metric],
                "threshold": layout.thresholds[metric],
                "healthy_breach": confirm.healthy_breach_rate(spread.sigma[metric], layout.thresholds[metric],
                                                              len(layout.steps[metric]), spread.runs),
                "min_detectable_shift": confirm.minimum_detectable_shift(layout, spread, metric, rule, samples=300)}
    return {"spread": spread.source, "runs_in_baseline": spread.runs, "metrics": metrics,
            "single_run_false_alarm": 1 - healthy[confirm.PASS],
            "false_alarm": healthy[confirm.REPRODUCED] + healthy[confirm.FAIL],
            "inconclusive": healthy[confirm.INCONCLUSIVE], "mean_runs": healthy["runs"],
            "simulated": "1000 healthy verifications (normal, independent noise; the reference's own error drawn "
                         "once per verification)"}


@functools.cache
def _confirm_code() -> str:
    """The code's own version in the estimates' cache key: a change to the rule, the simulation
    (``core/confirm.py``), the pooling (``core/spread.py``) or what ``estimate`` asks of it (samples, seeds)
    computes them again."""
    import hashlib
    import inspect

    return hashlib.sha256(Path(confirm.__file__).read_bytes() + Path(core_spread.__file__).read_bytes()
                          + inspect.getsource(estimate).encode()).hexdigest()


def fetch_findings(meta: Mapping[str, Any]) -> list[str]:
    """What the fetch step noticed that the report must show (notes, ignored experiment folders)."""
    out = [f"fetch: {note}" for note in meta.get("notes") or []]
    if meta.get("other_experiments"):
        out.append(f"fetch: several experiment folders in {meta['work_dir']}; the newest was evaluated, not used: "
                   + ", ".join(meta["other_experiments"]))
    return out


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
    paths = {s: _paths(run_dir / s, run_dir) for s in suites}
    nodes = resolved.get("suite_nodes")
    meta = ReportMeta(commit=resolved.get("sha"), commit_ref=resolved.get("commit_ref") or params.get("commit"),
                      diff_stat=resolved.get("dirty_stat"), dag_run_id=dag_run_id,
                      node=placement.describe(nodes) if nodes else resolved.get("node") or params.get("node"),
                      paths=paths, notes=notes, overall=overall,
                      baselines={s: v["label"] for s, v in (resolved.get("baselines") or {}).items()},
                      outcomes=outcomes)
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
                "bisection": None}
    return {"rejected": "Reject" in (decision.get("chosen_options") or []),
            "timed_out": bool(decision.get("timed_out")), "by": decision.get("by"), "at": decision.get("at"),
            "standing": bool(decision.get("standing")), "granted_in": decision.get("granted_in"),
            "bisection": decision.get("bisection")}


def schedule_gaps(run_type: str, logical_date: Any, dag_id: str = settings.DAG_ID) -> list[str]:
    """For a scheduled run: a note naming the schedule ticks since the previous scheduled run that
    never started (a run waited or ran past them); [] when none or not a scheduled run."""
    if run_type != "scheduled" or logical_date is None or settings.SCHEDULE is None:
        return []
    try:
        previous = airflow_api.previous_scheduled_run(settings.AIRFLOW_API_CONN_ID, dag_id, logical_date)
    except airflow_api.ApiUnavailable as err:
        log.warning("Cannot list earlier scheduled runs to find missed schedule ticks: %s", err)
        return []
    if previous is None:
        return []
    missed = settings.missed_ticks(previous, logical_date)
    if not missed:
        return []
    shown = ", ".join(t.isoformat(timespec="minutes") for t in missed[:20])
    more = f" and {len(missed) - 20} more" if len(missed) > 20 else ""
    since = previous.isoformat(timespec="minutes")
    return [f"{len(missed)} schedule tick(s) since the previous scheduled run ({since}) "
            f"never started, because an earlier run was still waiting or running: {shown}{more}."]


def verdict(summary: ReportSummary | None, dag_run_id: str = "") -> str:
    """Fail the DAG run when the verdict is FAIL (after the report exists), in one line with the report's link."""
    if not summary:
        raise RuntimeError("no report was written (see the report task's log): the verdict is unknown")
    if summary["verdict"] in ("REJECTED", "NOT APPROVED"):
        raise AirflowSkipException(f"{summary['verdict']}: nothing was launched")
    view = links.absolute(links.ui_base_url(),
                          links.report_view_path(settings.verification_dag_of(dag_run_id), dag_run_id))
    said = [f"{s['suite']} {s['outcome']} ({s['runs']} runs)" for s in summary.get("suites") or []
            if s.get("runs", 1) > 1]
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
        log.info("PASS: every suite of %s passes; report: %s",
                 ", ".join(s["suite"] for s in summary.get("suites") or []), view)
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


def cleanup(resolved: Resolved | None, dag_run_id: str, failed_tasks: list[str] | None = None) -> list[str]:
    """Stop the run's processes and Ray on the node, archive whatever trackers/logs exist, and tell
    people about an infrastructure failure (``failed_tasks`` minus suites stopped by the live check)."""
    if not resolved:
        log.info("The run never got a worktree on the node: nothing to clean up; the node was not touched")
        _notify_infrastructure(failed_tasks or [], resolved, dag_run_id, [], True)
        return []
    log.info("%s", f"Failed task(s) {', '.join(failed_tasks)}: stopping every process of this run on the node"
             if failed_tasks else "No task failed: checking that no process of this run is left on the node")
    lines: list[str] = []
    # A suite's first run, and each repeat whose training failed or was stopped by its live check (its task then
    # succeeds: stopped on purpose): what they left is archived.
    jobs = [(suite, k) for suite in resolved["suites"] for k in range(settings.MAX_REPEATS + 1)
            if k == 0 or settings.training_task(suite, k) in (failed_tasks or [])
            or _stopped_on_purpose(dag_run_id, suite, k)]
    fetched = [f"{settings.attempt_name(suite, k)}/fetch.json" for suite, k in jobs]
    gpus: list[str] = []  # each node's GPUs after the stop ("GPUs free" / "GPU memory still held by pid P")
    by_node = suites_by_node(resolved)
    with record.workspace(dag_run_id, parts=fetched) as run_dir:
        for conn, suites in by_node.items():
            folders = suite_node(resolved, suites[0])[1]
            with ssh_client(conn) as client:
                done = node.cleanup(client, folders["run_dir"], resolved["run_key"])
                lines += done
                said = node.gpu_line(done)
                if said:
                    gpus.append(said if len(by_node) == 1 else f"node {conn}: {said}")
                for suite, attempt in [j for j in jobs if j[0] in suites] if failed_tasks else []:
                    name = settings.attempt_name(suite, attempt)
                    dest = run_dir / name
                    if (dest / "fetch.json").exists():
                        continue
                    spec = expanded_specs([suite], node_settings(conn), folders["worktree"])[0]
                    meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest, job=name)
                    record.write_json(dest / "fetch.json", {**meta, "problems": meta["problems"] or
                                                            ["collected by cleanup after a failure"]})
        record.write_json(run_dir / CLEANUP_FILE, {"gpus": gpus})  # the report (written next) states them
    for line in lines:
        log.info("cleanup: %s", line)
    left = [line for line in lines if line.startswith("LEFT")]
    log.info("cleanup: the node is %s", "clean: no process of this run is left" if not left else
             f"NOT clean: {len(left)} process(es) of this run still run: " + "; ".join(left))
    _notify_infrastructure(failed_tasks or [], resolved, dag_run_id, lines, not left)
    return lines


def _stopped_on_purpose(dag_run_id: str, suite: str, attempt: int) -> bool:
    """Whether the live check stopped this training (its abort.json says applied)."""
    return bool((record.get_json(dag_run_id, f"{settings.attempt_name(suite, attempt)}/abort.json") or {})
                .get("applied"))


def failed_tasks(ti: Any) -> list[str]:
    """The upstream tasks of ``ti`` (the tasks that touch the node) that failed or could not run
    because of a failure, as Airflow records them."""
    try:
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id])
    except Exception as err:  # the message then names no task; the cleanup itself must go on
        log.warning("Could not read the run's task states: %s", err)
        return []
    by_task = states.get(ti.run_id, states)
    watched = set(ti.task.upstream_task_ids)
    return sorted(t for t, s in by_task.items()
                  if t in watched and str(getattr(s, "value", s)) in ("failed", "upstream_failed"))


def _notify_infrastructure(failed_tasks: list[str], resolved: Resolved | None, dag_run_id: str,
                           lines: list[str], clean: bool) -> None:
    """An infrastructure message unless the only failures are suites the live check stopped (accuracy)."""
    stopped = {settings.training_task(s, k) for s in (resolved or {}).get("suites", [])
               for k in range(settings.MAX_REPEATS + 1)
               if settings.training_task(s, k) in failed_tasks
               and (record.get_json(dag_run_id, f"{settings.attempt_name(s, k)}/abort.json") or {}).get("certain")}
    infra = [t for t in failed_tasks if t not in stopped]
    if not infra:
        log.info("No infrastructure failure to report (%s)", "the failing suites were stopped by the live check"
                 if failed_tasks else "no failed task was named")
        return
    commit = (resolved or {}).get("commit_ref") or "?"
    notify.send(*notify.infrastructure(infra, commit, dag_run_id, lines, clean), failure=True)
