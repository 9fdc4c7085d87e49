"""The bodies of the DAG's tasks, kept out of the DAG file so they are typed and testable.

Each function takes plain values (params, the typed XCom values of ``rl_verify.contract``, the DAG
run id) and returns JSON-ready typed dicts. Airflow and paramiko are imported inside the functions
that need them, never at import time, so the DAG file parses fast and without touching the network.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from rl_verify import node, placement, record, remote, settings
from rl_verify.contract import (Breach, Card, Decision, Fetched, NodeFolders, Prerequisites, ReportSummary, Resolved,
                                SuiteSummary)
from rl_verify.engines import engine_of
from rl_verify.errors import InputError
from rl_verify.suite import SuiteSpec, load_suite

log = logging.getLogger(__name__)


# --- configuration (read at run time, never at parse time) ----------------------------------------

def node_settings(conn_id: str) -> dict[str, str]:
    """Share roots, checkout and runs dir for a node: connection extras > Variables > environment.

    Raises ValueError listing every setting that is missing, with where to set it.
    """
    from airflow.sdk import BaseHook, Variable

    extras = BaseHook.get_connection(conn_id).extra_dejson or {}
    wanted = {**{v: None for v in settings.SHARE_ROOT_VARS},
              "RL_VERIFY_NODE_CHECKOUT": settings.NODE_CHECKOUT,
              "RL_VERIFY_REMOTE_RUNS_DIR": settings.REMOTE_RUNS_DIR}
    values: dict[str, str] = {}
    for name, default in wanted.items():
        value = extras.get(name.lower()) or extras.get(name) or Variable.get(name, default=None) \
            or os.environ.get(name) or default
        if value:
            values[name] = str(value)
    missing = [n for n in wanted if n not in values]
    if missing:
        raise ValueError(f"node {conn_id!r}: {', '.join(missing)} not set; set them in the connection's "
                         f"extras (lower-case keys), as Airflow Variables, or in the environment")
    for name, value in values.items():
        remote.validate_path(value, name)
    return values


def _unpinned(conn_id: str) -> str:
    return (f"connection {conn_id!r} has no pinned host key: set the extra 'host_key' to the node's public host "
            "key (ssh-keyscan -t ed25519 HOST) and 'no_host_key_check' to false")


def _ssh_hook(conn_id: str) -> Any:
    """The SSH provider's hook for the node (reads the connection; no network)."""
    from airflow.providers.ssh.hooks.ssh import SSHHook

    return SSHHook(ssh_conn_id=conn_id, conn_timeout=20, conn_retry_attempts=2)


@contextmanager
def ssh_client(conn_id: str) -> Iterator[Any]:
    """An SSH client for the node from the SSH provider's hook (host key pinned by the connection)."""
    import paramiko

    hook = _ssh_hook(conn_id)
    if hook.no_host_key_check or hook.host_key is None:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(_unpinned(conn_id))
    with no_retry_on(paramiko.BadHostKeyException):  # a changed host key is never transient
        client = hook.get_conn()
    try:
        yield client
    finally:
        client.close()


def expanded_specs(suites: list[str], values: Mapping[str, str], worktree: str,
                   versions: Mapping[str, Mapping[str, Any]] | None = None) -> list[SuiteSpec]:
    """The selected suites with share roots and ``${CHECKOUT}`` (the run's worktree) filled in.

    ``versions`` (``Resolved["baselines"]``): a suite whose baseline version holds its own baseline
    tracker does not read the one on the node's share (not checked, not fetched).
    """
    specs = [load_suite(s).expanded({**values, "CHECKOUT": worktree}) for s in suites]
    return [spec_in_use(spec, (versions or {}).get(spec.name)) for spec in specs]


def spec_in_use(spec: SuiteSpec, version: Mapping[str, Any] | None) -> SuiteSpec:
    """``spec`` as judged against ``version``: without the share's baseline tracker when the version
    holds the tracker itself."""
    engine = engine_of(spec)
    if version is None or engine.baseline_is_data or engine.baseline_file not in version.get("files", ()):
        return spec
    return spec.model_copy(update={"baseline": None,
                                   "inputs": [i for i in spec.inputs if i.path != spec.baseline]})


def data_in_use(spec: SuiteSpec, files: Mapping[str, Path]) -> Path:
    """The data file a suite is judged with: its baseline version's when that replaces the spec's data
    file (a golden table), else the spec's own."""
    from rl_verify.suite import data_file

    engine = engine_of(spec)
    return files.get(engine.baseline_file, data_file(spec.data)) if engine.baseline_is_data else data_file(spec.data)


