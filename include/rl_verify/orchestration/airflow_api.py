"""Airflow's public REST API, read through the official ``apache-airflow-client``.

Used where a task must read Airflow's own records beyond its own run (the Task SDK only reaches the
running task's own): the human response that granted a standing approval, the scheduled runs
before this one, the node pools a run needs. The API is reached through an Airflow connection
(``settings.AIRFLOW_API_CONN_ID``): ``host`` is the API server's base URL (``http://airflow-api:8080``,
or host + port + schema), and either ``password`` holds a bearer token (extra ``{"token": true}``) or
``login``/``password`` are exchanged for one at ``/auth/token`` (the simple and FAB auth managers both serve it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from rl_verify.core.names import run_key
from rl_verify.orchestration.standing import ApprovalRecord


class ApiUnavailable(RuntimeError):
    """The API connection is missing or the API cannot be reached/authenticated."""


def _base_url(conn: Any) -> str:
    host = (conn.host or "").rstrip("/")
    if "://" in host:
        return host
    if not host:
        raise ApiUnavailable(f"connection {conn.conn_id!r} has no host (the API server's base URL)")
    return f"{conn.schema or 'http'}://{host}" + (f":{conn.port}" if conn.port else "")


class LoginRefused(ApiUnavailable):
    """The API server answered the login (``/auth/token``) with an error: ``status`` and ``body`` are its answer."""

    def __init__(self, message: str, *, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _retries() -> Any:
    """What every request of a task retries: a refused connection and an API server error (a metadata database
    busy for a moment answers 500 "Database error"), 4 times over ~7 s. Every call here is safe to repeat: the
    states set are absolute and a run triggered twice is found as the same run (``trigger_run``)."""
    from urllib3.util.retry import Retry

    return Retry(total=4, backoff_factor=0.5, status_forcelist=(500, 502, 503, 504), allowed_methods=None,
                 raise_on_status=False)


@functools.cache
def _recording_client_class() -> type:
    """The generated ``ApiClient``, remembering its last request (``last_request``: method, URL) so that an error
    can name them. Built on first use: the official client is imported only by the code that calls the API."""
    import airflow_client.client as ac

    class RecordingApiClient(ac.ApiClient):
        last_request: tuple[str, str] = ("?", "?")

        def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.last_request = (method, url)
            return super().call_api(method, url, *args, **kwargs)

    return RecordingApiClient


def new_client(base: str, *, access_token: str | None = None, retries: Any = None) -> Any:
    """An ``airflow_client.client.ApiClient`` for the API server at ``base`` that records its last request
    (``last_request``). ``retries``: a urllib3 ``Retry`` (None: urllib3's default, connection errors only)."""
    import airflow_client.client as ac

    return _recording_client_class()(ac.Configuration(host=base, access_token=access_token, retries=retries))


def login(client: Any, base: str, username: str | None, password: str | None, timeout: float = 20) -> str:
    """Exchanges ``username``/``password`` for a bearer token at ``/auth/token`` (the simple and FAB auth managers
    both serve it), sets it on ``client`` and returns it.

    ``/auth/token`` belongs to the auth manager, not to the public API, so the generated client has no method for
    it: one raw call through ``client`` (its connection pool and retries). Raises ApiUnavailable when the server
    cannot be reached, LoginRefused when it refuses the login.
    """
    import urllib3

    try:
        r = client.call_api("POST", f"{base}/auth/token",
                            header_params={"Content-Type": "application/json", "Accept": "application/json"},
                            body={"username": username, "password": password}, _request_timeout=timeout)
        text = r.read().decode(errors="replace")
    except urllib3.exceptions.HTTPError as err:
        raise ApiUnavailable(f"cannot reach the Airflow API at {base}: {err}") from err
    if r.status not in (200, 201):
        raise LoginRefused(f"login to the Airflow API at {base} as {username!r} failed: HTTP {r.status}",
                           status=r.status, body=text)
    client.configuration.access_token = token = str(json.loads(text)["access_token"])
    return token


def error_text(err: Any, method: str, url: str) -> str:
    """A failed call (an ``ApiException``) as "METHOD /path -> HTTP status: body" (the host left out, the body
    cut at 2000 characters)."""
    path = "/" + url.split("://", 1)[-1].split("/", 1)[-1] if "://" in url else url
    return f"{method} {path} -> HTTP {err.status}: {body_text(err)[:2000]}"


def body_text(err: Any) -> str:
    """The body of a failed call's answer (an ``ApiException``) as text."""
    return err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")


@contextmanager
def api_client(conn_id: str) -> Iterator[Any]:
    """An authenticated ``airflow_client.client.ApiClient`` for the connection ``conn_id``."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as err:
        raise ApiUnavailable(f"no Airflow connection {conn_id!r} (the API server's URL and a user allowed to "
                             "read DAG runs)") from err
    base = _base_url(conn)
    with new_client(base, retries=_retries()) as client:
        if (conn.extra_dejson or {}).get("token"):
            client.configuration.access_token = conn.password or ""
        else:
            login(client, base, conn.login, conn.password)
        yield client


def approval_record(conn_id: str, dag_id: str, dag_run_id: str, task_id: str) -> ApprovalRecord | None:
    """Airflow's record of the human response at ``task_id`` of a run; None when there is none."""
    import airflow_client.client as ac
    from airflow_client.client.exceptions import NotFoundException

    with api_client(conn_id) as client:
        try:
            run = ac.DagRunApi(client).get_dag_run(dag_id, dag_run_id)
            detail = ac.TaskInstanceApi(client).get_hitl_detail(dag_id, dag_run_id, task_id, -1)
        except NotFoundException:
            return None
    user = detail.responded_by_user
    return ApprovalRecord(run_type=str(getattr(run.run_type, "value", run.run_type)),
                          responded_by=user.name if user else None, responded_at=detail.responded_at,
                          chosen_options=list(detail.chosen_options or []),
                          params_input=dict(detail.params_input or {}), body=detail.body or "")


def previous_scheduled_run(conn_id: str, dag_id: str, before: datetime) -> datetime | None:
    """Logical date of the newest scheduled run of ``dag_id`` before ``before`` (None if none)."""
    import airflow_client.client as ac

    with api_client(conn_id) as client:
        runs = ac.DagRunApi(client).get_dag_runs(dag_id, run_type=["scheduled"], logical_date_lt=before,
                                                 order_by=["-logical_date"], limit=1)
    for run in runs.dag_runs:
        if run.logical_date is not None:
            return run.logical_date
    return None


def set_run_note(conn_id: str, dag_id: str, dag_run_id: str, note: str) -> None:
    """Set the DAG run's note (shown on the run page); the API caps a note at 1000 characters."""
    import airflow_client.client as ac

    with api_client(conn_id) as client:
        ac.DagRunApi(client).patch_dag_run(dag_id, dag_run_id, ac.DAGRunPatchBody(note=note[:1000]),
                                           update_mask=["note"])


def pool(conn_id: str, name: str) -> dict[str, Any] | None:
    """The pool ``name`` (``slots``, ``include_deferred``), or None when it does not exist."""
    import airflow_client.client as ac
    from airflow_client.client.exceptions import NotFoundException

    with api_client(conn_id) as client:
        try:
            found = ac.PoolApi(client).get_pool(name)
        except NotFoundException:
            return None
    return {"slots": found.slots, "include_deferred": bool(found.include_deferred)}


def trigger_run(conn_id: str, dag_id: str, dag_run_id: str, conf: dict[str, Any], note: str | None = None) -> str:
    """Trigger a run of ``dag_id`` with ``conf`` (its params) under the id ``dag_run_id``; an id that already
    exists is taken as this same run, triggered before a retry. Returns the run id."""
    import airflow_client.client as ac
    from airflow_client.client.exceptions import ConflictException

    with api_client(conn_id) as client:
        try:
            ac.DagRunApi(client).trigger_dag_run(dag_id, ac.TriggerDAGRunPostBody(
                dag_run_id=dag_run_id, conf=conf, note=(note or "")[:1000] or None, logical_date=None))
        except ConflictException:
            pass
    return dag_run_id


def task_states(conn_id: str, dag_id: str, dag_run_id: str) -> dict[str, str]:
    """Every task instance of the run and its state ("none" for a task not scheduled yet)."""
    import airflow_client.client as ac

    with api_client(conn_id) as client:
        found = ac.TaskInstanceApi(client).get_task_instances(dag_id, dag_run_id, limit=1000)
    return {ti.task_id: str(getattr(ti.state, "value", ti.state) or "none") for ti in found.task_instances}


def skip_tasks(conn_id: str, dag_id: str, dag_run_id: str, task_ids: list[str], note: str) -> None:
    """Mark task instances of the run skipped, with ``note`` saying why (one API session, one request a task; one
    skipped already is left as it is). Raises the client's error when the API refuses or cannot be reached."""
    import airflow_client.client as ac
    from airflow_client.client.exceptions import ConflictException

    with api_client(conn_id) as client:
        api = ac.TaskInstanceApi(client)
        for task_id in task_ids:
            try:
                api.patch_task_instance(dag_id, dag_run_id, task_id,
                                        ac.PatchTaskInstanceBody(new_state="skipped", note=note[:1000]))
            except ConflictException:  # 409: the task instance is skipped already
                continue


def set_task_note(conn_id: str, dag_id: str, dag_run_id: str, task_id: str, note: str) -> None:
    """Set one task instance's note (the grid marks a task with a note and shows it in its details)."""
    import airflow_client.client as ac

    with api_client(conn_id) as client:
        ac.TaskInstanceApi(client).patch_task_instance(dag_id, dag_run_id, task_id,
                                                       ac.PatchTaskInstanceBody(note=note[:1000]), update_mask=["note"])


def fail_task(conn_id: str, dag_id: str, dag_run_id: str, task_id: str, note: str) -> None:
    """Mark one task instance failed (a running one is stopped by Airflow), with ``note`` saying why."""
    import airflow_client.client as ac

    with api_client(conn_id) as client:
        ac.TaskInstanceApi(client).patch_task_instance(
            dag_id, dag_run_id, task_id, ac.PatchTaskInstanceBody(new_state="failed", note=note[:1000]))


def runs_by_key(conn_id: str, dag_ids: list[str], keys: set[str], newest: int = 200) -> dict[str, dict[str, str]]:
    """The DAG runs (``dag_id``, ``run_id``, ``state``) among the ``newest`` runs of each of ``dag_ids`` whose run
    key (the marker their node jobs carry) is one of ``keys``. Raises the client's error when the API cannot say."""
    import airflow_client.client as ac

    found: dict[str, dict[str, str]] = {}
    with api_client(conn_id) as client:
        for dag_id in dag_ids:
            runs = ac.DagRunApi(client).get_dag_runs(dag_id, order_by=["-run_after"], limit=newest)
            for run in runs.dag_runs:
                key = run_key(run.dag_run_id)
                if key in keys:
                    found[key] = {"dag_id": dag_id, "run_id": run.dag_run_id,
                                  "state": str(getattr(run.state, "value", run.state))}
    return found
