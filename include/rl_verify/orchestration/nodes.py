"""What every DAG's tasks need of a GPU node: its settings, an SSH client, whether it can be used.

Shared by the task bodies of the verification DAG (``verification``), of the calibration DAG
(``calibration``) and by the training operator. Settings are read at run time (connection extras >
Airflow Variables > environment), never at parse time; every problem of every node is listed before
anything fails.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from rl_verify import settings
from rl_verify.engines import engine_of, load_suite
from rl_verify.node import launcher as launchers
from rl_verify.node import ops as node
from rl_verify.node import placement, remote
from rl_verify.orchestration import airflow_api
from rl_verify.orchestration.contract import NodeFolders, Resolved
from rl_verify.store.baselines import RECORD_FOLDER, VERSION_FILE
from rl_verify.suites.spec import NodeNeeds, SuiteSpec

log = logging.getLogger(__name__)


def node_settings(conn_id: str) -> dict[str, str]:
    """Share roots, checkout and runs dir for a node: connection extras > Variables > environment.

    Raises ValueError listing every setting that is missing, with where to set it.
    """
    from airflow.sdk import BaseHook, Variable  # the Task SDK: kept out of the module's import (policy, CLI)

    extras = BaseHook.get_connection(conn_id).extra_dejson or {}
    wanted = {**{v: None for v in settings.SHARE_ROOT_VARS},
              settings.NODE_CHECKOUT_KEY: settings.NODE_CHECKOUT,
              settings.REMOTE_RUNS_DIR_KEY: settings.REMOTE_RUNS_DIR}
    values: dict[str, str] = {}
    for name, default in wanted.items():
        value = extras.get(name.lower()) or extras.get(name) or Variable.get(name, default=None) \
            or os.environ.get(name) or default
        if value:
            values[name] = str(value)
    # Optional: a node whose launch script was adapted to other Ray ports or another shared Ray log folder
    # (the simulated nodes, which share one machine) says so; the suite specs' values hold otherwise.
    for name in ("RL_VERIFY_RAY_PORTS", "RL_VERIFY_RAY_LOG"):
        value = extras.get(name.lower()) or extras.get(name)
        if value:
            values[name] = str(value)
    missing = [n for n in wanted if n not in values]
    if missing:
        raise ValueError(f"node {conn_id!r}: {', '.join(missing)} not set; set them in the connection's "
                         f"extras (lower-case keys), as Airflow Variables, or in the environment")
    for name, value in values.items():
        if name == "RL_VERIFY_RAY_PORTS":
            if not all(p.strip().isdigit() and 0 < int(p) < 65536 for p in value.split(",")):
                raise ValueError(f"node {conn_id!r}: rl_verify_ray_ports {value!r} must be TCP ports separated by "
                                 "commas, e.g. 6379,8265")
            continue
        remote.validate_path(value, name)
    return values


def node_launcher(conn_id: str) -> dict[str, Any]:
    """How trainings reach the GPUs of ``conn_id`` (issue 45): its extras' ``launcher`` (``ssh``, the default, or
    ``slurm`` with its ``slurm_*`` fields), as ``node.launcher.launcher_config`` validates it (BadInput naming every
    bad field)."""
    from airflow.sdk import BaseHook  # the Task SDK: kept out of the module's import (policy, CLI)

    return launchers.launcher_config(BaseHook.get_connection(conn_id).extra_dejson or {}, conn_id)


def node_needs(specs: list[SuiteSpec], values: Mapping[str, str]) -> NodeNeeds:
    """What the suites' launch scripts need of this node, with its own Ray ports and log folder if it says."""
    ports = tuple(int(p) for p in values["RL_VERIFY_RAY_PORTS"].split(",")) if values.get("RL_VERIFY_RAY_PORTS") \
        else None
    return node.merged_needs(specs, ports, values.get("RL_VERIFY_RAY_LOG"))


def _login(conn_id: str) -> str:
    """The SSH user of a node's connection, for messages ("alice's hard open-files limit")."""
    from airflow.sdk import BaseHook  # the Task SDK: kept out of the module's import (policy, CLI)

    return BaseHook.get_connection(conn_id).login or "the SSH user"


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
    return [expanded_spec(load_suite(s), values, worktree, versions) for s in suites]


def expanded_spec(spec: SuiteSpec, values: Mapping[str, str], worktree: str,
                  versions: Mapping[str, Mapping[str, Any]] | None = None) -> SuiteSpec:
    """``spec`` (already read) with share roots and ``${CHECKOUT}`` filled in, as ``expanded_specs`` does."""
    return spec_in_use(spec.expanded({**values, "CHECKOUT": worktree}), (versions or {}).get(spec.name))


