"""The demo/test rig: a simulated GPU node plus a real local Airflow, wired like a deployment.

Used by ``make demo`` (scripts/demo.py) and the end-to-end tests, so both exercise the same path a
user's deployment takes: an SSH connection with a pinned host key, share roots in the environment,
a one-slot node pool, a triggered run, an approval through the human-in-the-loop REST API.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.airflow_api import AirflowClient
from harness.airflow_stack import DB_TEMPLATES, AirflowStack, WorkerSpec
from harness.processes import free_port
from harness.services import Postgres, Redis, S3Server, postgres_bin_dir, postgres_template
from simulator import node as sim

DAG_ID = "rl_accuracy_verification"
CONN_ID = "rl_gpu_node"
POOL = "rl_node_rl_gpu_node"


API_CONN_ID = "rl_verify_airflow_api"
#: The rig's private Slurm (issue 45): the partition and the account its connection names.
SLURM_PARTITION = "gpu"
SLURM_ACCOUNT = "rl-verify"


def deployment_env(node: Mapping[str, Any], record_root: Path | str, poll_s: int = 1,
                   schedule: str | None = None, launcher: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Environment that points the DAG at the simulated node (what .env.example documents).

    ``schedule``: a cron for scheduled runs; None keeps the rig to manual runs only. ``launcher``: the connection's
    launcher extras (``{"launcher": "slurm", "slurm_partition": ...}``: the node is a Slurm login node).
    """
    conn = {"conn_type": "ssh", "host": node["host"], "port": node["port"], "login": node["user"],
            "extra": {"key_file": node["client_key"], "host_key": node["host_key"],
                      "no_host_key_check": False, **_own_ray(node), **(launcher or {})}}
    return {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
        **node["env"],
        "RL_VERIFY_NODE_CHECKOUT": node["checkout"],
        "RL_VERIFY_REMOTE_RUNS_DIR": f"{node['root']}/runs",
        "RL_VERIFY_RECORD_ROOT": str(record_root),
        "RL_VERIFY_JOB_POLL_INTERVAL_S": str(poll_s),
        "RL_VERIFY_CHECKER_TIMEOUT_S": "300",
        # The simulated node frees a stopped run's GPU memory at once; under its gpu-held fault cleanup waits
        # this bound (default 60 s) before it reports the memory still held.
        "RL_VERIFY_GPU_RELEASE_WAIT_S": "5",
        # Manual runs only unless asked: an unpaused nightly schedule would queue a scheduled run
        # (waiting for its approval) ahead of the run the demo or test triggers (max_active_runs=1).
        "RL_VERIFY_SCHEDULE": schedule or "none",
        # Every run trains unless it asks for the path-aware skip (conf "lane": "auto"): the demos and most tests
        # run a commit that already PASSed on the same rig, and are about what a training does.
        "RL_VERIFY_LANE": "full",
    }


def _own_ray(node: Mapping[str, Any]) -> dict[str, str]:
    """A simulated node's launch script binds the node's own "fixed" Ray ports and /tmp (simulated nodes share
    one machine): the connection's extras say so, as for a real node whose script was adapted."""
    extra = {}
    if node.get("ray_ports"):
        extra["rl_verify_ray_ports"] = ",".join(str(p) for p in node["ray_ports"])
    if node.get("ray_log"):
        extra["rl_verify_ray_log"] = node["ray_log"]
    return extra


def node_connection_env(conn_id: str, node: Mapping[str, Any], host_key: bool = True) -> dict[str, str]:
    """An SSH connection to a simulated node carrying its own settings in its extras (share roots,
    checkout, runs folder), as a deployment with several nodes configures each node.

    ``host_key=False`` leaves the host key unpinned (the DAG must refuse such a node).
    """
    extra: dict[str, Any] = {"key_file": node["client_key"], "no_host_key_check": not host_key,
                             **{k.lower(): v for k, v in node["env"].items()},
                             "rl_verify_node_checkout": node["checkout"],
                             "rl_verify_remote_runs_dir": f"{node['root']}/runs"}
    extra.update(_own_ray(node))
    if host_key:
        extra["host_key"] = node["host_key"]
    conn = {"conn_type": "ssh", "host": node["host"], "port": node["port"], "login": node["user"], "extra": extra}
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}


def api_connection_env(base_url: str, username: str, password: str) -> dict[str, str]:
    """The connection through which tasks read Airflow's own records (standing approvals)."""
    conn = {"conn_type": "http", "host": base_url, "login": username, "password": password}
    return {f"AIRFLOW_CONN_{API_CONN_ID.upper()}": json.dumps(conn)}


