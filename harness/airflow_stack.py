"""Start and stop a REAL local Apache Airflow 3.3 (SQLite + LocalExecutor) and talk to its REST API
through the official ``apache-airflow-client`` (``AirflowClient``).

Used by the end-to-end tests and the demo. Everything lives in one state directory:

    STATE/airflow_home/        AIRFLOW_HOME (airflow.cfg is never written; config is all env vars)
    STATE/airflow.db           SQLite metadata database
    STATE/secrets.json         generated fernet key, JWT secret, API secret key (0600, never printed)
    STATE/passwords.json       simple auth manager password file {"demo": "<generated>"} (0600)
    STATE/stack.json           port, base URL, pids (for `stop` from another process)
    STATE/logs/<component>.log stdout+stderr of api-server, scheduler, triggerer, dag-processor
    STATE/airflow_home/logs/   task logs

Library use::

    from harness.airflow_stack import AirflowStack
    with AirflowStack(state_dir, dags_folder=...) as stack:      # start() on enter, stop() on exit
        api = stack.client()
        api.wait_for_dag("my_dag"); api.unpause("my_dag")
        run_id = api.trigger("my_dag", {"commit": "main"})
        hitl = api.wait_for_hitl("my_dag", run_id)
        api.respond_hitl("my_dag", run_id, hitl["task_instance"]["task_id"], ["Approve"])
        assert api.wait_for_run("my_dag", run_id) == "success"

Celery mode (a distributed Airflow; harness/services.py runs PostgreSQL, Redis and an S3 store)::

    with Postgres(state / "pg") as pg, Redis(state / "redis") as redis:
        stack = AirflowStack(state / "airflow", dags_folder=..., executor="CeleryExecutor",
                             database_url=pg.sqlalchemy_url, broker_url=redis.url,
                             celery_workers=[WorkerSpec("worker-a", env={...}), WorkerSpec("worker-b")])
        with stack: ...

    The metadata DB is the given PostgreSQL (result backend db+<database_url>), the broker the given Redis.
    Besides the four components, one ``airflow celery worker`` per WorkerSpec (component
    ``celery-<name>``, log STATE/logs/celery-<name>.log) with its own ``--celery-hostname`` (Celery node
    ``celery@<name>``), working directory (STATE/workers/<name> unless given), extra env and concurrency;
    start() returns once every worker answers a Celery ping. A worker's task instances record
    ``hostname`` = the WorkerSpec's hostname (default its name; harness.celery_hostname.worker_hostname), not the
    machine's FQDN that two workers on one machine would share. Worker logs are not served over HTTP
    (``--skip-serve-logs``): all task logs are in the one local STATE/airflow_home/logs.

Command line::

    python -m harness.airflow_stack start --state .state/airflow [--dags DIR] [--env K=V ...]
    python -m harness.airflow_stack stop --state .state/airflow
    python -m harness.airflow_stack status --state .state/airflow
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import airflow_client.client as ac
import urllib3
from airflow_client.client.exceptions import ApiException, UnauthorizedException
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from harness.celery_hostname import WORKER_HOSTNAME_CALLABLE, WORKER_HOSTNAME_ENV
from harness.processes import alive, descendants, free_port, kill_tree, tail, write_private

PROJECT_ROOT = Path(__file__).resolve().parent.parent
USERNAME = "demo"
ROLE = "admin"
#: A user who can log in but whom the auth manager grants nothing (no role): what a person without
#: access to the verification DAG gets from the UI plugin's routes (the simple auth manager has no
#: per-DAG grants outside multi-team mode).
OUTSIDER = "outsider"
COMPONENTS = ("api-server", "scheduler", "triggerer", "dag-processor")
HEALTH_KEYS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
TERMINAL_RUN_STATES = {"success", "failed"}
TERMINAL_TI_STATES = {"success", "failed", "skipped", "upstream_failed", "removed"}
EXECUTORS = ("LocalExecutor", "CeleryExecutor")
_WORKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class WorkerSpec:
    """One Celery worker of an AirflowStack in Celery mode.

    name: Celery node ``celery@<name>`` and component ``celery-<name>``; env: extra environment (last
    word, e.g. the worker's own local folders); cwd: working directory (default STATE/workers/<name>);
    hostname: what its task instances record as ``hostname`` (default: name); queues: Celery queues
    (comma-separated, default Airflow's default queue).
    """

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | os.PathLike[str] | None = None
    concurrency: int = 4
    hostname: str | None = None
    queues: str | None = None

    @property
    def component(self) -> str:
        return f"celery-{self.name}"

    @property
    def node_name(self) -> str:
        return f"celery@{self.name}"

# The scheduler's log line once it has processed a worker's executor event, e.g.
#   ... [info     ] TaskInstance Finished: dag_id=d, task_id=t, run_id=r, map_index=-1, ti_id=<uuid>, ...,
#   try_number=1, max_tries=2, ...
# Pinned to the wording of Airflow 3.3.2's scheduler (SchedulerJobRunner.process_executor_events); the
# only reader is AirflowStack.worker_released (the HITL race workaround, see AirflowClient.wait_for_hitl).
# tests/unit/test_harness.py pins it on a real 3.3.2 line: re-check both when upgrading Airflow.
SCHEDULER_TI_FINISHED = re.compile(r"TaskInstance Finished: .*?ti_id=([0-9a-fA-F-]+),.*?try_number=(\d+),")


class StackError(RuntimeError):
    """The local Airflow could not be started, or an API call did not give the expected result.

    For a failed API call ``status`` is the HTTP status and ``body`` the API's answer (else None and "").
    """

    def __init__(self, message: str, *, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def finished_task_instances(scheduler_log: str) -> set[tuple[str, int]]:
    """(ti_id, try_number) of every "TaskInstance Finished" line in a piece of scheduler log."""
    return {(m.group(1), int(m.group(2))) for m in SCHEDULER_TI_FINISHED.finditer(scheduler_log)}


def plain(value: Any) -> Any:
    """A generated API model (or a list/dict of them) as the plain JSON-shaped data the API sent.

    Unlike the models' ``to_dict()`` this keeps fields whose value is None (callers read ``ti["state"]`` of a
    task instance that has none yet), renders datetimes as ISO strings and enums as their values, merges
    additional properties (of the models that keep them) and unwraps anyOf/oneOf wrappers.
    """
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        if "actual_instance" in fields:  # anyOf/oneOf wrapper (log content, XCom entry)
            return plain(value.actual_instance)
        out = {(f.alias or name): plain(getattr(value, name)) for name, f in fields.items()
               if name != "additional_properties"}
        out.update(plain(getattr(value, "additional_properties", None) or {}))
        return out
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return to_jsonable_python(value)


def render_log_line(item: Any) -> str:
    """One task-log event as "[timestamp level] event {extra keys as JSON}" (plain strings pass through)."""
    if isinstance(item, str):
        return item
    head = " ".join(str(item[k]) for k in ("timestamp", "level") if item.get(k))
    extra = {k: v for k, v in item.items() if k not in ("timestamp", "level", "event", "logger")}
    text = f"[{head}] {item.get('event', '')}" if head else str(item.get("event", ""))
    if extra and item.get("event") not in ("::group::", "::endgroup::"):
        text += " " + json.dumps(extra, default=str)
    return text


def probe_health(base_url: str, timeout: float = 5.0) -> dict[str, Any] | str:
    """GET /api/v2/monitor/health (MonitorApi, no auth): the health dict, or why it could not be read
    (while Airflow starts: connection refused, HTTP 5xx, an incomplete answer)."""
    api = ac.ApiClient(ac.Configuration(host=base_url.rstrip("/"), retries=0))  # the callers poll
    try:
        return plain(ac.MonitorApi(api).get_health(_request_timeout=timeout))
    except ApiException as e:
        return f"HTTP {e.status}"
    except (urllib3.exceptions.HTTPError, ValueError) as e:
        return repr(e)
    finally:
        api.rest_client.pool_manager.clear()


class _ApiClient(ac.ApiClient):
    """The generated ApiClient, remembering its last request so that errors can name the method and URL."""

    last_request: tuple[str, str] = ("?", "?")

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.last_request = (method, url)
        return super().call_api(method, url, *args, **kwargs)


def api_error(err: ApiException, method: str, url: str) -> StackError:
    """StackError naming the method, the path (host left out) and the HTTP status of a failed API call."""
    path = "/" + url.split("://", 1)[-1].split("/", 1)[-1] if "://" in url else url
    body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
    return StackError(f"{method} {path} -> HTTP {err.status}: {body[:2000]}", status=err.status, body=body)


class AirflowClient:
    """The Airflow 3.3 public API (/api/v2) through the official ``apache-airflow-client``, logged in with a
    simple-auth-manager token. Methods return plain dicts/lists/values (see ``plain``)."""

    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30.0,
                 worker_released: Callable[[str, int], bool] | None = None) -> None:
        """worker_released(ti_id, try_number): optional probe telling whether the scheduler has processed
        the executor event of the worker that parked that task instance (see wait_for_hitl)."""
        self.base_url = base_url.rstrip("/")
        self.worker_released = worker_released
        self.username = username
        self._password = password
        self.timeout = timeout
        self._api = _ApiClient(ac.Configuration(host=self.base_url))
        self._dags, self._tasks = ac.DAGApi(self._api), ac.TaskApi(self._api)
        self._runs, self._tis = ac.DagRunApi(self._api), ac.TaskInstanceApi(self._api)
        self._pools, self._variables = ac.PoolApi(self._api), ac.VariableApi(self._api)
        self._import_errors, self._xcom = ac.ImportErrorApi(self._api), ac.XComApi(self._api)
        self._monitor = ac.MonitorApi(self._api)

    # -- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        self._api.rest_client.pool_manager.clear()

    def __enter__(self) -> AirflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def login(self) -> str:
        """POST /auth/token {"username", "password"} -> {"access_token"} (HTTP 201).

        /auth/token belongs to the auth manager, not to the public API, so the generated client has no
        method for it: one raw call through the same ApiClient (same connection pool and timeout).
        """
        r = self._api.call_api("POST", f"{self.base_url}/auth/token",
                               header_params={"Content-Type": "application/json", "Accept": "application/json"},
                               body={"username": self.username, "password": self._password},
                               _request_timeout=self.timeout)
        text = r.read().decode(errors="replace")
        if r.status not in (200, 201):
            raise StackError(f"POST /auth/token (login as {self.username!r}) -> HTTP {r.status}: {text[:300]}",
                             status=r.status, body=text)
        self._api.configuration.access_token = token = str(json.loads(text)["access_token"])
        return token

    def _call(self, fn: Callable[..., Any], *args: Any, allow: Iterable[int] = (), auth: bool = True,
              **kw: Any) -> Any:
        """fn(*args, **kw) (a generated API method); logs in first and once more on HTTP 401.

        Returns None for a status in ``allow`` (e.g. 404); any other error raises StackError.
        """
        for attempt in (0, 1):
            if auth and self._api.configuration.access_token is None:
                self.login()
            try:
                return fn(*args, _request_timeout=self.timeout, **kw)
            except UnauthorizedException as err:
                if attempt or not auth:
                    raise api_error(err, *self._api.last_request) from err
                self._api.configuration.access_token = None  # expired: log in again and retry once
            except ApiException as err:
                if err.status in set(allow):
                    return None
                raise api_error(err, *self._api.last_request) from err

    # -- health / pools / variables -------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """GET /api/v2/monitor/health (no auth needed)."""
        return plain(self._call(self._monitor.get_health, auth=False))

    def create_pool(self, name: str, slots: int, include_deferred: bool = True, description: str = "") -> dict:
        """POST /api/v2/pools; if it exists (409), PATCH /api/v2/pools/{name}."""
        pool = self._call(self._pools.post_pool, ac.PoolBody(
            name=name, slots=slots, include_deferred=include_deferred, description=description), allow=(409,))
        if pool is None:
            pool = self._call(self._pools.patch_pool, name, ac.PoolPatchBody(
                pool=name, slots=slots, include_deferred=include_deferred, description=description))
        return plain(pool)

    def pool(self, name: str) -> dict[str, Any]:
        return plain(self._call(self._pools.get_pool, name))

    def variable(self, key: str) -> Any:
        """The value of Variable ``key`` (None if there is none)."""
        var = self._call(self._variables.get_variable, key, allow=(404,))
        return None if var is None else var.value

    def set_variable(self, key: str, value: str) -> dict[str, Any]:
        """PATCH /api/v2/variables/{key} (the variable must exist)."""
        return plain(self._call(self._variables.patch_variable, key, ac.VariableBody(key=key, value=value)))

    # -- DAGs -----------------------------------------------------------------------------------
    def import_errors(self) -> list[dict[str, Any]]:
        """GET /api/v2/importErrors -> [{"filename", "stack_trace", ...}]."""
        return plain(self._call(self._import_errors.get_import_errors, limit=100).import_errors)

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until dag_id is parsed and serialised without import errors; returns GET /dags/{dag_id}.

        Raises StackError naming every import error if the file fails to import (reported as soon
        as the dag-processor records it), or if the DAG does not appear before the timeout.
        """
        deadline = time.monotonic() + timeout
        while True:
            dag = self._call(self._dags.get_dag, dag_id, allow=(404,))
            errors = self.import_errors()
            if dag is not None and not dag.has_import_errors and not dag.is_stale:
                # The DAG row exists; make sure the serialised DAG is readable too (tasks endpoint).
                if self._call(self._tasks.get_tasks, dag_id, allow=(404,)) is not None:
                    return plain(dag)
            if errors and (dag is None or dag.has_import_errors):
                raise StackError(
                    f"DAG {dag_id!r} has import errors:\n"
                    + "\n".join(f"--- {e.get('filename')}\n{e.get('stack_trace')}" for e in errors)
                )
            if time.monotonic() > deadline:
                raise StackError(f"DAG {dag_id!r} not parsed within {timeout}s (import errors: {errors})")
            time.sleep(1)

    def unpause(self, dag_id: str) -> dict[str, Any]:
        """PATCH /api/v2/dags/{dag_id}?update_mask=is_paused {"is_paused": false}."""
        return plain(self._call(self._dags.patch_dag, dag_id, ac.DAGPatchBody(is_paused=False),
                                update_mask=["is_paused"]))

    def pause(self, dag_id: str) -> dict[str, Any]:
        return plain(self._call(self._dags.patch_dag, dag_id, ac.DAGPatchBody(is_paused=True),
                                update_mask=["is_paused"]))

    # -- runs -----------------------------------------------------------------------------------
    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None,
                note: str | None = None) -> str:
        """POST /api/v2/dags/{dag_id}/dagRuns {"logical_date": null, "conf": {...}, "dag_run_id"?} -> run_id.

        A refused trigger (e.g. conf failing the DAG's params, HTTP 400) raises StackError; its ``status``
        and ``body`` carry the API's answer.
        """
        body = ac.TriggerDAGRunPostBody(logical_date=None, conf=dict(conf or {}), dag_run_id=run_id or None,
                                        note=note or None)
        return self._call(self._runs.trigger_dag_run, dag_id, body).dag_run_id

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return plain(self._call(self._runs.get_dag_run, dag_id, run_id))

    def dag_runs(self, dag_id: str, **filters: Any) -> list[dict[str, Any]]:
        """GET /api/v2/dags/{dag_id}/dagRuns; filters are DagRunApi.get_dag_runs keywords
        (e.g. run_type=["scheduled"], order_by=["logical_date"], limit=100)."""
        return plain(self._call(self._runs.get_dag_runs, dag_id, **filters).dag_runs)

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> dict[str, Any]:
        """PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id} {"state": state} (queued, success or failed)."""
        return plain(self._call(self._runs.patch_dag_run, dag_id, run_id, ac.DAGRunPatchBody(state=state)))

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
        return plain(self._call(self._tis.get_task_instances, dag_id, run_id, limit=1000).task_instances)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """{task_id: state}; mapped task instances appear as "task_id[map_index]"."""
        out: dict[str, str | None] = {}
        for ti in self.task_instances(dag_id, run_id):
            key = ti["task_id"] if ti.get("map_index", -1) == -1 else f"{ti['task_id']}[{ti['map_index']}]"
            out[key] = ti["state"]
        return out

    def task_instance(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        if map_index == -1:
            return plain(self._call(self._tis.get_task_instance, dag_id, run_id, task_id))
        return plain(self._call(self._tis.get_mapped_task_instance, dag_id, run_id, task_id, map_index))

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
        line by render_log_line; follows continuation tokens until the end of the log.

        Read as raw JSON (get_log_without_preload_content: the generated request, our own parsing): the
        generated ``Content`` model keeps only "event" and "timestamp" of each event and drops "level",
        "error_detail" (the exception text) and every other key (pinned by tests/unit/test_harness.py).
        """
        def get_log(*args: Any, **kw: Any) -> Any:
            resp = self._tis.get_log_without_preload_content(*args, **kw)
            text = resp.data.decode(errors="replace")
            if not 200 <= resp.status <= 299:
                raise ApiException.from_response(http_resp=resp, body=text, data=None)
            return json.loads(text)

        lines: list[str] = []
        kw: dict[str, Any] = {"full_content": True}
        for _ in range(50):
            page = self._call(get_log, dag_id, run_id, task_id, try_number, map_index=map_index,
                              accept="application/json", **kw)
            lines += [render_log_line(item) for item in page.get("content") or []]
            token = page.get("continuation_token")
            if not token:
                break
            kw = {"token": token}
        return "\n".join(lines)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """GET .../taskInstances/{task_id}/xcomEntries/{key}?deserialize=true -> the value (None if absent)."""
        entry = self._call(self._xcom.get_xcom_entry, dag_id, task_id, run_id, key, map_index=map_index,
                           deserialize=True, allow=(404,))
        return None if entry is None else plain(entry)["value"]

    def mark_task_failed(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """PATCH .../taskInstances/{task_id}[/{map_index}] {"new_state": "failed"}."""
        return self.set_task_state(dag_id, run_id, task_id, "failed", map_index=map_index)

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, map_index: int = -1,
                       note: str | None = None) -> dict[str, Any]:
        """PATCH .../taskInstances/{task_id}[/{map_index}] {"new_state", "note"?} -> {"task_instances": [...]}."""
        body = ac.PatchTaskInstanceBody(new_state=state, note=note)
        if map_index == -1:
            return plain(self._call(self._tis.patch_task_instance, dag_id, run_id, task_id, body))
        return plain(self._call(self._tis.patch_task_instance_by_map_index, dag_id, run_id, task_id, map_index,
                                body))

    def clear_task(self, dag_id: str, run_id: str, task_ids: str | Iterable[str], *, only_failed: bool = False,
                   include_downstream: bool = False, reset_dag_runs: bool = True) -> list[dict[str, Any]]:
        """POST /api/v2/dags/{dag_id}/clearTaskInstances {"dry_run": false, "dag_run_id", "task_ids", ...}."""
        ids = [task_ids] if isinstance(task_ids, str) else list(task_ids)
        body = ac.ClearTaskInstancesBody(
            dry_run=False, dag_run_id=run_id, task_ids=[ac.ClearTaskInstancesBodyTaskIdsInner(i) for i in ids],
            only_failed=only_failed, include_downstream=include_downstream, reset_dag_runs=reset_dag_runs,
        )
        return plain(self._call(self._tis.post_clear_task_instances, dag_id, body).task_instances)

    # -- human in the loop ----------------------------------------------------------------------
    def hitl_details(self, dag_id: str, run_id: str, task_id: str | None = None,
                     response_received: bool | None = None) -> list[dict[str, Any]]:
        """GET /api/v2/dags/{dag_id}/dagRuns/{run_id}/hitlDetails[?task_id=..&response_received=..]."""
        return plain(self._call(self._tis.get_hitl_details, dag_id, run_id, limit=100, task_id=task_id,
                                response_received=response_received).hitl_details)

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """GET .../taskInstances/{task_id}/{map_index}/hitlDetails."""
        return plain(self._call(self._tis.get_hitl_detail, dag_id, run_id, task_id, map_index))

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
        "chosen_options", "params_input"}. StackError with status 409 if already answered, 400 for an
        invalid option, 403 if the user is not a respondent.
        """
        body = ac.UpdateHITLDetailPayload(chosen_options=list(chosen_options), params_input=dict(params_input or {}))
        return plain(self._call(self._tis.update_hitl_detail, dag_id, run_id, task_id, map_index, body))


class AirflowStack:
    """A real local Airflow (api-server, scheduler, triggerer, dag-processor) on SQLite, in state_dir;
    in Celery mode on PostgreSQL with Redis and Celery workers (see the module's docstring)."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        dags_folder: str | os.PathLike[str] | None = None,
        plugins_folder: str | os.PathLike[str] | None = None,
        python: str | None = None,
        port: int | None = None,
        parallelism: int = 8,
        *,
        executor: str = "LocalExecutor",
        database_url: str | None = None,
        broker_url: str | None = None,
        result_backend: str | None = None,
        celery_workers: Sequence[WorkerSpec] = (),
    ) -> None:
        """Default: LocalExecutor on SQLite (STATE/airflow.db). executor="CeleryExecutor" needs
        database_url (e.g. harness.services.Postgres.sqlalchemy_url), broker_url (Redis) and at least one
        WorkerSpec; result_backend defaults to "db+" + database_url. database_url alone (LocalExecutor)
        replaces SQLite."""
        if executor not in EXECUTORS:
            raise StackError(f"executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
        workers = list(celery_workers)
        if executor == "CeleryExecutor":
            if not database_url or not broker_url or not workers:
                raise StackError("CeleryExecutor needs database_url, broker_url and at least one WorkerSpec")
            names = [w.name for w in workers]
            bad = [n for n in names if not _WORKER_NAME.match(n)]
            if bad or len(set(names)) != len(names):
                raise StackError(f"worker names must be unique and [A-Za-z0-9_.-]: {names}")
        elif workers or broker_url or result_backend:
            raise StackError("celery_workers, broker_url and result_backend need executor='CeleryExecutor'")
        self.executor = executor
        self.database_url = database_url
        self.broker_url = broker_url
        self.result_backend = result_backend or (f"db+{database_url}" if executor == "CeleryExecutor" else None)
        self.celery_workers = workers
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
        self.workers_ready_in: float | None = None
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

    def password_of(self, user: str) -> str:
        """The password of ``user`` (``USERNAME`` or ``OUTSIDER``)."""
        return json.loads(self.password_file.read_text())[user]

    def _secrets(self) -> dict[str, str]:
        path = self.state_dir / "secrets.json"
        if path.exists():
            return json.loads(path.read_text())
        values = {
            "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "jwt_secret": secrets.token_urlsafe(48),
            "api_secret_key": secrets.token_urlsafe(32),
        }
        write_private(path, json.dumps(values))
        return values

    def ensure_password(self) -> None:
        """Create the demo user's password file (once); the password is readable from then on."""
        try:
            existing = json.loads(self.password_file.read_text())
        except (OSError, ValueError):
            existing = {}
        missing = [u for u in (USERNAME, OUTSIDER) if not existing.get(u)]
        for user in missing:
            existing[user] = secrets.token_urlsafe(18)
        if missing:
            write_private(self.password_file, json.dumps(existing) + "\n")

    def build_env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment of every component: inherited env, minus foreign AIRFLOW__ config, plus ours."""
        s = self._secrets()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__") and k != "AIRFLOW_CONFIG"}
        cfg = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.plugins_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__FERNET_KEY": s["fernet_key"],
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:{ROLE},{OUTSIDER}:",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.password_file),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url or f"sqlite:///{self.state_dir / 'airflow.db'}",
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
        if self.executor == "CeleryExecutor":
            cfg.update({
                "AIRFLOW__CELERY__BROKER_URL": str(self.broker_url),
                "AIRFLOW__CELERY__RESULT_BACKEND": str(self.result_backend),
                # Sending a task to the broker: 1 s by default, tight on 2 busy cores.
                "AIRFLOW__CELERY__OPERATION_TIMEOUT": "10",
                # Airflow's default (24 h), set so that every component does not warn that it is unset.
                "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
            })
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
            raise StackError(f"airflow {' '.join(args)} failed ({r.returncode}):\n{tail(log, 40)}")

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
            for spec in self.celery_workers:
                self._launch(spec.component)
            self._write_stack_file()
            self._wait_healthy(deadline=t0 + timeout)
            if self.celery_workers:
                self._wait_workers(self.celery_workers, deadline=t0 + timeout)
                self.workers_ready_in = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _worker(self, component: str) -> WorkerSpec | None:
        return next((w for w in self.celery_workers if w.component == component), None)

    def _launch(self, name: str) -> None:
        """Start one component in its own session, appending to its log file."""
        argv, env, cwd = [self.python, "-m", "airflow", name], self.env, self.state_dir
        spec = self._worker(name)
        if spec is not None:
            argv = [self.python, "-m", "airflow", "celery", "worker", "--celery-hostname", spec.name,
                    "--concurrency", str(spec.concurrency), "--skip-serve-logs"]
            if spec.queues:
                argv += ["--queues", spec.queues]
            cwd = Path(spec.cwd).resolve() if spec.cwd else self.state_dir / "workers" / spec.name
            cwd.mkdir(parents=True, exist_ok=True)
            env = dict(self.env)
            # The hostname callable lives in this repository: the worker runs from its own folder.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
            env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = WORKER_HOSTNAME_CALLABLE
            env[WORKER_HOSTNAME_ENV] = spec.hostname or spec.name
            env.update({k: str(v) for k, v in spec.env.items()})
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
            )

    def ping_workers(self, timeout: float = 1.0) -> set[str]:
        """Celery node names (``celery@<name>``) that answer a broadcast ping within ``timeout``."""
        from celery import Celery

        app = Celery(broker=self.broker_url, set_as_current=False)
        try:
            return {name for reply in app.control.ping(timeout=timeout) or [] for name in reply}
        except Exception:  # broker not reachable yet: nobody answered
            return set()
        finally:
            app.close()

    def _wait_workers(self, specs: Iterable[WorkerSpec], deadline: float) -> None:
        """Until every given worker answers a Celery ping (it is consuming); fails fast if one exits."""
        want = {s.node_name: s.component for s in specs}
        answered: set[str] = set()
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise StackError(f"airflow {name} exited with {p.returncode}:\n{self.log_tail(name)}")
            answered = self.ping_workers() & set(want)
            if answered == set(want):
                return
            if time.monotonic() > deadline:
                missing = sorted(set(want) - answered)
                raise StackError(f"Celery workers {missing} did not answer a ping in time\n"
                                 + "\n".join(f"== {want[n]}\n{self.log_tail(want[n], 15)}" for n in missing))

    def _write_stack_file(self) -> None:
        info = {"base_url": self.base_url, "port": self.port, "username": USERNAME,
                "password_file": str(self.password_file), "log_dir": str(self.log_dir),
                "pids": {n: p.pid for n, p in self.procs.items()}}
        (self.state_dir / "stack.json").write_text(json.dumps(info, indent=2) + "\n")

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise StackError(f"airflow {name} exited with {p.returncode}:\n{self.log_tail(name)}")
            last = probe_health(self.base_url)
            if isinstance(last, dict) and all((last.get(k) or {}).get("status") == "healthy" for k in HEALTH_KEYS):
                return
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
        dag-processor), the NEW process has heartbeated (a Celery worker ``celery-<name>``: answers a
        ping). Tests restart e.g. the triggerer while a task is deferred.
        """
        if name not in self.procs:
            raise StackError(f"unknown or stopped component {name!r} (running: {', '.join(self.procs)})")
        t0 = time.monotonic()
        deadline = t0 + timeout
        old = self.procs[name]
        kill_tree([old.pid], descendants(old.pid), stop_timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            old.wait(timeout=5)
        since = time.time()
        self._launch(name)
        self._write_stack_file()
        self._wait_healthy(deadline=deadline)
        spec = self._worker(name)
        if spec is not None:
            self._wait_workers([spec], deadline=deadline)
        if name in self._HEARTBEATS:
            key, field = self._HEARTBEATS[name]
            while True:
                if self.procs[name].poll() is not None:
                    raise StackError(f"airflow {name} exited with {self.procs[name].returncode} after "
                                     f"restart:\n{self.log_tail(name)}")
                health = probe_health(self.base_url)
                raw = (health.get(key) or {}).get(field) if isinstance(health, dict) else None
                with contextlib.suppress(ValueError):
                    stamp = datetime.datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
                    if stamp and stamp.timestamp() >= since:
                        break
                if time.monotonic() > deadline:
                    raise StackError(f"airflow {name} did not heartbeat within {timeout}s of its restart:\n"
                                     f"{self.log_tail(name, 15)}")
                time.sleep(0.5)
        return time.monotonic() - t0

    def log_tail(self, component: str, lines: int = 40) -> str:
        return tail(self.log_dir / f"{component}.log", lines)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate every component, its process group and all descendants (task processes included)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if not self.procs:
            return
        children: set[int] = set()
        for p in self.procs.values():
            children.update(descendants(p.pid))
        kill_tree([p.pid for p in self.procs.values()], children, timeout)
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
        seen.update(finished_task_instances(data[:cut].decode(errors="replace")))
        return (ti_id, try_number) in seen

    def create_pool(self, name: str, slots: int, include_deferred: bool = True) -> dict:
        return self.client().create_pool(name, slots, include_deferred=include_deferred)


def stop_from_state(state_dir: str | os.PathLike[str], timeout: float = 5.0) -> bool:
    """Stop a stack started by another process (reads STATE/stack.json). Returns False if none was running."""
    path = Path(state_dir) / "stack.json"
    if not path.exists():
        return False
    pids = list(json.loads(path.read_text())["pids"].values())
    running = [p for p in pids if alive(p)]
    children: set[int] = set()
    for p in running:
        children.update(descendants(p))
    kill_tree(running, children, timeout)
    path.unlink()
    return bool(running)


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
        health = probe_health(info["base_url"])
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