def spec_in_use(spec: SuiteSpec, version: Mapping[str, Any] | None) -> SuiteSpec:
    """``spec`` as judged against ``version``: without the share's baseline tracker when the version
    holds the tracker itself."""
    engine = engine_of(spec)
    if version is None or engine.baseline_is_data or engine.baseline_file not in version.get("files", ()):
        return spec
    return spec.model_copy(update={"baseline": None,
                                   "inputs": [i for i in spec.inputs if i.path != spec.baseline]})


def version_files(suite_dir: Path) -> dict[str, Path]:
    """The files of the baseline version a suite is judged against, in a pulled record (name -> path)."""
    folder = suite_dir / RECORD_FOLDER
    return {p.name: p for p in sorted(folder.iterdir()) if p.name != VERSION_FILE} if folder.is_dir() else {}


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
    for read in (node_settings, node_launcher):
        try:
            read(conn_id)
        except ValueError as err:  # BadInput too
            problems.append(str(err))
    return problems


def pool_problems(conn_ids: list[str]) -> list[str]:
    """Nodes whose one-slot pool is missing (their training would never be scheduled), read through the
    Airflow API connection; [] when the API cannot be asked (logged)."""
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
        elif is_slurm(conn_id):
            if not pool["include_deferred"]:
                log.warning("Pool %s does not count deferred tasks: a waiting training takes no slot, so more jobs "
                            "may queue in Slurm than the pool says", name)
        elif pool["slots"] != 1 or not pool["include_deferred"]:
            log.warning("Pool %s has %s slot(s), deferred tasks %scounted: give it 1 slot counting deferred tasks, "
                        "or two trainings may share node %s", name, pool["slots"],
                        "" if pool["include_deferred"] else "not ", conn_id)
    return problems


def is_slurm(conn_id: str) -> bool:
    """Whether the connection leads to a Slurm login node (a training's compute node is then Slurm's choice)."""
    try:
        return node_launcher(conn_id)["kind"] == launchers.SLURM
    except ValueError:  # said by node_problems
        return False


def suite_node(resolved: Resolved, suite: str) -> tuple[str, NodeFolders]:
    """(connection id, the run's folders) of the node ``suite`` trains on in this run."""
    conn = (resolved.get("suite_nodes") or {}).get(suite, resolved["node"])
    folders = (resolved.get("nodes") or {}).get(conn) or {"run_dir": resolved["run_dir"],
                                                          "worktree": resolved["worktree"]}
    return conn, folders


def suites_by_node(resolved: Resolved, training_only: bool = False) -> dict[str, list[str]]:
    """The run's suites grouped by the node they train on (nodes in suite order); ``training_only``: without
    the suites the path-aware skip ended PASS (unchanged)."""
    out: dict[str, list[str]] = {}
    for suite in resolved["suites"]:
        if training_only and suite in (resolved.get("unchanged") or {}):
            continue
        out.setdefault(suite_node(resolved, suite)[0], []).append(suite)
    return out


@contextmanager
def no_retry_on(*errors: type[BaseException]) -> Iterator[None]:
    """Turn ``errors`` (bad input, missing files: retrying cannot help) into a failure without retry."""
    try:
        yield
    except errors as err:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(err)) from err


def check_nodes(groups: Mapping[str, tuple[list[str], str]], run_key: str,
                baselines: Mapping[str, Any] | None = None,
                environments: dict[str, dict[str, Any]] | None = None) -> list[Any]:
    """For each node (connection id -> its suites and the worktree they run from), every input of
    every suite present and no other training running; returns the inputs found. Every problem of
    every node is listed in one ``AirflowFailException``. ``environments``, when given, is filled with each
    node's environment as the same round trip saw it (``Prerequisites.environment``)."""
    ok: list[Any] = []
    failed: list[tuple[str, node.PrerequisitesError]] = []
    for conn, (suites, worktree) in groups.items():
        values = node_settings(conn)
        launcher = node_launcher(conn)
        specs = expanded_specs(suites, values, worktree, baselines)
        with ssh_client(conn) as client:
            def check() -> node.Prerequisites:
                return node.check_prerequisites(client, specs, values[settings.REMOTE_RUNS_DIR_KEY], run_key,
                                                node_needs(specs, values), _login(conn), launcher, conn)
            try:
                try:
                    result = check()
                except node.PrerequisitesError as err:
                    # A job of a run that has ended (its cleanup could not stop it) is stopped, then checked again.
                    if not stop_jobs_of_ended_runs(client, conn, launcher, err.result, run_key):
                        raise
                    result = check()
            except node.PrerequisitesError as err:
                failed.append((conn, err))
                continue
        ok += result.ok
        if environments is not None and launcher["kind"] != launchers.SLURM:
            environments[conn] = result.environment
        if launcher["kind"] == launchers.SLURM:
            log.info("All %d inputs of %s present on %s's shared filesystem; Slurm partition %s is up and accepts "
                     "this run's job (sbatch --test-only); it runs %s such job(s) at once", len(result.ok),
                     ", ".join(suites), conn, launcher["partition"], result.slots)
            _compare_slots(conn, result.slots)
        else:
            log.info("All %d inputs of %s present on %s; the node is free", len(result.ok), ", ".join(suites), conn)
    if failed:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(failed[0][1]) if len(groups) == 1 else
                                   "\n".join(f"node {conn}: {err}" for conn, err in failed))
    return ok


