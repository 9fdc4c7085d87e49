"""Start and stop a REAL local Apache Airflow 3.3 (SQLite + LocalExecutor) and talk to it over REST.

Used by the end-to-end tests and the demo. Everything lives in one state directory:

    STATE/airflow_home/        AIRFLOW_HOME (airflow.cfg is never written; config is all env vars)
    STATE/airflow.db           SQLite metadata database
    STATE/secrets.json         generated fernet key, JWT secret, API secret key (0600, never printed)
    STATE/passwords.json       simple auth manager password file {"demo": "<generated>"} (0600)
    STATE/stack.json           port, base URL, pids (for `stop` from another process)
    STATE/logs/<component>.log stdout+stderr of api-server, scheduler, triggerer, dag-processor
    STATE/airflow_home/logs/   task logs

Library use::

    from scripts.airflow_stack import AirflowStack
    with AirflowStack(state_dir, dags_folder=...) as stack:      # start() on enter, stop() on exit
        api = stack.client()
        api.wait_for_dag("my_dag"); api.unpause("my_dag")
        run_id = api.trigger("my_dag", {"commit": "main"})
        hitl = api.wait_for_hitl("my_dag", run_id)
        api.respond_hitl("my_dag", run_id, hitl["task_instance"]["task_id"], ["Approve"])
        assert api.wait_for_run("my_dag", run_id) == "success"

Command line::

    python -m scripts.airflow_stack start --state .state/airflow [--dags DIR] [--env K=V ...]
    python -m scripts.airflow_stack stop --state .state/airflow
    python -m scripts.airflow_stack status --state .state/airflow
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

PROJECT_ROOT = Path(__file__).resolve().parent.parent
USERNAME = "demo"
ROLE = "admin"
COMPONENTS = ("api-server", "scheduler", "triggerer", "dag-processor")
HEALTH_KEYS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
TERMINAL_RUN_STATES = {"success", "failed"}
TERMINAL_TI_STATES = {"success", "failed", "skipped", "upstream_failed", "removed"}


class StackError(RuntimeError):
    """The local Airflow could not be started, or an API call did not give the expected result."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _descendants(pid: int) -> list[int]:
    """All descendant pids of pid (psutil ships with Airflow; fall back to nothing)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def _kill_tree(leaders: Iterable[int], others: Iterable[int], timeout: float) -> None:
    """Stop process trees: SIGTERM the leaders only (each shuts its own children down gracefully;
    signalling the whole group at once makes e.g. the triggerer wait 10 s for its runner), then
    SIGTERM and finally SIGKILL the leaders' process groups and every remaining listed descendant."""
    leaders, everyone = set(leaders), set(leaders) | set(others)

    def wait(pids: set[int], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not any(_alive(p) for p in pids):
                return True
            time.sleep(0.1)
        return not any(_alive(p) for p in pids)

    for pid in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    # The triggerer gives its trigger runner a 10 s escalation delay (even a second SIGTERM costs 5 s);
    # for a local stack all state is in the DB, so after `timeout` the rest is simply killed.
    wait(leaders, timeout)
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        for pg in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pg, sig)
        for pid in everyone:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        if wait(everyone, grace):
            return