def version_files(suite_dir: Path) -> dict[str, Path]:
    """The files of the baseline version a suite is judged against, in a pulled record (name -> path)."""
    from rl_verify.baselines import RECORD_FOLDER, VERSION_FILE

    folder = suite_dir / RECORD_FOLDER
    return {p.name: p for p in sorted(folder.iterdir()) if p.name != VERSION_FILE} if folder.is_dir() else {}


def validated_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """commit, suites, where each suite trains (``suite_nodes``) and early_abort from the run's params,
    validated before anything reaches a shell."""
    from rl_verify import baselines

    suites = remote.validate_suites(params.get("suites"))
    return {"commit": remote.validate_commit(params.get("commit")), "suites": suites,
            "suite_nodes": placement.suite_nodes(params.get("node"), suites),
            "early_abort": _validate_flag(params.get("early_abort", True), "early_abort"),
            "baseline_pins": baselines.parse_pins(params.get("baseline_versions", ""), suites)}


def node_problems(conn_id: str) -> list[str]:
    """What keeps the node of ``conn_id`` from being used, without connecting to it: no such
    connection, no pinned host key, missing share roots. [] when it can be used."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        hook = _ssh_hook(conn_id)
    except AirflowNotFoundException:
        return [f"node {conn_id!r}: there is no Airflow connection with this id: add the node's SSH connection "
                "(Admin > Connections, host key pinned) or fix the param 'node'"]
    problems = [_unpinned(conn_id)] if hook.no_host_key_check or hook.host_key is None else []
    try:
        node_settings(conn_id)
    except ValueError as err:
        problems.append(str(err))
    return problems


def pool_problems(conn_ids: list[str]) -> list[str]:
    """Nodes whose one-slot pool is missing (their training would never be scheduled), read through the
    Airflow API connection; [] when the API cannot be asked (logged)."""
    from rl_verify import airflow_api

    problems = []
    for conn_id in conn_ids:
        name = placement.node_pool(conn_id)
        try:
            pool = airflow_api.pool(settings.AIRFLOW_API_CONN_ID, name)
        except airflow_api.ApiUnavailable as err:
            log.warning("Cannot check that the node pools exist (%s); a missing pool leaves its training queued", err)
            return []
        if pool is None:
            problems.append(f"node {conn_id!r}: pool {name!r} does not exist, so its training would never start: "
                            f"create it with `airflow pools set {name} 1 'one training at a time on {conn_id}' "
                            "--include-deferred`")
        elif pool["slots"] != 1 or not pool["include_deferred"]:
            log.warning("Pool %s has %s slot(s), deferred tasks %scounted: give it 1 slot counting deferred tasks, "
                        "or two trainings may share node %s", name, pool["slots"],
                        "" if pool["include_deferred"] else "not ", conn_id)
    return problems


def suite_node(resolved: Resolved, suite: str) -> tuple[str, NodeFolders]:
    """(connection id, the run's folders) of the node ``suite`` trains on in this run."""
    conn = (resolved.get("suite_nodes") or {}).get(suite, resolved["node"])
    folders = (resolved.get("nodes") or {}).get(conn) or {"run_dir": resolved["run_dir"],
                                                          "worktree": resolved["worktree"]}
    return conn, folders


def suites_by_node(resolved: Resolved) -> dict[str, list[str]]:
    """The run's suites grouped by the node they train on (nodes in suite order)."""
    out: dict[str, list[str]] = {}
    for suite in resolved["suites"]:
        out.setdefault(suite_node(resolved, suite)[0], []).append(suite)
    return out


def _validate_flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise remote.BadInput(f"param {name!r} must be true or false, got {value!r}")
    return value


# --- tasks --------------------------------------------------------------------------------------

@contextmanager
def no_retry_on(*errors: type[BaseException]) -> Iterator[None]:
    """Turn ``errors`` (bad input, missing files: retrying cannot help) into a failure without retry."""
    try:
        yield
    except errors as err:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(err)) from err


