"""The local Airflow's public REST API (/api/v2) for the tests, the demo and the rig: ``AirflowClient``.

The test-side conveniences (trigger, wait for a state, answer an approval, read a log) over the one place
that speaks Airflow's REST API: the package's ``rl_verify.orchestration.airflow_api`` (the client its tasks
use), which builds the official ``apache-airflow-client``'s ApiClient, logs in at ``/auth/token`` and words a
failed call's error. On top of it: a re-login once on HTTP 401, an idempotent call sent again after a
transient database error, and every answer as the plain JSON-shaped data the API sent (``plain``), so that
callers index dicts instead of generated models. Reading a task log with all its structured fields is done
by hand (``AirflowClient.task_log``), explained there.

This module knows nothing about how the Airflow it talks to was started (that is
``harness.airflow_stack``); it imports no other harness module. It is named ``airflow_api``, not
``airflow_client``, so that it never shadows the official ``airflow_client`` package.

    with AirflowClient(base_url, "demo", password) as api:
        api.wait_for_dag("my_dag"); api.unpause("my_dag")
        run_id = api.trigger("my_dag", {"commit": "main"})
        assert api.wait_for_run("my_dag", run_id) == "success"
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import airflow_client.client as ac
import urllib3
from airflow_client.client.exceptions import ApiException, UnauthorizedException
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from rl_verify.orchestration import airflow_api as rest

TERMINAL_RUN_STATES = {"success", "failed"}
TERMINAL_TI_STATES = {"success", "failed", "skipped", "upstream_failed", "removed"}
#: Requests that may be sent again after a transient failure: they change nothing more the second time.
IDEMPOTENT_METHODS = {"GET", "PATCH", "PUT", "DELETE"}
DB_ERROR_RETRIES = 3


def transient_db_error(status: int | None, body: Any) -> bool:
    """True for the API server's answer to a database error it could not complete (HTTP 500 "Database
    error"), e.g. SQLite's "database is locked" while the scheduler holds the write lock."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    return status == 500 and '"reason":"Databaseerror"' in text.replace(" ", "")


class StackError(RuntimeError):
    """The local Airflow could not be started, or an API call did not give the expected result.

    For a failed API call ``status`` is the HTTP status and ``body`` the API's answer (else None and "").
    """

    def __init__(self, message: str, *, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


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
    api = rest.new_client(base_url.rstrip("/"), retries=0)  # the callers poll
    try:
        return plain(ac.MonitorApi(api).get_health(_request_timeout=timeout))
    except ApiException as e:
        return f"HTTP {e.status}"
    except (urllib3.exceptions.HTTPError, ValueError) as e:
        return repr(e)
    finally:
        api.rest_client.pool_manager.clear()


def api_error(err: ApiException, method: str, url: str) -> StackError:
    """StackError naming the method, the path (host left out) and the HTTP status of a failed API call."""
    return StackError(rest.error_text(err, method, url), status=err.status, body=rest.body_text(err))


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
        self._api = rest.new_client(self.base_url)
        self._dags, self._tasks = ac.DAGApi(self._api), ac.TaskApi(self._api)
        self._runs, self._tis = ac.DagRunApi(self._api), ac.TaskInstanceApi(self._api)
        self._pools, self._variables = ac.PoolApi(self._api), ac.VariableApi(self._api)
        self._import_errors, self._xcom = ac.ImportErrorApi(self._api), ac.XComApi(self._api)
        self._monitor, self._parsing = ac.MonitorApi(self._api), ac.DAGParsingApi(self._api)

    # -- plumbing -------------------------------------------------------------------------------
    def close(self) -> None:
        self._api.rest_client.pool_manager.clear()

    def __enter__(self) -> AirflowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def login(self) -> str:
        """POST /auth/token {"username", "password"} -> {"access_token"} (the package's ``login``, through this
        client's connection pool and timeout). A refused login raises StackError with the API's answer."""
        try:
            return rest.login(self._api, self.base_url, self.username, self._password, timeout=self.timeout)
        except rest.LoginRefused as err:
            raise StackError(f"POST /auth/token (login as {self.username!r}) -> HTTP {err.status}: {err.body[:300]}",
                             status=err.status, body=err.body) from err

    def _call(self, fn: Callable[..., Any], *args: Any, allow: Iterable[int] = (), auth: bool = True,
              **kw: Any) -> Any:
        """fn(*args, **kw) (a generated API method); logs in first and once more on HTTP 401.

        Returns None for a status in ``allow`` (e.g. 404); any other error raises StackError. An idempotent
        request (GET, PATCH, PUT, DELETE) that met a transient "Database error" (HTTP 500: SQLite's write
        lock held past its busy timeout by the scheduler on a loaded machine) is sent again, up to 3 times.
        """
        relogged, db_retries = False, 0
        while True:
            if auth and self._api.configuration.access_token is None:
                self.login()
            try:
                return fn(*args, _request_timeout=self.timeout, **kw)
            except UnauthorizedException as err:
                if relogged or not auth:
                    raise api_error(err, *self._api.last_request) from err
                relogged = True
                self._api.configuration.access_token = None  # expired: log in again and retry once
            except ApiException as err:
                if err.status in set(allow):
                    return None
                if (transient_db_error(err.status, err.body) and self._api.last_request[0] in IDEMPOTENT_METHODS
                        and db_retries < DB_ERROR_RETRIES):
                    db_retries += 1
                    time.sleep(float(db_retries))  # back off: the lock holder finishes its transaction
                    continue
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

    def dag(self, dag_id: str) -> dict[str, Any]:
        """GET /api/v2/dags/{dag_id} (its file token, next run's logical date, last parse time, ...)."""
        return plain(self._call(self._dags.get_dag, dag_id))

    def reparse(self, dag_id: str) -> None:
        """PUT /api/v2/parseDagFile/{file_token}: ask the dag processor to parse dag_id's file now."""
        self._call(self._parsing.reparse_dag_file, self.dag(dag_id)["file_token"])

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

    def failures(self, dag_id: str, run_id: str) -> str:
        """The exception each failed task of the run ended with (its log's "Task failed with exception"
        line), one per line, for a test's error message: "" when none is found. Never raises."""
        lines = []
        try:
            for ti in self.task_instances(dag_id, run_id):
                if ti["state"] != "failed" or ti.get("map_index", -1) != -1:
                    continue
                log = self.task_log(dag_id, run_id, ti["task_id"], try_number=max(int(ti.get("try_number") or 1), 1))
                for line in log.splitlines():
                    if "Task failed with exception" in line and "{" in line:
                        try:
                            detail = json.loads(line[line.index("{"):])["error_detail"][0]
                            lines.append(f"{ti['task_id']}: {detail['exc_type']}: {detail['exc_value']}")
                        except (ValueError, KeyError, IndexError, TypeError):
                            lines.append(f"{ti['task_id']}: {line[:2000]}")
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the error it decorates
            lines.append(f"(failures not read: {exc!r})")
        return "".join(f"\n  failed {line}" for line in lines)

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
                                 f"tasks: {self.task_states(dag_id, run_id)}{self.failures(dag_id, run_id)}")
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