#: The DAGs whose runs start jobs on the nodes: a job's run key is looked up among their runs.
JOB_DAG_IDS = [settings.DAG_ID, settings.PROBE_DAG_ID, settings.CALIBRATION_DAG_ID]
#: Airflow's states of a DAG run that has ended.
ENDED_RUN_STATES = ("success", "failed")


def ended_runs(busy_jobs: list[dict[str, str]], runs: Mapping[str, Mapping[str, str]],
               own_key: str) -> dict[str, dict[str, str]]:
    """Of the live jobs ``busy_jobs`` (``Prerequisites.busy_jobs``), those whose run Airflow knows (``runs``, by
    key: ``airflow_api.runs_by_key``) and says has ended: run key -> its run and the job's folder. A job whose key
    Airflow does not know (another deployment's run, one older than the runs read) is never one of them."""
    out: dict[str, dict[str, str]] = {}
    for job in busy_jobs:
        run = runs.get(job["run"])
        if job["run"] != own_key and run and run.get("state") in ENDED_RUN_STATES:
            out.setdefault(job["run"], {**run, "run_dir": job["run_dir"]})
    return out


def stop_jobs_of_ended_runs(client: Any, conn: str, launcher: Mapping[str, Any] | None,
                            result: node.Prerequisites | None, own_key: str,
                            lookup: Any = None) -> list[str]:
    """Stop every live job on the node whose run has ended, as the job's marker (its run key) and Airflow's
    record of that run say (issue 54: a cleanup that could not stop it, a node that was down then); each stop
    logged and returned, one line a run. Airflow silent: nothing is stopped (the node stays busy, named)."""
    jobs = (result.busy_jobs if result else [])
    if not jobs or (launcher or {}).get("kind") == launchers.SLURM:
        return []
    keys = {j["run"] for j in jobs if j["run"] != own_key}
    if not keys:  # only this run's own jobs: nothing to ask Airflow about
        return []
    try:
        runs = (lookup or airflow_api.runs_by_key)(settings.AIRFLOW_API_CONN_ID, JOB_DAG_IDS, keys)
    except Exception as err:  # the API's silence is no answer: the busy node stays refused, as it says
        log.warning("Could not ask Airflow whether the run(s) of the jobs on %s have ended (%s): they are left "
                    "running", conn, err)
        return []
    said = []
    for key, run in sorted(ended_runs(jobs, runs, own_key).items()):
        lines = node.cleanup(client, run["run_dir"], key, launcher)
        line = (f"run {run['run_id']} of {run['dag_id']} ended {run['state']}, but its job(s) still ran on {conn}: "
                f"stopped them ({'; '.join(lines[-2:])})")
        log.warning("%s", line)
        said.append(line)
    return said


def _compare_slots(conn_id: str, slots: int | None) -> None:
    """Say when a Slurm target's pool holds more or fewer slots than its partition runs such jobs at once (the pool
    bounds how many trainings Airflow hands Slurm; Slurm places them)."""
    if not slots:
        return
    name = placement.node_pool(conn_id)
    try:
        pool = airflow_api.pool(settings.AIRFLOW_API_CONN_ID, name)
    except airflow_api.ApiUnavailable:
        return
    if pool is not None and pool["slots"] != slots:
        log.warning("Pool %s has %s slot(s); partition of %s runs %d such job(s) at once: set `airflow pools set %s "
                    "%d ... --include-deferred` so as many trainings run as Slurm grants", name, pool["slots"],
                    conn_id, slots, name, slots)