def resolve_commit(params: Mapping[str, Any], dag_run_id: str) -> Resolved:
    """Validate params, nodes and record store, then create the run's clean worktree at the commit on
    every node the run uses (the same commit on each)."""
    with no_retry_on(remote.BadInput, ValueError):
        p = validated_params(params)
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
    key = remote.run_key(dag_run_id)
    found: dict[str, dict[str, Any]] = {}
    for conn in nodes:
        values = node_settings(conn)
        with ssh_client(conn) as client:
            reaped = node.reap(client, values["RL_VERIFY_REMOTE_RUNS_DIR"], values["RL_VERIFY_NODE_CHECKOUT"],
                               key, settings.REAP_AFTER_DAYS)
            for folder in reaped:
                log.info("Reaped run folder older than %d days on %s: %s", settings.REAP_AFTER_DAYS, conn, folder)
            with no_retry_on(node.NodeError):
                found[conn] = node.resolve_commit(client, values["RL_VERIFY_NODE_CHECKOUT"],
                                                  values["RL_VERIFY_REMOTE_RUNS_DIR"], key, p["commit"])
    if len({r["sha"] for r in found.values()}) > 1:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(
            f"commit {p['commit']!r} is not the same commit on every node ("
            + ", ".join(f"{conn}: {r['sha'][:12]}" for conn, r in found.items())
            + "): give a full SHA, or update the nodes' checkouts so that they agree")
    resolved: Resolved = {**found[nodes[0]], "run_key": key, "suites": p["suites"],  # type: ignore[typeddict-item]
                          "node": nodes[0], "suite_nodes": p["suite_nodes"],
                          "nodes": {c: {"run_dir": r["run_dir"], "worktree": r["worktree"]} for c, r in found.items()},
                          "early_abort": p["early_abort"], "record": where, "baselines": versions}
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
    from rl_verify import baselines

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


def check_nodes(groups: Mapping[str, tuple[list[str], str]], run_key: str,
                baselines: Mapping[str, Any] | None = None) -> list[Any]:
    """For each node (connection id -> its suites and the worktree they run from), every input of
    every suite present and no other training running; returns the inputs found. Every problem of
    every node is listed in one ``AirflowFailException``."""
    ok: list[Any] = []
    failed: list[tuple[str, node.PrerequisitesError]] = []
    for conn, (suites, worktree) in groups.items():
        values = node_settings(conn)
        specs = expanded_specs(suites, values, worktree, baselines)
        with ssh_client(conn) as client:
            try:
                result = node.check_prerequisites(client, specs, values["RL_VERIFY_REMOTE_RUNS_DIR"], run_key)
            except node.PrerequisitesError as err:
                failed.append((conn, err))
                continue
        ok += result.ok
        log.info("All %d inputs of %s present on %s; the node is free", len(result.ok), ", ".join(suites), conn)
    if failed:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(failed[0][1]) if len(groups) == 1 else
                                   "\n".join(f"node {conn}: {err}" for conn, err in failed))
    return ok


def experiment_card(resolved: Resolved, prereq: Prerequisites, dag_run_id: str,
                    notes: list[str] | None = None) -> Card:
    """Render the card (Markdown) the approver sees, and its experiment fingerprint.

    ``notes`` are shown on the card above the fingerprint (e.g. schedule ticks that never started).
    """
    from rl_verify import baselines, card

    specs = []
    for conn, suites in suites_by_node(resolved).items():
        specs += expanded_specs(suites, node_settings(conn), suite_node(resolved, suites[0])[1]["worktree"],
                                resolved.get("baselines"))
    specs.sort(key=lambda spec: resolved["suites"].index(spec.name))
    versions = resolved.get("baselines") or {}
    with record.workspace(dag_run_id, parts=[f"{s}/{baselines.RECORD_FOLDER}" for s in versions]) as run_dir:
        def data_path(spec: SuiteSpec) -> Path:
            return data_in_use(spec, version_files(run_dir / spec.name))

        sections = card.card_sections(specs, prereq["ok"], resolved.get("suite_nodes") or resolved["node"],
                                      data_path, {s: v["label"] for s, v in versions.items()})
        fingerprint = card.experiment_fingerprint(specs, lambda spec: json.loads(data_path(spec).read_text()),
                                                  {s: v["version"] for s, v in versions.items()})
        markdown = card.render_card(resolved, sections, dag_run_id, fingerprint, notes)
        record.write_atomic(run_dir / "card.md", markdown)
    log.info("Experiment card:\n%s", markdown)
    return {"markdown": markdown, "fingerprint": fingerprint, "gaps": list(notes or [])}


