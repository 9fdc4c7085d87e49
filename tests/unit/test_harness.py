"""The local-Airflow harness's pure parts (no Airflow started): the scheduler-log pattern it depends on,
the conversion of the official client's models to plain data, log rendering, errors and re-login, the
Celery workers' hostname callable, and the harness's import graph (no circle, leaves stay leaves)."""

from __future__ import annotations

import ast
import datetime
import importlib
from pathlib import Path

import airflow_client.client as ac
import pytest
from airflow_client.client.exceptions import ApiException, NotFoundException, UnauthorizedException

from harness.airflow_api import (AirflowClient, StackError, api_error, plain, probe_health, render_log_line,
                                 transient_db_error)
from harness.airflow_stack import SCHEDULER_TI_FINISHED, AirflowStack, finished_task_instances
from harness.celery_hostname import WORKER_HOSTNAME_CALLABLE, WORKER_HOSTNAME_ENV
from harness.processes import free_port

HARNESS = Path(__file__).resolve().parents[2] / "harness"

# A line of a real Airflow 3.3.2 scheduler log (SchedulerJobRunner.process_executor_events).
FINISHED_LINE = (
    "2026-11-30T12:51:59.243750Z [info     ] TaskInstance Finished: dag_id=rl_accuracy_verification, "
    "task_id=resolve_commit, run_id=manual__2026-11-30T12:51:49.370908+00:00, map_index=-1, "
    "ti_id=01a22c82-f427-732a-bc0b-c3930c070e35, run_start_date=2026-11-30 12:51:50.405851+00:00, "
    "run_end_date=2026-11-30 12:51:58.996877+00:00, run_duration=8.591, state=success, "
    "executor=LocalExecutor(parallelism=8), executor_state=success, try_number=1, max_tries=2, "
    "pool=default_pool, queue=default, priority_weight=13, operator=_PythonDecoratedOperator, "
    "queued_dttm=2026-11-30 12:51:50.249850+00:00, scheduled_dttm=2026-11-30 12:51:50.233500+00:00,"
    "queued_by_job_id=1, pid=29704 [airflow.jobs.scheduler_job_runner.SchedulerJobRunner] "
    "loc=scheduler_job_runner.py:1439"
)
TI_ID = "01a22c82-f427-732a-bc0b-c3930c070e35"


# ------------------------------------------------------------------ scheduler log (3.3.2 wording)

def test_the_scheduler_pattern_reads_ti_id_and_try_number_of_a_3_3_2_line():
    m = SCHEDULER_TI_FINISHED.search(FINISHED_LINE)
    assert m is not None
    assert (m.group(1), int(m.group(2))) == (TI_ID, 1)


def test_finished_task_instances_reads_every_finished_line_and_nothing_else():
    other = FINISHED_LINE.replace(TI_ID, "0000aaaa-0000-0000-0000-00000000bbbb")
    other = other.replace("try_number=1,", "try_number=3,")
    text = "\n".join([
        "2026-11-30T12:51:58Z [info     ] Received executor event with state success for task instance "
        f"TaskInstanceKey(dag_id='d', task_id='t', run_id='r', try_number=1, map_index=-1) ti_id={TI_ID},",
        FINISHED_LINE,
        other,
        FINISHED_LINE.replace("TaskInstance Finished", "TaskInstance Done"),  # other wording: not read
    ])
    assert finished_task_instances(text) == {(TI_ID, 1), ("0000aaaa-0000-0000-0000-00000000bbbb", 3)}
    assert finished_task_instances("") == set()


def test_worker_released_reads_only_complete_new_lines_of_the_scheduler_log(tmp_path):
    stack = AirflowStack(tmp_path / "state")
    assert stack.worker_released(TI_ID, 1) is False  # no log yet
    log = stack.log_dir / "scheduler.log"
    log.parent.mkdir(parents=True)
    half = len(FINISHED_LINE) // 2
    log.write_text("starting\n" + FINISHED_LINE[:half])
    assert stack.worker_released(TI_ID, 1) is False  # the line is not complete yet
    with open(log, "a") as f:
        f.write(FINISHED_LINE[half:] + "\n")
    assert stack.worker_released(TI_ID, 1) is True
    assert stack.worker_released(TI_ID, 2) is False  # another try of the same task instance
    log.write_text("")  # remembered, not re-read
    assert stack.worker_released(TI_ID, 1) is True


# ------------------------------------------------------------------ generated models -> plain data

