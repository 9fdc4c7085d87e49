"""The verification DAG's tasks that set a run up on its nodes and clean up after it
(``dags/rl_accuracy_verification.py``, ``orchestration.verification_dag``): the run's params validated,
``resolve_commit``, ``check_prerequisites``, ``experiment_card`` (with the schedule ticks that never started)
and ``cleanup``.

Each function takes plain values (params, the typed XCom values of ``orchestration.contract``, the DAG
run id) and returns JSON-ready typed dicts; the DAG's ``@task`` functions only call them. Heavy
modules (paramiko, the providers, pandas, matplotlib) are imported only where they are used, so the
DAG file parses fast and without touching the network. A suite run's fetch and comparison are
``orchestration.comparison``'s, the confirmation rule ``orchestration.confirmation``'s, the report and
verdict ``orchestration.reporting``'s.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from collections.abc import Callable
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowFailException

from rl_verify import engines, settings
from rl_verify.core import bitwise, lane
from rl_verify.core.errors import InputError
from rl_verify.core.model import UNCHANGED
from rl_verify.core.names import run_key, short_sha
from rl_verify.core.report import environment_line
from rl_verify.engines import engine_of
from rl_verify.node import ops as node
from rl_verify.node import placement, remote
from rl_verify.orchestration import (airflow_api, bitwise_lane, hand_end, notify, training_job, unchanged,
                                     verification_history)
from rl_verify.orchestration.contract import Card, Prerequisites, Resolved
from rl_verify.orchestration.nodes import (is_slurm, check_nodes, expanded_specs, no_retry_on, node_launcher,
                                           node_needs, node_problems, node_settings, pool_problems, ssh_client,
                                           suite_node, suites_by_node, version_files)
from rl_verify.store import baselines, record
from rl_verify.suites import card
from rl_verify.suites.rules import rules_of
from rl_verify.suites.spec import SuiteSpec

log = logging.getLogger(__name__)

#: What cleanup saw of the node's GPUs after stopping the run (``gpus``: one line per node), in the run's record.
CLEANUP_FILE = "cleanup.json"
#: Each node's environment and its fingerprint, as check_prerequisites read it, in the run's record.
ENVIRONMENT_FILE = "environment.json"


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
            "lane": _validate_lane(params.get("lane") or settings.DEFAULT_LANE),
            "repeats": settings.SCHEDULED_REPEATS if run_type == "scheduled" else
            _validate_repeats(params.get("repeats", settings.DEFAULT_REPEATS))}


def _validate_repeats(value: Any) -> int:
    if value is None:
        return settings.DEFAULT_REPEATS
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= settings.MAX_REPEATS:
        raise remote.BadInput(f"param 'repeats' must be a whole number from 0 to {settings.MAX_REPEATS} (extra runs "
                              f"that may confirm a FAIL noise could have produced), got {value!r}")
    return value


def _validate_lane(value: Any) -> str:
    if value not in settings.LANES:
        raise remote.BadInput(f"param 'lane' must be one of {', '.join(settings.LANES)} (skip: no bitwise lane; "
                              f"full: train every suite whatever the diff since its verified PASS), got {value!r}")
    return str(value)


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
    specs = [engines.load_suite(s) for s in p["suites"]]  # read once: fingerprints, bases, the diff's paths
    with no_retry_on(InputError):
        versions, fingerprints = _baselines_in_use(specs, p["baseline_pins"], dag_run_id)
    # The path-aware skip's bases: read from the record before any node is touched.
    # full: nothing to skip; a bisection's probe neither: its plan already took the commits whose diff from the good
    # end cannot move a number as good, and a probe must not rest on an earlier probe's PASS (its confirmation).
    skips = p["lane"] != "full" and not params.get("bisection")
    bases = unchanged.bases(specs, fingerprints, versions) if skips else {}
    # What the record knows of these suites (issue 42): a shortcut never says PASS against it.
    verdicts = verification_history.suite_verdicts(p["suites"]) if p["lane"] != "full" else []
    key = run_key(dag_run_id)
    found: dict[str, dict[str, Any]] = {}
    skipped: dict[str, dict[str, Any]] = {}
    trees: dict[str, list[str]] = {}
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
                trees[conn] = found[conn].pop("tree")  # too large for the XCom: its conclusions travel instead
                on_node = [s for s in specs if p["suite_nodes"][s.name] == conn]
                if skips and not found[conn]["dirty_stat"]:
                    skipped.update(unchanged.unchanged_on_node(
                        client, values[settings.NODE_CHECKOUT_KEY], found[conn]["sha"], on_node, bases,
                        scheduled=run_type == "scheduled", tree=trees[conn], verdicts=verdicts,
                        fingerprints=fingerprints, environment=_environment_reader(client, conn, on_node, values, key)))
    if len({r["sha"] for r in found.values()}) > 1:
        raise AirflowFailException(
            f"commit {p['commit']!r} is not the same commit on every node ("
            + ", ".join(f"{conn}: {short_sha(r['sha'])}" for conn, r in found.items())
            + "): give a full SHA, or update the nodes' checkouts so that they agree")
    resolved: Resolved = {**found[nodes[0]], "run_key": key, "suites": p["suites"],  # type: ignore[typeddict-item]
                          "node": nodes[0], "suite_nodes": p["suite_nodes"],
                          "nodes": {c: {"run_dir": r["run_dir"], "worktree": r["worktree"]} for c, r in found.items()},
                          "early_abort": p["early_abort"], "record": where, "baselines": versions,
                          "repeats": p["repeats"], "suite_fingerprints": fingerprints, "lane": p["lane"],
                          "unchanged": skipped, "scheduled": run_type == "scheduled",
                          # the suites' path rules that match no file at this commit, and what the record doubts
                          "stale": stale_rules(specs, trees[nodes[0]]),
                          "contradicted": contradictions(p["suites"], found[nodes[0]]["sha"], verdicts),
                          # when each suite's last full verification (a trained PASS) ended: the lane's policy
                          "last_full": {s: b.get("written_at") for s, b in bases.items()}}
    record.put_json(dag_run_id, "commit.json", resolved)
    if skipped:
        with record.workspace(dag_run_id, parts=[]) as run_dir:
            unchanged.write_outcomes(run_dir, skipped)
    log.info("Commit under test: %s (%s); %s", resolved["sha"], p["commit"],
             "; ".join(f"worktree {r['worktree']} on {c}" for c, r in found.items()))
    log.info("Where the suites train: %s; record: %s", placement.describe(p["suite_nodes"]), where)
    for line in shortcut_notes(resolved):
        log.warning("%s", line)
    for suite, version in versions.items():
        log.info("Baseline of %s: %s%s", suite, version["label"], "" if version["current"] else " (pinned)")
    if resolved["dirty_stat"]:
        log.warning("Worktree is dirty:\n%s", resolved["dirty_stat"])
    return resolved


def _environment_reader(client: Any, conn: str, specs: list[SuiteSpec], values: Mapping[str, str],
                        key: str) -> Callable[[], dict[str, Any] | None]:
    """The node's environment, read at most once and only when a decision needs it (issue 53): None on a Slurm
    target (its compute node is Slurm's to choose) or when it cannot be read."""
    seen: list[dict[str, Any] | None] = []

    def read() -> dict[str, Any] | None:
        if not seen:
            seen.append(None if is_slurm(conn) else node.read_environment(
                client, specs, values[settings.REMOTE_RUNS_DIR_KEY], key, node_needs(specs, values)))
        return seen[0]
    return read


def stale_rules(specs: list[SuiteSpec], tree: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per suite, its ``affects`` and ``bitwise.disabled_by`` patterns that match no file of ``tree`` (the checkout
    at the commit under test; issue 42), for the suites that have any."""
    out = {}
    for spec in specs:
        rules = rules_of(spec)
        affects, disabled_by = lane.stale_rules(rules, tree)
        found = {k: list(v) for k, v in (("affects", affects), ("disabled_by", disabled_by)) if v}
        if found:
            out[spec.name] = found
    return out


def contradictions(suites: list[str], sha: str, verdicts: list[dict[str, Any]]) -> dict[str, str]:
    """Per suite whose newest full verdict at ``sha`` in the record doubts it (issue 42), one phrase saying so."""
    out = {}
    for suite in suites:
        doubt = verification_history.doubted(verdicts, suite, sha)
        if doubt:
            out[suite] = verification_history.doubt_words(doubt)
    return out


def shortcut_notes(resolved: Mapping[str, Any]) -> list[str]:
    """The card's and the report's lines about what turned a suite's shortcuts off before any diff was read: its
    path rules that name nothing at this commit (with the fix), and a FAIL of this commit in the record."""
    lines = []
    for suite, found in (resolved.get("stale") or {}).items():
        for field, shortcut in (("affects", f"no {UNCHANGED}"), ("disabled_by", "no bitwise lane")):
            if found.get(field):
                name = "affects" if field == "affects" else "bitwise.disabled_by"
                lines.append(f"{suite}: {shortcut} ({lane.stale_words(name, found[field])}).")
    for suite, why in (resolved.get("contradicted") or {}).items():
        lines.append(f"{suite}: no shortcut, full verification: the record contradicts one: {why}.")
    return lines


def _baselines_in_use(specs: list[SuiteSpec], pins: Mapping[str, int],
                      dag_run_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Choose each suite's baseline version and copy its files into the run's record
    (``<suite>/baseline-version/``): what the run is judged against stays with its verdict. Also each suite's
    own experiment fingerprint (``unchanged.suite_fingerprint``), from the same files."""
    versions = baselines.in_use(specs, pins)
    fingerprints = {}
    with record.workspace(dag_run_id, parts=[]) as run_dir:
        for spec in specs:
            version = versions[spec.name]
            files = baselines.version_files(spec, version["version"])
            for name, data in files.items():
                record.write_atomic(run_dir / spec.name / baselines.RECORD_FOLDER / name, data)
            fingerprints[spec.name] = unchanged.suite_fingerprint(spec, files, version["version"])
    return versions, fingerprints


def check_prerequisites(resolved: Resolved, dag_run_id: str | None = None) -> Prerequisites:
    """Check every input of every selected suite and whether each node is busy: one SSH round trip
    per node; every problem of every node is listed before failing. The same round trip reads each node's
    environment (GPU, driver, CUDA, the launch interpreter's packages), kept with its fingerprint in the
    run's record (``environment.json``) when ``dag_run_id`` is given."""
    groups = {conn: (suites, suite_node(resolved, suites[0])[1]["worktree"])
              for conn, suites in suites_by_node(resolved, training_only=True).items()}
    if not groups:
        log.info("Nothing to check: every suite is %s (no training, no node needed)", UNCHANGED)
        return {"ok": [], "missing": [], "busy": []}
    seen: dict[str, dict[str, Any]] = {}
    ok = check_nodes(groups, resolved["run_key"], resolved.get("baselines"), seen)
    environments = {conn: {**facts, "fingerprint": bitwise.fingerprint(facts)} for conn, facts in seen.items()}
    for conn, facts in environments.items():
        log.info("Environment of %s: %s", conn, environment_line(facts))
    if dag_run_id and environments:
        record.put_json(dag_run_id, ENVIRONMENT_FILE, environments)
    lanes = bitwise_lane.decide(resolved, environments)
    if dag_run_id and lanes:
        record.put_json(dag_run_id, bitwise_lane.LANES_FILE, lanes)
    return {"ok": ok, "missing": [], "busy": [], "environment": environments, "lanes": lanes}


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
    gaps = list(notes or [])
    notes = shortcut_notes(resolved) + unchanged.card_notes(resolved) + bitwise_lane.card_notes(prereq) + gaps
    with record.workspace(dag_run_id, parts=[f"{s}/{baselines.RECORD_FOLDER}" for s in versions]) as run_dir:
        def data_path(spec: SuiteSpec) -> Path:
            return engine_of(spec).data_in_use(spec, version_files(run_dir / spec.name))

        repeats = resolved.get("repeats")
        sections = card.card_sections(specs, prereq["ok"], resolved.get("suite_nodes") or resolved["node"],
                                      engines.criteria(specs, data_path), {s: v["label"] for s, v in versions.items()},
                                      repeats, training_job.retry_policy().retries)
        fingerprint = card.experiment_fingerprint(specs, lambda spec: json.loads(data_path(spec).read_text()),
                                                  {s: v["version"] for s, v in versions.items()}, repeats)
        markdown = card.render_card(resolved, sections, dag_run_id, fingerprint, notes)
        record.write_atomic(run_dir / "card.md", markdown)
    log.info("Experiment card:\n%s", markdown)
    return {"markdown": markdown, "fingerprint": fingerprint, "gaps": gaps}


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


def cleanup(resolved: Resolved | None, dag_run_id: str, failed_tasks: list[str] | None = None,
            by_hand: bool = False) -> list[str]:
    """Stop the run's processes and Ray on the node, archive whatever trackers/logs exist, and tell
    people about an infrastructure failure (``failed_tasks`` minus suites stopped by the live check; none
    when the run was ended ``by_hand``: a person's own stop is no failure to announce)."""
    if by_hand:
        log.info("This run was ended by hand before its verdict: stopping every job and process it started "
                 "(no trigger may be watching them)")
    if not resolved:
        log.info("The run never got a worktree on the node: nothing to clean up; the node was not touched")
        if not by_hand:
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
            # Every job the run may have started on this node (a Slurm target cancels each, and any job by the run's
            # name); an SSH node stops the run's processes by their marker.
            names = [job for s in suites for k in range(settings.MAX_REPEATS + 1)
                     for job in settings.attempt_jobs(settings.attempt_name(s, k))] + \
                [settings.lane_job(s, which) for s in suites for which in settings.LANE_JOBS]
            with ssh_client(conn) as client:
                done = node.cleanup(client, folders["run_dir"], resolved["run_key"], node_launcher(conn), names)
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
                    job = training_job.current_job(name, training_job.attempts(dag_run_id, name))
                    meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest, job=job)
                    record.write_json(dest / "fetch.json", {**meta, "problems": meta["problems"] or
                                                            ["collected by cleanup after a failure"]})
        record.write_json(run_dir / CLEANUP_FILE, {"gpus": gpus})  # the report (written next) states them
    for line in lines:
        log.info("cleanup: %s", line)
    left = [line for line in lines if line.startswith("LEFT")]
    log.info("cleanup: the node is %s", "clean: no process of this run is left" if not left else
             f"NOT clean: {len(left)} process(es) of this run still run: " + "; ".join(left))
    if by_hand:
        log.info("No infrastructure message: the run was ended by hand")
    else:
        _notify_infrastructure(failed_tasks or [], resolved, dag_run_id, lines, not left)
    return lines


#: The verification's tasks Airflow itself never skips (all_done): a skipped one was skipped by a hand's marking.
NEVER_SKIPPED = (settings.REPORT_TASK, settings.VERDICT_TASK)


def _stopped_on_purpose(dag_run_id: str, suite: str, attempt: int) -> bool:
    """Whether the live check stopped this training (its abort.json says applied)."""
    return bool((record.get_json(dag_run_id, f"{settings.attempt_name(suite, attempt)}/abort.json") or {})
                .get("applied"))


def cleanup_scope(ti: Any) -> tuple[list[str], bool]:
    """For the cleanup task ``ti``: its upstream tasks (the ones that touch the node) that failed or could not
    run because of a failure, and whether the run was ended by hand, as Airflow records them. Unreadable states
    give ([], False): the message then names no task, and the cleanup itself must go on."""
    try:
        by_task = hand_end.run_task_states(ti)
    except Exception as err:
        log.warning("Could not read the run's task states: %s", err)
        return [], False
    watched = set(ti.task.upstream_task_ids)
    return sorted(t for t, s in by_task.items() if t in watched and s in ("failed", "upstream_failed")), \
        hand_end.ended_by_hand(by_task, NEVER_SKIPPED)


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