def fetch(suite: str, resolved: Resolved, dag_run_id: str) -> Fetched:
    """Archive the suite's tracker, logs, baseline and checker; fail on a wrong step count.

    The launch script's exit code is not trusted: the tracker's step-summary rows decide whether
    the run completed. What was fetched stays in the record even when this task fails.
    """
    conn, folders = suite_node(resolved, suite)
    spec = expanded_specs([suite], node_settings(conn), folders["worktree"], resolved.get("baselines"))[0]
    with record.workspace(dag_run_id, parts=[suite]) as run_dir:
        return _fetch_into(run_dir / suite, suite, spec, conn, folders)


def _fetch_into(dest: Path, suite: str, spec: SuiteSpec, conn: str, folders: NodeFolders) -> Fetched:
    from rl_verify.tracker import read_tracker

    with ssh_client(conn) as client:
        meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest)
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
        meta["problems"].append(f"{happened}: {hit['means']} (log line: {hit['line']})")
    tracker = meta["files"].get("tracker")
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
        from airflow.sdk.exceptions import AirflowFailException

        # Not retried: the files on the node will not change by asking again.
        raise AirflowFailException(f"{suite}: " + "; ".join(meta["problems"]))
    return {"suite": suite, "steps": meta.get("steps"), "wall_time_s": meta.get("wall_time_s")}


def compare(suite: str, dag_run_id: str) -> dict[str, Any]:
    """Run the engine on the archived files; an unusable fetch becomes an infrastructure FAIL."""

    with record.workspace(dag_run_id, parts=[suite, "commit.json"]) as run_dir:
        return _compare_in(run_dir, suite)


def _compare_in(run_dir: Path, suite: str) -> dict[str, Any]:
    from rl_verify.model import SuiteResult

    suite_dir = run_dir / suite
    meta = record.relocate(record.read_json(suite_dir / "fetch.json"), run_dir)
    out = suite_dir / "compare"
    spec = load_suite(suite)
    if meta is None:
        result = SuiteResult.infrastructure(suite, "nothing was fetched from the node (see fetch task log)")
    elif meta["problems"]:
        result = SuiteResult.infrastructure(suite, "; ".join(meta["problems"]),
                                            remote_work_dir=meta["work_dir"])
    elif meta.get("early_abort"):
        from rl_verify.live import aborted_result, partial_plot

        from rl_verify.thresholds import OpdGolden

        result = aborted_result(suite, meta["early_abort"], engine_of(spec).rules)
        data = engine_of(spec).load_data(data_in_use(spec, version_files(suite_dir)))
        golden = data if isinstance(data, OpdGolden) else None  # golden values as the reference curve
        png = partial_plot(suite, meta["early_abort"]["certain"], suite_dir / "tracker.jsonl",
                           suite_dir / "baseline.jsonl", golden, out)
        if png is not None:
            result.plots.append(str(png))
    else:
        commit = record.read_json(run_dir / "commit.json") or {}
        node_name = (commit.get("suite_nodes") or {}).get(suite, commit.get("node"))
        try:
            result = engine_of(spec).compare_archived(spec, suite_dir, out, meta, node_name, version_files(suite_dir))
        except InputError as err:
            result = SuiteResult.infrastructure(suite, f"cannot evaluate: {err}")
    if meta is not None:
        result.abnormal += fetch_findings(meta)
    watched = record.read_json(suite_dir / "abort.json")
    if watched and not watched.get("applied") and watched.get("certain"):
        result.abnormal.append(
            f"Live check: this run would have been aborted at step {watched['step']} of {watched['expected_steps']} "
            "(early_abort off): " + "; ".join(c["text"] for c in watched["certain"]))
    if watched and not watched.get("applied") and watched.get("log_rule"):
        hit = watched["log_rule"]
        result.abnormal.append(f"Live check: a log rule matched ({hit['means']}: {hit['line']}); early_abort was "
                               "off, so the run went on")
    record.write_json(suite_dir / "result.json", result.to_dict())
    log.info("%s: %s%s", suite, result.verdict, f" ({result.failure_class})" if result.failure_class else "")
    if not result.passed:
        from airflow.sdk.exceptions import AirflowFailException

        # Marked failed so the grid shows which suite failed; the report and verdict still run (all_done).
        raise AirflowFailException(f"FAIL ({result.failure_class}): {suite_line(suite_summary(result))}")
    return result.to_dict()


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
    from rl_verify.model import SuiteResult
    from rl_verify.report import ReportMeta, render_markdown, write_report

    resolved = record.read_json(run_dir / "commit.json") or {}
    suites = resolved.get("suites") or _safe_suites(params)
    notes: list[str] = []
    overall = None
    decision = approval_decision(decision)
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
                        "its approval record)" if decision["standing"] else "") + ".")
    notes += gaps or []
    results = []
    for suite in suites if overall is None else []:
        data = record.relocate(record.read_json(run_dir / suite / "result.json"), run_dir)
        results.append(SuiteResult.from_dict(data) if data else SuiteResult.infrastructure(
            suite, "the suite did not reach comparison (an earlier task failed: see its log)"))
    if not resolved:
        notes.append("The commit could not be resolved on the node (see resolve_commit's log).")
    paths = {s: _paths(run_dir / s, run_dir) for s in suites}
    nodes = resolved.get("suite_nodes")
    meta = ReportMeta(commit=resolved.get("sha"), commit_ref=resolved.get("commit_ref") or params.get("commit"),
                      diff_stat=resolved.get("dirty_stat"), dag_run_id=dag_run_id,
                      node=placement.describe(nodes) if nodes else resolved.get("node") or params.get("node"),
                      paths=paths, notes=notes, overall=overall,
                      baselines={s: v["label"] for s, v in (resolved.get("baselines") or {}).items()})
    where = record.location(dag_run_id)
    written = write_report(run_dir, results, meta, shown_as=where)
    record.write_manifest(run_dir, shown_as=where)
    shown = render_markdown(results, meta).replace(str(run_dir), where)
    log.info("Report written to %s\n\n%s", where, shown)
    verdict = overall or ("PASS" if results and all(r.passed for r in results) else "FAIL")
    classes = sorted({r.failure_class for r in results if r.failure_class})
    return {"verdict": verdict, "failure_classes": classes, "record": where,
            "report": {k: f"{where}/{Path(v).name}" for k, v in written.items()},
            "failed_suites": [r.suite for r in results if not r.passed],
            "suites": [suite_summary(r) for r in results]}