def test_plain_keeps_none_renders_datetimes_and_enums_and_nests():
    at = datetime.datetime(2026, 11, 30, 12, 51, 59, tzinfo=datetime.timezone.utc)
    resp = ac.HITLDetailResponse(chosen_options=["Approve"], params_input={"standing_approval": True},
                                 responded_at=at, responded_by=ac.HITLUser(id="demo", name="demo"))
    assert plain(resp) == {"chosen_options": ["Approve"], "params_input": {"standing_approval": True},
                           "responded_at": "2026-11-30T12:51:59Z", "responded_by": {"id": "demo", "name": "demo"}}
    assert plain(ac.DAGRunPatchBody(state="failed")) == {"note": None, "state": "failed"}
    body = plain(ac.PatchTaskInstanceBody(new_state="failed"))
    assert body["new_state"] == "failed" and body["note"] is None
    assert plain([ac.HITLUser(id="a", name="b")]) == [{"id": "a", "name": "b"}]


def test_plain_merges_additional_properties_and_unwraps_any_of():
    line = ac.StructuredLogMessage.from_dict({"event": "hello", "timestamp": "2026-11-30T12:00:00Z",
                                              "level": "info", "error_detail": [{"exc_value": "boom"}]})
    assert plain(line) == {"event": "hello", "timestamp": "2026-11-30T12:00:00Z", "level": "info",
                           "error_detail": [{"exc_value": "boom"}]}
    assert plain(ac.Content.from_json('["plain line"]')) == ["plain line"]
    entry = ac.ResponseGetXcomEntry.from_dict({
        "dag_display_name": "d", "dag_id": "d", "key": "return_value", "map_index": -1,
        "run_after": "2026-11-30T12:00:00Z", "run_id": "r", "task_display_name": "t", "task_id": "t",
        "timestamp": "2026-11-30T12:00:01Z", "value": {"verdict": "PASS", "n": [1, 2]},
    })
    assert plain(entry)["value"] == {"verdict": "PASS", "n": [1, 2]}


def test_the_generated_log_model_drops_all_but_event_and_timestamp():
    """Why AirflowClient.task_log parses the log JSON itself: if this starts failing, the generated
    client keeps the structured fields and task_log can use TaskInstanceApi.get_log."""
    page = ac.TaskInstancesLogResponse.from_json(
        '{"content": [{"event": "failed", "level": "error", "error_detail": [{"exc_value": "boom"}]}],'
        ' "continuation_token": null}')
    assert plain(page.content) == [{"event": "failed", "timestamp": None}]


def test_render_log_line():
    assert render_log_line("raw text") == "raw text"
    line = {"event": "hi", "timestamp": "2026-11-30T12:00:00Z", "level": "info", "logger": "task", "k": None}
    assert render_log_line(line) == '[2026-11-30T12:00:00Z info] hi {"k": null}'
    assert render_log_line({"event": "::group::", "timestamp": None, "sources": ["a"]}) == "::group::"
    assert render_log_line({"event": "boom", "error_detail": [{"exc_type": "X"}]}) == \
        'boom {"error_detail": [{"exc_type": "X"}]}'


# ------------------------------------------------------------------ errors and re-login

def test_api_error_names_method_path_and_status():
    err = api_error(NotFoundException(status=404, reason="Not Found", body='{"detail": "no such dag"}'),
                    "GET", "http://127.0.0.1:8080/api/v2/dags/x?limit=1")
    assert isinstance(err, StackError)
    assert str(err) == 'GET /api/v2/dags/x?limit=1 -> HTTP 404: {"detail": "no such dag"}'
    assert (err.status, err.body) == (404, '{"detail": "no such dag"}')


@pytest.fixture()
def client(monkeypatch):
    c = AirflowClient("http://127.0.0.1:1", "demo", "pw")
    logins: list[str] = []

    def login() -> str:
        token = f"token-{len(logins)}"
        logins.append(token)
        c._api.configuration.access_token = token
        return token

    monkeypatch.setattr(c, "login", login)
    c.logins = logins  # type: ignore[attr-defined]
    yield c
    c.close()


def test_call_logs_in_first_and_once_more_on_401(client):
    calls = []

    def endpoint(*args, _request_timeout=None, **kw):
        calls.append(client._api.configuration.access_token)
        if len(calls) == 1:
            raise UnauthorizedException(status=401, reason="Unauthorized", body="expired")
        return "ok"

    assert client._call(endpoint) == "ok"
    assert client.logins == ["token-0", "token-1"] and calls == ["token-0", "token-1"]