def compute_nodes_prolog(roots: list[Path]) -> str:
    """Slurm's TaskProlog for the rig's one slurmd of 8 GPUs per simulated node: GPUs 8k..8k+7 are compute node k,
    simulated node k's root (its fake ray and nvidia-smi, its RLSIM_NODE, its Ray ports), and the job sees them as
    0..7, as a real 8-GPU node's job does. Two 8-GPU jobs then run as on two machines (one ``ray stop`` does not
    end the other's Ray), which one shared node root could not give."""
    cases = "\n".join(f"{k}) root={shlex.quote(str(root))} ;;" for k, root in enumerate(roots))
    return f"""#!/bin/sh
# Generated by harness.rig: which simulated compute node a Slurm job landed on, by the GPUs Slurm gave it.
gpus=${{SLURM_JOB_GPUS:-}}
[ -n "$gpus" ] || exit 0
first=${{gpus%%,*}}
case $((first / 8)) in
{cases}
*) exit 0 ;;
esac
n=$(printf '%s\n' "$gpus" | tr ',' '\n' | grep -c .)
echo "export RLSIM_NODE=$root"
echo "export PATH=$root/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
echo "export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))"
"""


@dataclass
class RunOutcome:
    run_id: str
    state: str
    tasks: dict[str, str | None]
    summary: dict[str, Any] | None
    timings: dict[str, float] = field(default_factory=dict)
    approval: dict[str, Any] | None = None


#: Object store of the distributed rig: the bucket and the Airflow connection named in the record root.
RECORDS_BUCKET = "rl-verify"
RECORDS_CONN_ID = "rl_verify_records"
WORKERS = ("worker-a", "worker-b")


DATABASES = ("sqlite", "postgres")


def migrated_postgres_template() -> Path:
    """A stopped PostgreSQL cluster whose database ``airflow`` this Airflow version has migrated (made once per
    Airflow and PostgreSQL version, under .state/db-templates): a rig's cluster is a copy of it."""
    from importlib.metadata import version

    def migrate(url: str) -> None:
        AirflowStack(DB_TEMPLATES / "pg-migrate", database_url=url).migrate()

    return postgres_template(DB_TEMPLATES, f"pg{postgres_bin_dir().parent.name}-airflow-{version('apache-airflow')}",
                             migrate)


