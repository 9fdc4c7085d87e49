"""The demo/test rig: a simulated GPU node plus a real local Airflow, wired like a deployment.

Used by ``make demo`` (scripts/demo.py) and the end-to-end tests, so both exercise the same path a
user's deployment takes: an SSH connection with a pinned host key, share roots in the environment,
a one-slot node pool, a triggered run, an approval through the human-in-the-loop REST API.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.airflow_stack import AirflowClient, AirflowStack, free_port
from simulator import node as sim

DAG_ID = "rl_accuracy_verification"
CONN_ID = "rl_gpu_node"
POOL = "rl_node_rl_gpu_node"


API_CONN_ID = "rl_verify_airflow_api"


def deployment_env(node: Mapping[str, Any], record_root: Path, poll_s: int = 1,
                   schedule: str | None = None) -> dict[str, str]:
    """Environment that points the DAG at the simulated node (what .env.example documents).

    ``schedule``: a cron for scheduled runs; None keeps the rig to manual runs only.
    """
    conn = {"conn_type": "ssh", "host": node["host"], "port": node["port"], "login": node["user"],
            "extra": {"key_file": node["client_key"], "host_key": node["host_key"],
                      "no_host_key_check": False}}
    return {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(conn),
        **node["env"],
        "RL_VERIFY_NODE_CHECKOUT": node["checkout"],
        "RL_VERIFY_REMOTE_RUNS_DIR": f"{node['root']}/runs",
        "RL_VERIFY_RECORD_ROOT": str(record_root),
        "RL_VERIFY_JOB_POLL_INTERVAL_S": str(poll_s),
        "RL_VERIFY_CHECKER_TIMEOUT_S": "300",
        # Manual runs only unless asked: an unpaused nightly schedule would queue a scheduled run
        # (waiting for its approval) ahead of the run the demo or test triggers (max_active_runs=1).
        "RL_VERIFY_SCHEDULE": schedule or "none",
    }


def api_connection_env(base_url: str, username: str, password: str) -> dict[str, str]:
    """The connection through which tasks read Airflow's own records (standing approvals)."""
    conn = {"conn_type": "http", "host": base_url, "login": username, "password": password}
    return {f"AIRFLOW_CONN_{API_CONN_ID.upper()}": json.dumps(conn)}


@dataclass
class RunOutcome:
    run_id: str
    state: str
    tasks: dict[str, str | None]
    summary: dict[str, Any] | None
    timings: dict[str, float] = field(default_factory=dict)
    approval: dict[str, Any] | None = None


class Rig:
    """Start/stop the simulated node and Airflow; trigger and approve runs of the DAG."""

    def __init__(self, state_dir: Path, record_root: Path, step_seconds: float = 1.0) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.record_root = Path(record_root).resolve()
        self.step_seconds = step_seconds
        self.node: dict[str, Any] | None = None
        self.stack: AirflowStack | None = None
        self.client: AirflowClient | None = None
        self.timings: dict[str, float] = {}

    def start(self, extra_env: Mapping[str, str] | None = None, schedule: str | None = None) -> "Rig":
        t0 = time.monotonic()
        self.node = sim.start_node(self.state_dir / "node", step_seconds=self.step_seconds)
        self.timings["node start"] = time.monotonic() - t0
        t1 = time.monotonic()
        self.stack = AirflowStack(self.state_dir / "airflow", port=free_port())
        self.stack.ensure_password()
        env = {**deployment_env(self.node, self.record_root, schedule=schedule),
               **api_connection_env(self.stack.base_url, self.stack.username, self.stack.password),
               **(extra_env or {})}
        self.stack.start(extra_env=env)
        self.client = AirflowClient(self.stack.base_url, self.stack.username, self.stack.password)
        self.client.create_pool(POOL, 1, include_deferred=True,
                                description="One training at a time on the simulated GPU node")
        self.client.wait_for_dag(DAG_ID)
        self.client.unpause(DAG_ID)
        self.timings["airflow start"] = time.monotonic() - t1
        return self

    def stop(self) -> None:
        if self.client:
            self.client.close()
        if self.stack:
            self.stack.stop()
        if self.node:
            sim.stop_node(self.state_dir / "node")

    def __enter__(self) -> "Rig":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, conf: Mapping[str, Any], decision: str | None = "Approve", timeout: float = 600,
            standing: bool = False, during: Callable[[str], Any] | None = None) -> RunOutcome:
        """Trigger a run, answer the approval with ``decision`` (None: expect no wait), wait for the end.

        ``during(run_id)``, when given, is called once the approval is answered and before waiting
        for the end (fault-injection tests use it to act on the running DAG run and the node).
        """
        assert self.client is not None
        t0 = time.monotonic()
        run_id = self.client.trigger(DAG_ID, conf=dict(conf))
        timings: dict[str, float] = {}
        approval = None
        if decision is not None:
            detail = self.client.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=timeout)
            timings["until approval asked"] = time.monotonic() - t0
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