def test_call_raises_stack_error_on_a_second_401_and_passes_allowed_statuses(client):
    def unauthorized(*args, **kw):
        raise UnauthorizedException(status=401, reason="Unauthorized", body="bad token")

    with pytest.raises(StackError, match="HTTP 401: bad token") as err:
        client._call(unauthorized)
    assert err.value.status == 401 and len(client.logins) == 2

    def missing(*args, **kw):
        raise NotFoundException(status=404, reason="Not Found", body="{}")

    assert client._call(missing, allow=(404,)) is None
    with pytest.raises(StackError, match="HTTP 404"):
        client._call(missing)

    def conflict(*args, **kw):
        raise ApiException(status=409, reason="Conflict", body="exists")

    with pytest.raises(StackError, match="HTTP 409: exists"):
        client._call(conflict, allow=(404,))


DB_ERROR = ('{"detail":{"reason":"Database error","statement":"hidden","orig_error":"hidden","message":'
            '"Serious error when handling your request."}}')


def test_an_idempotent_call_that_met_a_database_error_is_sent_again_and_a_post_is_not(client, monkeypatch):
    monkeypatch.setattr("harness.airflow_api.time.sleep", lambda s: None)
    calls = []

    def locked_twice(method):
        def endpoint(*args, **kw):
            client._api.last_request = (method, "http://127.0.0.1:1/api/v2/dags/d")
            calls.append(method)
            if len(calls) <= 2:
                raise ApiException(status=500, reason="Internal Server Error", body=DB_ERROR)
            return "ok"
        return endpoint

    assert client._call(locked_twice("PATCH")) == "ok" and calls == ["PATCH"] * 3
    calls.clear()
    with pytest.raises(StackError, match="POST /api/v2/dags/d -> HTTP 500"):
        client._call(locked_twice("POST"))  # a trigger sent twice could start two runs
    assert calls == ["POST"]

    def always_locked(*args, **kw):
        client._api.last_request = ("GET", "http://127.0.0.1:1/api/v2/dags/d")
        calls.append("GET")
        raise ApiException(status=500, reason="Internal Server Error", body=DB_ERROR)

    calls.clear()
    with pytest.raises(StackError, match="HTTP 500"):
        client._call(always_locked)
    assert calls == ["GET"] * 4
    assert not transient_db_error(500, '{"detail": "Internal Server Error"}') and transient_db_error(500, DB_ERROR)


def test_probe_health_says_why_when_nothing_answers():
    answer = probe_health(f"http://127.0.0.1:{free_port()}", timeout=2)
    assert isinstance(answer, str) and answer


# ------------------------------------------------------------------ Celery workers' hostname

def test_the_hostname_callable_airflow_is_given_is_the_workers_own_name(monkeypatch):
    module, _, name = WORKER_HOSTNAME_CALLABLE.rpartition(".")
    hostname = getattr(importlib.import_module(module), name)
    monkeypatch.setenv(WORKER_HOSTNAME_ENV, "worker-a")
    assert hostname() == "worker-a"
    monkeypatch.delenv(WORKER_HOSTNAME_ENV)
    assert hostname()  # Airflow's default then: the machine's FQDN


# ------------------------------------------------------------------ import graph

def _harness_imports() -> dict[str, set[str]]:
    """{module: harness modules it imports}, counting every import statement (inside functions too)."""
    names = {p.stem for p in HARNESS.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        imported: set[str] = set()
        for node in ast.walk(ast.parse((HARNESS / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                dotted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"harness/{name}.py: relative import"
                dotted = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            imported |= {d.split(".")[1] for d in dotted if d.startswith("harness.") and d.split(".")[1] in names}
        graph[name] = imported - {name}
    return graph


def test_the_harness_has_no_import_circle_and_its_leaves_import_no_harness_module():
    graph = _harness_imports()
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            assert module != start, f"import circle through harness.{start}"
            if module not in seen:
                seen.add(module)
                todo += graph[module]
    for leaf in ("processes", "celery_hostname", "airflow_api"):
        assert graph[leaf] == set(), f"harness.{leaf} must import no harness module: {graph[leaf]}"


def test_an_expired_token_after_database_errors_is_still_renewed_once(client, monkeypatch):
    monkeypatch.setattr("harness.airflow_api.time.sleep", lambda s: None)
    answers = iter([ApiException(status=500, reason="Internal Server Error", body=DB_ERROR)] * 3
                   + [UnauthorizedException(status=401, reason="Unauthorized", body="expired")])

    def endpoint(*args, **kw):
        client._api.last_request = ("GET", "http://127.0.0.1:1/api/v2/dags/d")
        answer = next(answers, None)
        if answer is not None:
            raise answer
        return "ok"

    assert client._call(endpoint) == "ok" and client.logins == ["token-0", "token-1"]