def suite_summary(result: Any) -> SuiteSummary:
    """Verdict, class, breached and unmeasured metrics of one suite (small: it travels through XCom)."""
    breached: dict[str, Breach] = {}
    for c in result.checks:
        if c.breached and c.metric not in breached:
            breached[c.metric] = {"metric": c.metric, "first_breach_step": c.first_breach_step,
                                  "steps": c.breach_steps}
    return {"suite": result.suite, "verdict": result.verdict, "failure_class": result.failure_class,
            "breached": list(breached.values()),
            "missing": sorted({c.metric for c in result.checks if c.missing})}


def suite_line(suite: SuiteSummary) -> str:
    """What failed in one suite, in a few words: "grpo mismatch/mismatch_k3_kl breached at steps 1-45"."""
    said = []
    for b in suite.get("breached", []):
        steps = b.get("steps") or (str(b["first_breach_step"]) if b.get("first_breach_step") is not None else "")
        where = f" at step{'s' if any(c in steps for c in '-,') else ''} {steps}" if steps else ""
        said.append(f"{b['metric']} breached{where}")
    if suite.get("missing"):
        said.append("not measured: " + ", ".join(suite["missing"]))
    return f"{suite['suite']} " + ("; ".join(said) if said else "did not reach a measured verdict (see its tasks)")


def verdict_message(summary: ReportSummary, report_link: str | None = None) -> str:
    """One line: "FAIL (accuracy): grpo mismatch/mismatch_k3_kl breached at steps 1-45; report: <link>".

    With several failure classes, each suite names its own. ``report_link`` defaults to the record.
    """
    classes = summary.get("failure_classes") or ["unknown"]
    failed = [s for s in summary.get("suites") or [] if s["verdict"] != "PASS"]
    parts = [suite_line(s) + (f" ({s.get('failure_class') or 'unknown'})" if len(classes) > 1 else "")
             for s in failed] or [f"suite(s) {', '.join(summary.get('failed_suites', []))}"]
    return f"FAIL ({' + '.join(classes)}): {'; '.join(parts)}; report: {report_link or summary['record']}"


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
        out[f"remote log {Path(log_file['remote']).name}"] = log_file["remote"]
        out[f"archived log {Path(log_file['local']).name}"] = log_file["local"]
    return out


def approval_decision(decision: Decision | None) -> dict[str, Any]:
    """Who approved or rejected, when, whether by standing approval (and granted in which run) or
    whether nobody answered in time (from approve's XCom)."""
    if not decision:
        return {"rejected": False, "timed_out": False, "by": None, "at": None, "standing": False, "granted_in": None}
    return {"rejected": "Reject" in (decision.get("chosen_options") or []),
            "timed_out": bool(decision.get("timed_out")), "by": decision.get("by"), "at": decision.get("at"),
            "standing": bool(decision.get("standing")), "granted_in": decision.get("granted_in")}