class AirflowClient:
    """Small REST client for the Airflow 3.3 public API (/api/v2) with simple-auth-manager tokens."""

    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30.0,
                 worker_released: Callable[[str, int], bool] | None = None) -> None:
        """worker_released(ti_id, try_number): optional probe telling whether the scheduler has processed
        the executor event of the worker that parked that task instance (see wait_for_hitl)."""
        self.base_url = base_url.rstrip("/")
        self.worker_released = worker_released
        self.username = username
        self._password = password
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)
        self._token: str | None = None

    # -- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AirflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def login(self) -> str:
        """POST /auth/token {"username", "password"} -> {"access_token"} (HTTP 201)."""
        r = self._http.post("/auth/token", json={"username": self.username, "password": self._password})
        if r.status_code not in (200, 201):
            raise StackError(f"login as {self.username!r} failed: HTTP {r.status_code} {r.text[:300]}")
        self._token = r.json()["access_token"]
        return self._token

    def request(self, method: str, path: str, *, expect: Iterable[int] = (200,), **kw: Any) -> httpx.Response:
        """Authenticated request to /api/v2 + path; re-logs in once on 401; raises on unexpected status."""
        url = path if path.startswith(("/api/", "/auth/")) else "/api/v2" + path
        extra_headers = kw.pop("headers", {})
        for attempt in (0, 1):
            if self._token is None:
                self.login()
            headers = {"Authorization": f"Bearer {self._token}", **extra_headers}
            r = self._http.request(method, url, headers=headers, **kw)
            if r.status_code == 401 and attempt == 0:
                self._token = None
                continue
            break
        if r.status_code not in set(expect):
            raise StackError(f"{method} {url} -> HTTP {r.status_code}: {r.text[:2000]}")
        return r

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    # -- health / pools -------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """GET /api/v2/monitor/health (no auth needed)."""
        r = self._http.get("/api/v2/monitor/health")
        r.raise_for_status()
        return r.json()

    def create_pool(self, name: str, slots: int, include_deferred: bool = True, description: str = "") -> dict:
        """POST /api/v2/pools; if it exists (409), PATCH /api/v2/pools/{name}."""
        body = {"name": name, "slots": slots, "include_deferred": include_deferred, "description": description}
        r = self.request("POST", "/pools", json=body, expect=(201, 409))
        if r.status_code == 409:
            r = self.request("PATCH", f"/pools/{quote(name, safe='')}", json=body)
        return r.json()

    # -- DAGs -----------------------------------------------------------------------------------
    def import_errors(self) -> list[dict[str, Any]]:
        """GET /api/v2/importErrors -> [{"filename", "stack_trace", ...}]."""
        return self.get("/importErrors", params={"limit": 100})["import_errors"]

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until dag_id is parsed and serialised without import errors; returns GET /dags/{dag_id}.

        Raises StackError naming every import error if the file fails to import (reported as soon
        as the dag-processor records it), or if the DAG does not appear before the timeout.
        """
        deadline = time.monotonic() + timeout
        while True:
            r = self.request("GET", f"/dags/{quote(dag_id, safe='')}", expect=(200, 404))
            errors = self.import_errors()
            if r.status_code == 200:
                dag = r.json()
                if not dag.get("has_import_errors") and not dag.get("is_stale"):
                    # The DAG row exists; make sure the serialised DAG is readable too (tasks endpoint).
                    t = self.request("GET", f"/dags/{quote(dag_id, safe='')}/tasks", expect=(200, 404))
                    if t.status_code == 200:
                        return dag
            if errors and (r.status_code == 404 or r.json().get("has_import_errors")):
                raise StackError(
                    f"DAG {dag_id!r} has import errors:\n"
                    + "\n".join(f"--- {e.get('filename')}\n{e.get('stack_trace')}" for e in errors)
                )
            if time.monotonic() > deadline:
                raise StackError(f"DAG {dag_id!r} not parsed within {timeout}s (import errors: {errors})")
            time.sleep(1)

    def unpause(self, dag_id: str) -> dict[str, Any]:
        """PATCH /api/v2/dags/{dag_id}?update_mask=is_paused {"is_paused": false}."""
        return self.request(
            "PATCH", f"/dags/{quote(dag_id, safe='')}", params={"update_mask": "is_paused"},
            json={"is_paused": False},
        ).json()

    def pause(self, dag_id: str) -> dict[str, Any]:
        return self.request(
            "PATCH", f"/dags/{quote(dag_id, safe='')}", params={"update_mask": "is_paused"},
            json={"is_paused": True},
        ).json()

    # -- runs -----------------------------------------------------------------------------------
    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None,
                note: str | None = None) -> str:
        """POST /api/v2/dags/{dag_id}/dagRuns {"logical_date": null, "conf": {...}, "dag_run_id"?} -> run_id."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id:
            body["dag_run_id"] = run_id
        if note:
            body["note"] = note
        r = self.request("POST", f"/dags/{quote(dag_id, safe='')}/dagRuns", json=body)
        return r.json()["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.get(f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600.0, poll: float = 1.0) -> str:
        """Poll the DAG run until success/failed; returns the final state. Raises StackError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.dag_run(dag_id, run_id)["state"]
            if state in TERMINAL_RUN_STATES:
                return state
            if time.monotonic() > deadline:
                raise StackError(
                    f"run {dag_id}/{run_id} still {state!r} after {timeout}s; tasks: {self.task_states(dag_id, run_id)}"
                )
            time.sleep(poll)

    # -- task instances -------------------------------------------------------------------------
    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """GET /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances."""
        return self.get(
            f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances",
            params={"limit": 1000},
        )["task_instances"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """{task_id: state}; mapped task instances appear as "task_id[map_index]"."""
        out: dict[str, str | None] = {}
        for ti in self.task_instances(dag_id, run_id):
            key = ti["task_id"] if ti.get("map_index", -1) == -1 else f"{ti['task_id']}[{ti['map_index']}]"
            out[key] = ti["state"]
        return out

    def task_instance(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        base = (f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
                f"/taskInstances/{quote(task_id, safe='')}")
        return self.get(base if map_index == -1 else f"{base}/{map_index}")

    def wait_for_task(self, dag_id: str, run_id: str, task_id: str, states: Iterable[str] = TERMINAL_TI_STATES,
                      timeout: float = 300.0, poll: float = 1.0) -> str:
        """Poll one task instance until its state is in states; returns that state."""
        states = set(states)
        deadline = time.monotonic() + timeout
        while True:
            state = self.task_instance(dag_id, run_id, task_id)["state"]
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise StackError(f"{dag_id}/{run_id}/{task_id} still {state!r} after {timeout}s (wanted {states})")
            time.sleep(poll)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        """GET .../taskInstances/{task_id}/logs/{try_number}?full_content=true -> plain text.

        The API returns structured events ({"event", "timestamp", "level", ...}); they are rendered one per
        line as "[timestamp] level event"; follows continuation tokens until the end of the log.
        """
        path = (f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                f"{quote(task_id, safe='')}/logs/{try_number}")
        lines: list[str] = []
        params: dict[str, Any] = {"full_content": "true", "map_index": map_index}
        for _ in range(50):
            data = self.request("GET", path, params=params, headers={"Accept": "application/json"}).json()
            for item in data.get("content") or []:
                if isinstance(item, str):
                    lines.append(item)
                    continue
                head = " ".join(str(item[k]) for k in ("timestamp", "level") if item.get(k))
                extra = {k: v for k, v in item.items() if k not in ("timestamp", "level", "event", "logger")}
                text = f"[{head}] {item.get('event', '')}" if head else str(item.get("event", ""))
                if extra and item.get("event") not in ("::group::", "::endgroup::"):
                    text += " " + json.dumps(extra, default=str)
                lines.append(text)
            token = data.get("continuation_token")
            if not token:
                break
            params = {"token": token, "map_index": map_index}
        return "\n".join(lines)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """GET .../taskInstances/{task_id}/xcomEntries/{key}?deserialize=true -> the value (None if absent)."""
        r = self.request(
            "GET",
            f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id, safe='')}/xcomEntries/{quote(key, safe='')}",
            params={"deserialize": "true", "map_index": map_index},
            expect=(200, 404),
        )
        return r.json()["value"] if r.status_code == 200 else None

    def mark_task_failed(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """PATCH .../taskInstances/{task_id}[/{map_index}] {"new_state": "failed"}."""
        return self.set_task_state(dag_id, run_id, task_id, "failed", map_index=map_index)

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, map_index: int = -1,
                       note: str | None = None) -> dict[str, Any]:
        base = (f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                f"{quote(task_id, safe='')}")
        body: dict[str, Any] = {"new_state": state}
        if note is not None:
            body["note"] = note
        return self.request("PATCH", base if map_index == -1 else f"{base}/{map_index}", json=body).json()

    def clear_task(self, dag_id: str, run_id: str, task_ids: str | Iterable[str], *, only_failed: bool = False,
                   include_downstream: bool = False, reset_dag_runs: bool = True) -> list[dict[str, Any]]:
        """POST /api/v2/dags/{dag_id}/clearTaskInstances {"dry_run": false, "dag_run_id", "task_ids", ...}."""
        ids = [task_ids] if isinstance(task_ids, str) else list(task_ids)
        body = {
            "dry_run": False, "dag_run_id": run_id, "task_ids": ids, "only_failed": only_failed,
            "include_downstream": include_downstream, "reset_dag_runs": reset_dag_runs,
        }
        return self.request("POST", f"/dags/{quote(dag_id, safe='')}/clearTaskInstances", json=body).json()[
            "task_instances"]

    # -- human in the loop ----------------------------------------------------------------------
    def hitl_details(self, dag_id: str, run_id: str, task_id: str | None = None,
                     response_received: bool | None = None) -> list[dict[str, Any]]:
        """GET /api/v2/dags/{dag_id}/dagRuns/{run_id}/hitlDetails[?task_id=..&response_received=..]."""
        params: dict[str, Any] = {"limit": 100}
        if task_id is not None:
            params["task_id"] = task_id
        if response_received is not None:
            params["response_received"] = str(response_received).lower()
        return self.get(
            f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/hitlDetails", params=params
        )["hitl_details"]

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """GET .../taskInstances/{task_id}/{map_index}/hitlDetails."""
        return self.get(
            f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id, safe='')}/{map_index}/hitlDetails"
        )

    def wait_for_hitl(self, dag_id: str, run_id: str, task_id: str | None = None,
                      timeout: float = 300.0, poll: float = 1.0, settle: float | None = None) -> dict[str, Any]:
        """Wait for a pending human-in-the-loop request (task parked in awaiting_input, no response yet).

        Returns the HITLDetail ({"subject", "body", "options", "defaults", "params", "assigned_users",
        "task_instance": {...}, ...}). Raises StackError if the run finishes first or on timeout.

        Airflow 3.3.2 race (found by these tests): if the response arrives before the scheduler has
        processed the executor's "success" event of the worker process that parked the task, the resumed
        task (re-queued with the SAME try_number) is marked FAILED as "state changed externally". The
        worker's supervisor may take up to [workers] min_heartbeat_interval to report after the task
        process parked. A human never answers that fast; a script does. So this only returns once the
        parking worker has been released: via the worker_released probe when given (AirflowStack reads
        its scheduler log), else after the task has stayed parked for `settle` seconds (default 8).
        """
        deadline = time.monotonic() + timeout
        parked_since: dict[str, float] = {}
        settle_s = settle if settle is not None else (0.0 if self.worker_released else 8.0)
        while True:
            for d in self.hitl_details(dag_id, run_id, task_id=task_id, response_received=False):
                ti = d["task_instance"]
                if ti["state"] in ("awaiting_input", "deferred"):
                    key = f"{ti['id']}/{ti.get('try_number')}"
                    first = parked_since.setdefault(key, time.monotonic())
                    released = self.worker_released is None or self.worker_released(ti["id"], ti["try_number"])
                    if released and time.monotonic() - first >= settle_s:
                        return d
                    break
            else:
                parked_since.clear()
            run_state = self.dag_run(dag_id, run_id)["state"]
            if run_state in TERMINAL_RUN_STATES:
                raise StackError(f"run {dag_id}/{run_id} ended ({run_state}) without a pending HITL request; "
                                 f"tasks: {self.task_states(dag_id, run_id)}")
            if time.monotonic() > deadline:
                raise StackError(f"no pending HITL request in {dag_id}/{run_id} after {timeout}s; "
                                 f"tasks: {self.task_states(dag_id, run_id)}")
            time.sleep(poll)

    def respond_hitl(self, dag_id: str, run_id: str, task_id: str, chosen_options: list[str],
                     params_input: Mapping[str, Any] | None = None, map_index: int = -1) -> dict[str, Any]:
        """PATCH .../taskInstances/{task_id}/{map_index}/hitlDetails {"chosen_options", "params_input"}.

        Acts as the logged-in user; returns {"responded_by": {"id", "name"}, "responded_at",
        "chosen_options", "params_input"}. HTTP 409 if already answered, 400 for an invalid option.
        """
        return self.request(
            "PATCH",
            f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id, safe='')}/{map_index}/hitlDetails",
            json={"chosen_options": list(chosen_options), "params_input": dict(params_input or {})},
        ).json()


class AirflowStack:
    """A real local Airflow (api-server, scheduler, triggerer, dag-processor) on SQLite, in state_dir."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        dags_folder: str | os.PathLike[str] | None = None,
        plugins_folder: str | os.PathLike[str] | None = None,
        python: str | None = None,
        port: int | None = None,
        parallelism: int = 8,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.dags_folder = Path(dags_folder or PROJECT_ROOT / "dags").resolve()
        self.plugins_folder = Path(plugins_folder or PROJECT_ROOT / "plugins").resolve()
        self.python = python or sys.executable
        self.port = port
        self.parallelism = parallelism
        self.home = self.state_dir / "airflow_home"
        self.log_dir = self.state_dir / "logs"
        self.password_file = self.state_dir / "passwords.json"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}
        self.started_in: float | None = None
        self._client: AirflowClient | None = None
        self._released: set[tuple[str, int]] = set()
        self._sched_offset = 0

    # -- config ---------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def username(self) -> str:
        return USERNAME

    @property
    def password(self) -> str:
        return json.loads(self.password_file.read_text())[USERNAME]

    def _secrets(self) -> dict[str, str]:
        path = self.state_dir / "secrets.json"
        if path.exists():
            return json.loads(path.read_text())
        values = {
            "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "jwt_secret": secrets.token_urlsafe(48),
            "api_secret_key": secrets.token_urlsafe(32),
        }
        _write_private(path, json.dumps(values))
        return values

    def ensure_password(self) -> None:
        """Create the demo user's password file (once); the password is readable from then on."""
        try:
            existing = json.loads(self.password_file.read_text())
        except (OSError, ValueError):
            existing = {}
        if not existing.get(USERNAME):
            existing[USERNAME] = secrets.token_urlsafe(18)
            _write_private(self.password_file, json.dumps(existing) + "\n")

    def build_env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment of every component: inherited env, minus foreign AIRFLOW__ config, plus ours."""
        s = self._secrets()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__") and k != "AIRFLOW_CONFIG"}
        cfg = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.plugins_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__FERNET_KEY": s["fernet_key"],
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:{ROLE}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.password_file),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.state_dir / 'airflow.db'}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": s["api_secret_key"],
            "AIRFLOW__API__EXPOSE_CONFIG": "False",
            "AIRFLOW__API_AUTH__JWT_SECRET": s["jwt_secret"],
            # Fast loops: new DAG files are seen within seconds, changed files re-parsed every 5 s.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            # The task supervisor notices its task process exited only at its next heartbeat check:
            # 1 s instead of 5 s saves ~4 s per task.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # Per-stack log-server ports so two stacks (or another Airflow) on one machine do not collide.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            "PYTHONUNBUFFERED": "1",
        }
        env.update(cfg)
        if extra_env:
            env.update({k: str(v) for k, v in extra_env.items()})
        return env

    # -- lifecycle ------------------------------------------------------------------------------
    def _run(self, *args: str, timeout: float = 600) -> None:
        log = self.log_dir / f"{args[0]}.log"
        with open(log, "ab") as out:
            r = subprocess.run(
                [self.python, "-m", "airflow", *args], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, timeout=timeout, cwd=self.state_dir,
            )
        if r.returncode != 0:
            raise StackError(f"airflow {' '.join(args)} failed ({r.returncode}):\n{_tail(log)}")

    def start(self, extra_env: Mapping[str, str] | None = None, timeout: float = 240.0) -> AirflowStack:
        """Migrate the DB, start the four components, wait until /monitor/health is all healthy."""
        if self.procs:
            raise StackError("stack already started")
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.port = self.port or free_port()
        self.ensure_password()
        self.env = self.build_env(extra_env)
        try:
            self._run("db", "migrate")
            for name in COMPONENTS:
                self._launch(name)
            self._write_stack_file()
            self._wait_healthy(deadline=t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _launch(self, name: str) -> None:
        """Start one component in its own session, appending to its log file."""
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                [self.python, "-m", "airflow", name], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.state_dir, start_new_session=True,
            )

    def _write_stack_file(self) -> None:
        info = {"base_url": self.base_url, "port": self.port, "username": USERNAME,
                "password_file": str(self.password_file), "log_dir": str(self.log_dir),
                "pids": {n: p.pid for n, p in self.procs.items()}}
        (self.state_dir / "stack.json").write_text(json.dumps(info, indent=2) + "\n")

    def _wait_healthy(self, deadline: float) -> None:
        last: Any = None
        with httpx.Client(base_url=self.base_url, timeout=5) as http:
            while True:
                for name, p in self.procs.items():
                    if p.poll() is not None:
                        raise StackError(f"airflow {name} exited with {p.returncode}:\n{self.log_tail(name)}")
                try:
                    r = http.get("/api/v2/monitor/health")
                    last = r.json() if r.status_code == 200 else f"HTTP {r.status_code}"
                    if isinstance(last, dict) and all(
                        (last.get(k) or {}).get("status") == "healthy" for k in HEALTH_KEYS
                    ):
                        return
                except (httpx.HTTPError, ValueError) as e:
                    last = repr(e)
                if time.monotonic() > deadline:
                    raise StackError(f"Airflow not healthy in time; last health: {last}\n"
                                     + "\n".join(f"== {n}\n{self.log_tail(n, 15)}" for n in self.procs))
                time.sleep(0.5)

    _HEARTBEATS = {"scheduler": ("scheduler", "latest_scheduler_heartbeat"),
                   "triggerer": ("triggerer", "latest_triggerer_heartbeat"),
                   "dag-processor": ("dag_processor", "latest_dag_processor_heartbeat")}

    def restart_component(self, name: str, timeout: float = 120.0, stop_timeout: float = 5.0) -> float:
        """Stop one component (its process group and descendants) and start it again.

        Same command, environment and log file as ``start``. Returns (the seconds it took) once
        /monitor/health is all healthy and, for a component with a heartbeat (scheduler, triggerer,
        dag-processor), the NEW process has heartbeated. Tests restart e.g. the triggerer while a
        task is deferred.
        """
        if name not in self.procs:
            raise StackError(f"unknown or stopped component {name!r} (running: {', '.join(self.procs)})")
        t0 = time.monotonic()
        deadline = t0 + timeout
        old = self.procs[name]
        _kill_tree([old.pid], _descendants(old.pid), stop_timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            old.wait(timeout=5)
        since = time.time()
        self._launch(name)
        self._write_stack_file()
        self._wait_healthy(deadline=deadline)
        if name in self._HEARTBEATS:
            key, field = self._HEARTBEATS[name]
            with httpx.Client(base_url=self.base_url, timeout=5) as http:
                while True:
                    if self.procs[name].poll() is not None:
                        raise StackError(f"airflow {name} exited with {self.procs[name].returncode} after "
                                         f"restart:\n{self.log_tail(name)}")
                    with contextlib.suppress(httpx.HTTPError, ValueError, TypeError):
                        raw = (http.get("/api/v2/monitor/health").json().get(key) or {}).get(field)
                        stamp = datetime.datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
                        if stamp and stamp.timestamp() >= since:
                            break
                    if time.monotonic() > deadline:
                        raise StackError(f"airflow {name} did not heartbeat within {timeout}s of its restart:\n"
                                         f"{self.log_tail(name, 15)}")
                    time.sleep(0.5)
        return time.monotonic() - t0

    def log_tail(self, component: str, lines: int = 40) -> str:
        return _tail(self.log_dir / f"{component}.log", lines)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate every component, its process group and all descendants (task processes included)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if not self.procs:
            return
        descendants: set[int] = set()
        for p in self.procs.values():
            descendants.update(_descendants(p.pid))
        _kill_tree([p.pid for p in self.procs.values()], descendants, timeout)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self.procs.clear()
        with contextlib.suppress(OSError):
            (self.state_dir / "stack.json").unlink()

    def __enter__(self) -> AirflowStack:
        if not self.procs:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- API ------------------------------------------------------------------------------------
    def client(self) -> AirflowClient:
        """A shared REST client logged in as demo (closed by stop())."""
        if self._client is None:
            self._client = AirflowClient(self.base_url, USERNAME, self.password,
                                         worker_released=self.worker_released)
        return self._client

    _FINISHED = re.compile(r"TaskInstance Finished: .*?ti_id=([0-9a-fA-F-]+),.*?try_number=(\d+),")

    def worker_released(self, ti_id: str, try_number: int) -> bool:
        """True once the scheduler logged "TaskInstance Finished" for that ti_id/try (executor event processed)."""
        seen = self._released
        if (ti_id, try_number) in seen:
            return True
        log = self.log_dir / "scheduler.log"
        offset = self._sched_offset
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return False
        cut = data.rfind(b"\n") + 1  # only complete lines
        self._sched_offset = offset + cut
        for m in self._FINISHED.finditer(data[:cut].decode(errors="replace")):
            seen.add((m.group(1), int(m.group(2))))
        return (ti_id, try_number) in seen

    def create_pool(self, name: str, slots: int, include_deferred: bool = True) -> dict:
        return self.client().create_pool(name, slots, include_deferred=include_deferred)


def stop_from_state(state_dir: str | os.PathLike[str], timeout: float = 5.0) -> bool:
    """Stop a stack started by another process (reads STATE/stack.json). Returns False if none was running."""
    path = Path(state_dir) / "stack.json"
    if not path.exists():
        return False
    pids = list(json.loads(path.read_text())["pids"].values())
    alive = [p for p in pids if _alive(p)]
    descendants: set[int] = set()
    for p in alive:
        descendants.update(_descendants(p))
    _kill_tree(alive, descendants, timeout)
    path.unlink()
    return bool(alive)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="airflow_stack", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start in the background and return once healthy")
    s.add_argument("--state", required=True)
    s.add_argument("--dags", default=None)
    s.add_argument("--plugins", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--pool", action="append", default=[], metavar="NAME=SLOTS")
    s.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the stack")
    for name in ("stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--state", required=True)
    a = ap.parse_args(argv)

    if a.cmd == "stop":
        print("stopped" if stop_from_state(a.state) else "not running")
        return 0
    if a.cmd == "status":
        path = Path(a.state) / "stack.json"
        if not path.exists():
            print("not running")
            return 1
        info = json.loads(path.read_text())
        try:
            health = httpx.get(info["base_url"] + "/api/v2/monitor/health", timeout=5).json()
        except httpx.HTTPError as e:
            health = repr(e)
        print(json.dumps({**info, "health": health}, indent=2))
        return 0

    if stop_from_state(a.state):
        print("stopped a previous stack in", a.state)
    extra = dict(kv.split("=", 1) for kv in a.env)
    stack = AirflowStack(a.state, dags_folder=a.dags, plugins_folder=a.plugins, port=a.port)
    stack.start(extra_env=extra)
    for kv in a.pool:
        name, slots = kv.split("=", 1)
        stack.create_pool(name, int(slots))
    print(f"Airflow healthy in {stack.started_in:.1f}s at {stack.base_url} "
          f"(user {USERNAME}, password in {stack.password_file}); logs in {stack.log_dir}")
    if a.foreground:
        try:
            while all(p.poll() is None for p in stack.procs.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            stack.stop()
        return 0
    # Detach: the components run in their own sessions; `stop --state` ends them.
    stack.procs.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