class Rig:
    """Start/stop the simulated node(s) and Airflow; trigger and approve runs of the DAG.

    Embedded (default): LocalExecutor on SQLite, the record in a local folder, one node.
    ``database="postgres"``: the same on a private PostgreSQL cluster (a copy of a migrated template). SQLite lets
    one writer in at a time: on two loaded cores a two-node bisection's heartbeats, task states and scheduler
    loop queued on its lock until the scheduler died of "database is locked" mid-test. The e2e tests use it.
    ``distributed=True``: PostgreSQL, Redis, CeleryExecutor with two workers (each with its own
    working and staging folders), the record in a SeaweedFS S3 bucket; ``nodes`` simulated nodes,
    connections ``rl_gpu_node``, ``rl_gpu_node_2``, ... each with its one-slot pool.
    """

    def __init__(self, state_dir: Path, record_root: Path | None = None, step_seconds: float = 1.0,
                 nodes: int = 1, distributed: bool = False, database: str = "sqlite", slurm_gpus: int = 0) -> None:
        if database not in DATABASES:
            raise ValueError(f"database must be one of {', '.join(DATABASES)}, not {database!r}")
        self.database = "postgres" if distributed else database
        self.state_dir = Path(state_dir).resolve()
        self.record_root: Path | str = Path(record_root).resolve() if record_root else self.state_dir / "records"
        self.step_seconds = step_seconds
        self.node_count = nodes
        self.distributed = distributed
        self.node: dict[str, Any] | None = None
        self.nodes: dict[str, dict[str, Any]] = {}  # connection id -> simulated node
        self.services: list[Any] = []
        self.s3: Any = None
        self.stack: AirflowStack | None = None
        self.client: AirflowClient | None = None
        self.timings: dict[str, float] = {}
        #: ``slurm_gpus`` > 0: a private single-node Slurm with that many GPUs (harness.slurm), the node its login
        #: node and the connection's launcher ``slurm`` (issue 45); its pool has a slot per 8-GPU job it runs at once.
        self.slurm_gpus = slurm_gpus
        self.slurm: Any = None

    def node_state(self, conn_id: str = CONN_ID) -> Path:
        """The state folder of the simulated node behind ``conn_id``."""
        return self.state_dir / ("node" if conn_id == CONN_ID else f"node-{conn_id.rsplit('_', 1)[1]}")

    def worker_staging(self, worker: str) -> Path:
        """The local staging folder of a Celery worker of the distributed rig."""
        return self.state_dir / "workers" / worker / "staging"

    def start(self, extra_env: Mapping[str, str] | Callable[["Rig"], Mapping[str, str]] | None = None,
              schedule: str | None = None) -> "Rig":
        """Start the node(s), services and Airflow. ``extra_env`` may be a function of the rig, called
        once the nodes are up (for connections to them)."""
        t0 = time.monotonic()
        conn_ids = [CONN_ID] + [f"{CONN_ID}_{i}" for i in range(2, self.node_count + 1)]
        login_env: dict[str, str] = {}
        if self.slurm_gpus:
            from harness.slurm import Slurm

            prolog = self.state_dir / "slurm-task-prolog.sh"
            prolog.parent.mkdir(parents=True, exist_ok=True)
            prolog.write_text(compute_nodes_prolog([self.node_state(c) / "node" for c in conn_ids]))
            prolog.chmod(0o755)
            self.slurm = Slurm(self.state_dir / "slurm", gpus=self.slurm_gpus, partition=SLURM_PARTITION,
                               accounts=(SLURM_ACCOUNT, "ml-infra"), task_prolog=prolog,
                               # sacct answers for a job slurmctld forgot, as on a production cluster (issue 54).
                               accounting=True)
            self.services.append(self.slurm)
            self.slurm.start()
            login_env = dict(self.slurm.env)
            self.timings["slurm start"] = time.monotonic() - t0
        for conn_id in conn_ids:
            self.nodes[conn_id] = sim.start_node(self.node_state(conn_id), step_seconds=self.step_seconds,
                                                 login_env=login_env)
        self.node = self.nodes[CONN_ID]
        self.timings["node start"] = time.monotonic() - t0
        t1 = time.monotonic()
        kwargs: dict[str, Any] = {}
        services_env: dict[str, str] = {}
        if self.distributed:
            kwargs, services_env = self._start_services()
        elif self.database == "postgres":
            pg = Postgres(self.state_dir / "services" / "postgres", template=migrated_postgres_template())
            self.services.append(pg)
            pg.start()
            kwargs = {"database_url": pg.sqlalchemy_url, "database_migrated": True}
            self.timings["services start"] = time.monotonic() - t1
        self.stack = AirflowStack(self.state_dir / "airflow", port=free_port(), **kwargs)
        self.stack.ensure_password()
        env = {**deployment_env(self.node, self.record_root, schedule=schedule, launcher=self.launcher_extra()),
               **{k: v for c in conn_ids[1:] for k, v in node_connection_env(c, self.nodes[c]).items()},
               **services_env,
               **api_connection_env(self.stack.base_url, self.stack.username, self.stack.password),
               **((extra_env(self) if callable(extra_env) else extra_env) or {})}
        if schedule is None:
            # An unchanged DAG file re-parsed every 10 minutes, not every minute (new files are still seen within
            # 3 s): 2.4 s of CPU saved per 30 s run. A scheduled rig keeps the minute: with 10 minutes the nightly
            # test's run after a card that outlived two ticks was once given the older tick (no skipped tick).
            env.setdefault("AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL", "600")
        self.stack.start(extra_env=env)
        # worker_released: an approval is answered as soon as Airflow can take it (AirflowClient.wait_for_hitl),
        # not after the 8 s settle a client without the scheduler's log waits.
        self.client = AirflowClient(self.stack.base_url, self.stack.username, self.stack.password,
                                    worker_released=self.stack.worker_released)
        for conn_id in conn_ids:
            if self.slurm_gpus and conn_id == CONN_ID:
                self.client.create_pool(f"rl_node_{conn_id}", self.slurm_slots, include_deferred=True,
                                        description=f"As many trainings as Slurm partition {SLURM_PARTITION} runs "
                                                    "at once")
                continue
            self.client.create_pool(f"rl_node_{conn_id}", 1, include_deferred=True,
                                    description=f"One training at a time on the simulated GPU node {conn_id}")
        self.enable_dag(DAG_ID)
        self.timings["airflow start"] = time.monotonic() - t1
        return self

    @property
    def slurm_slots(self) -> int:
        """How many 8-GPU jobs the rig's Slurm runs at once (0: no Slurm)."""
        return self.slurm_gpus // 8

    def launcher_extra(self, **fields: str) -> dict[str, str] | None:
        """The main connection's launcher extras: Slurm's partition and account (``fields`` override them), or None
        for a rig without Slurm (the SSH launcher)."""
        if not self.slurm_gpus:
            return None
        # Not exclusive: the rig's one slurmd of 16 GPUs stands for two 8-GPU nodes (its TaskProlog places each job on
        # one), so a whole-node job would keep the second simulated node idle.
        return {"launcher": "slurm", "slurm_partition": SLURM_PARTITION, "slurm_account": SLURM_ACCOUNT,
                "slurm_exclusive": "false", **fields}

    def enable_dag(self, dag_id: str) -> None:
        """Waits until Airflow has parsed ``dag_id``, then unpauses it (a DAG beside the verification DAG that a
        test or demo triggers: the bisection, probe and calibration DAGs)."""
        assert self.client is not None
        self.client.wait_for_dag(dag_id)
        self.client.unpause(dag_id)

    def _start_services(self) -> tuple[dict[str, Any], dict[str, str]]:
        """PostgreSQL, Redis and the S3 server; the Celery stack's arguments and the record store's env."""
        t0 = time.monotonic()
        base = self.state_dir / "services"
        pg = Postgres(base / "postgres", template=migrated_postgres_template())
        redis, s3 = Redis(base / "redis"), S3Server(base / "s3")
        for service in (pg, redis, s3):
            self.services.append(service)
            service.start()
        s3.create_bucket(RECORDS_BUCKET)
        self.s3 = s3
        self.record_root = f"s3://{RECORDS_CONN_ID}@{RECORDS_BUCKET}/records"
        self.timings["services start"] = time.monotonic() - t0
        workers = [WorkerSpec(name, concurrency=2, cwd=self.state_dir / "workers" / name,
                              env={"RL_VERIFY_STAGING_DIR": str(self.worker_staging(name))})
                   for name in WORKERS]
        for name in WORKERS:
            self.worker_staging(name).mkdir(parents=True, exist_ok=True)
        return ({"executor": "CeleryExecutor", "database_url": pg.sqlalchemy_url, "database_migrated": True,
                 "broker_url": redis.url,
                 "celery_workers": workers}, s3.airflow_connection_env(RECORDS_CONN_ID))

    def stop(self) -> None:
        if self.client:
            self.client.close()
        if self.stack:
            self.stack.stop()
        for conn_id in self.nodes:
            sim.stop_node(self.node_state(conn_id))
        for service in reversed(self.services):
            service.stop()

    def __enter__(self) -> "Rig":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, conf: Mapping[str, Any], decision: str | None = "Approve", timeout: float = 600,
            standing: bool = False, during: Callable[[str], Any] | None = None,
            run_id: str | None = None, on_card: Callable[[str], Any] | None = None) -> RunOutcome:
        """Trigger a run, answer the approval with ``decision`` (None: expect no wait), wait for the end.

        ``during(run_id)``, when given, is called once the approval is answered and before waiting
        for the end (fault-injection tests use it to act on the running DAG run and the node).
        ``run_id`` fixes the DAG run's id (its repeats' seeds derive from it): default Airflow's.
        ``on_card(run_id)``: called while the card waits, before it is answered (the node changing after
        the prerequisites passed).
        """
        assert self.client is not None
        t0 = time.monotonic()
        run_id = self.client.trigger(DAG_ID, conf=dict(conf), run_id=run_id)
        timings: dict[str, float] = {}
        approval = None
        if decision is not None:
            detail = self.client.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=timeout)
            timings["until approval asked"] = time.monotonic() - t0
            if on_card is not None:
                on_card(run_id)
            offered = "standing_approval" in ((detail or {}).get("params") or {})  # scheduled runs only
            approval = self.client.respond_hitl(DAG_ID, run_id, "approve", [decision],
                                                params_input={"standing_approval": standing} if offered else None)
            approval = approval or detail
        t1 = time.monotonic()
        if during is not None:
            during(run_id)
        state = self.client.wait_for_run(DAG_ID, run_id, timeout=timeout)
        timings["after approval until end"] = time.monotonic() - t1
        tasks = self.client.task_states(DAG_ID, run_id)
        summary = None
        if tasks.get("report") == "success":
            summary = self.client.xcom(DAG_ID, run_id, "report")
        timings["total"] = time.monotonic() - t0
        return RunOutcome(run_id, state, tasks, summary, timings, approval)

    def task_durations(self, run_id: str) -> dict[str, float]:
        """Seconds each task instance spent from start to end, as Airflow recorded them."""
        assert self.client is not None
        out = {}
        for ti in self.client.task_instances(DAG_ID, run_id):
            if ti.get("duration") is not None:
                out[ti["task_id"]] = float(ti["duration"])
        return out