def schedule_gaps(run_type: str, logical_date: Any, dag_id: str = settings.DAG_ID) -> list[str]:
    """For a scheduled run: a note naming the schedule ticks since the previous scheduled run that
    never started (a run waited or ran past them); [] when none or not a scheduled run."""
    if run_type != "scheduled" or logical_date is None or settings.SCHEDULE is None:
        return []
    from rl_verify import airflow_api

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
    from airflow.sdk.exceptions import AirflowFailException

    from rl_verify import links

    if not summary:
        raise RuntimeError("no report was written (see the report task's log): the verdict is unknown")
    if summary["verdict"] in ("REJECTED", "NOT APPROVED"):
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(f"{summary['verdict']}: nothing was launched")
    view = links.absolute(links.ui_base_url(), links.report_view_path(settings.DAG_ID, dag_run_id))
    _notify_verdict(summary, dag_run_id)
    line = verdict_message(summary, view) if summary["verdict"] != "PASS" else f"PASS; report: {view}"
    _note_run(dag_run_id, line)
    if summary["verdict"] != "PASS":
        log.error("%s", line)
        raise AirflowFailException(line)  # not retried: the verdict will not change
    log.info("PASS: every checked metric of %s is within its threshold; report: %s",
             ", ".join(s["suite"] for s in summary.get("suites") or []), view)
    return "PASS"


def _note_run(dag_run_id: str, note: str) -> None:
    """The verdict line as the DAG run's note (through the REST API; the Task SDK cannot write notes)."""
    from rl_verify import airflow_api

    try:
        airflow_api.set_run_note(settings.AIRFLOW_API_CONN_ID, settings.DAG_ID, dag_run_id, note)
    except Exception as err:  # the verdict task's own message says the same
        log.warning("Could not set the run's note through %r (%s): the verdict is in this log and the report",
                    settings.AIRFLOW_API_CONN_ID, err)


def _notify_verdict(summary: ReportSummary, dag_run_id: str) -> None:
    """Post the verdict with the commit and the first suggested next step of a failing suite."""
    from rl_verify import notify

    report = record.get_json(dag_run_id, "report.json") or {}
    commit = f"{report.get('commit_ref') or '?'} ({(report.get('commit') or '')[:10] or 'unresolved'})"
    failing = [s for s in report.get("suites") or [] if s.get("verdict") != "PASS" and s.get("next_steps")]
    step = failing[0]["next_steps"][0].removeprefix("Inference: ") if failing else None
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
    fetched = [f"{suite}/fetch.json" for suite in resolved["suites"]]
    with record.workspace(dag_run_id, parts=fetched) as run_dir:
        for conn, suites in suites_by_node(resolved).items():
            folders = suite_node(resolved, suites[0])[1]
            with ssh_client(conn) as client:
                lines += node.cleanup(client, folders["run_dir"], resolved["run_key"])
                for suite in suites if failed_tasks else []:  # archive what a failed suite left
                    dest = run_dir / suite
                    if (dest / "fetch.json").exists():
                        continue
                    spec = expanded_specs([suite], node_settings(conn), folders["worktree"])[0]
                    meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest)
                    record.write_json(dest / "fetch.json", {**meta, "problems": meta["problems"] or
                                                            ["collected by cleanup after a failure"]})
    for line in lines:
        log.info("cleanup: %s", line)
    left = [line for line in lines if line.startswith("LEFT")]
    log.info("cleanup: the node is %s", "clean: no process of this run is left" if not left else
             f"NOT clean: {len(left)} process(es) of this run still run: " + "; ".join(left))
    _notify_infrastructure(failed_tasks or [], resolved, dag_run_id, lines, not left)
    return lines


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
    from rl_verify import notify

    stopped = {f"run_{s}" for s in (resolved or {}).get("suites", [])
               if (record.get_json(dag_run_id, f"{s}/abort.json") or {}).get("certain")}
    infra = [t for t in failed_tasks if t not in stopped]
    if not infra:
        log.info("No infrastructure failure to report (%s)", "the failing suites were stopped by the live check"
                 if failed_tasks else "no failed task was named")
        return
    commit = (resolved or {}).get("commit_ref") or "?"
    notify.send(*notify.infrastructure(infra, commit, dag_run_id, lines, clean), failure=True)
