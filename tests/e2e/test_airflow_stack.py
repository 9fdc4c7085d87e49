"""Proves the local-Airflow harness (harness/airflow_stack.py) against a REAL Airflow 3.3.

A tiny throwaway DAG (written into a tmp dags folder) exercises every component:
  prepare (@task, reads env/Variable/Connection passed through start())
  -> wait (DateTimeSensorAsync: deferred, so the triggerer must fire it; runs in a REST-created pool)
  -> approve (standard provider ApprovalOperator: parks in awaiting_input until answered via REST)
  -> after (@task)
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from harness.airflow_stack import AirflowStack, StackError


ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.e2e

DAG_ID = "harness_probe"
POOL = "probe_pool"

PROBE_DAG = textwrap.dedent(
    f'''
    from __future__ import annotations

    import os
    from datetime import datetime, timedelta, timezone

    from airflow.providers.standard.operators.hitl import ApprovalOperator
    from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
    from airflow.sdk import Connection, Param, Variable, chain, dag, task


    @dag(dag_id="{DAG_ID}", schedule=None, catchup=False, tags=["e2e"],
         params={{"label": Param("x", type="string")}})
    def probe():
        @task
        def prepare(**context) -> dict:
            conn = Connection.get("probe_conn")
            return {{
                "label": context["params"]["label"],
                "env": os.environ.get("RL_VERIFY_PROBE"),
                "var": Variable.get("probe_var"),
                "conn_host": conn.host,
                "conn_extra": conn.extra_dejson.get("flavour"),
                "target": (datetime.now(timezone.utc) + timedelta(seconds=3)).isoformat(),
            }}

        wait = DateTimeSensorAsync(
            task_id="wait", pool="{POOL}",
            target_time="{{{{ ti.xcom_pull(task_ids='prepare')['target'] }}}}",
        )
        approve = ApprovalOperator(
            task_id="approve", subject="Launch {{{{ params.label }}}}?", body="**card** for {{{{ run_id }}}}",
        )

        @task
        def after() -> str:
            return "launched"

        chain(prepare(), wait, approve, after())


    probe()
    '''
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("airflow_stack")
    dags = base / "dags"
    dags.mkdir()
    (dags / "probe_dag.py").write_text(PROBE_DAG)
    st = AirflowStack(base / "state", dags_folder=dags, plugins_folder=base / "plugins")
    t0 = time.monotonic()
    st.start(extra_env={
        "RL_VERIFY_PROBE": "from-start",
        "AIRFLOW_VAR_PROBE_VAR": "var-value",
        "AIRFLOW_CONN_PROBE_CONN": json.dumps(
            {"conn_type": "ssh", "host": "127.0.0.1", "port": 2222, "login": "u", "extra": {"flavour": "pinned"}}
        ),
    })
    print(f"\nAirflow healthy in {time.monotonic() - t0:.1f}s at {st.base_url}")
    try:
        api = st.client()
        st.create_pool(POOL, 1, include_deferred=True)
        api.wait_for_dag(DAG_ID, timeout=120)
        api.unpause(DAG_ID)
        yield st
    finally:
        st.stop()
        # Everything the stack started is gone.
        for name, p in list(st.procs.items()):
            assert p.poll() is not None, name


def test_health_auth_and_pool(stack):
    api = stack.client()
    health = api.health()
    assert {health[k]["status"] for k in ("metadatabase", "scheduler", "triggerer", "dag_processor")} == {"healthy"}
    pool = api.pool(POOL)
    assert pool["slots"] == 1 and pool["include_deferred"] is True
    # The password never reaches a log; the file is private.
    pw = stack.password
    assert (stack.password_file.stat().st_mode & 0o077) == 0
    for log in stack.log_dir.glob("*.log"):
        assert pw not in log.read_text(errors="replace"), log
    # Wrong password is refused.
    from harness.airflow_stack import AirflowClient

    with AirflowClient(stack.base_url, "demo", "wrong") as bad, pytest.raises(StackError):
        bad.login()


def test_import_errors_are_reported(stack, tmp_path):
    broken = Path(stack.dags_folder) / "broken_dag.py"
    broken.write_text("from airflow.sdk import dag\nraise RuntimeError('boom from broken dag')\n")
    try:
        with pytest.raises(StackError, match="boom from broken dag"):
            stack.client().wait_for_dag("broken_dag", timeout=60)
    finally:
        broken.unlink()


def test_approve_path(stack):
    api = stack.client()
    run_id = api.trigger(DAG_ID, {"label": "approve-me"}, run_id="e2e_approve")
    assert run_id == "e2e_approve"

    hitl = api.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=120)
    assert hitl["task_instance"]["state"] == "awaiting_input"
    assert hitl["subject"] == "Launch approve-me?"
    assert hitl["options"] == ["Approve", "Reject"]
    assert hitl["response_received"] is False
    # The deferrable sensor went through the triggerer before the approval was reached.
    assert api.task_states(DAG_ID, run_id)["wait"] == "success"

    resp = api.respond_hitl(DAG_ID, run_id, "approve", ["Approve"])
    assert resp["responded_by"]["name"] == "demo"
    assert resp["chosen_options"] == ["Approve"]

    assert api.wait_for_run(DAG_ID, run_id, timeout=120) == "success"
    assert api.task_states(DAG_ID, run_id) == {
        "prepare": "success", "wait": "success", "approve": "success", "after": "success"}

    detail = api.hitl_detail(DAG_ID, run_id, "approve")
    assert detail["response_received"] is True
    assert detail["responded_by_user"] == {"id": "demo", "name": "demo"}
    assert detail["chosen_options"] == ["Approve"]

    prepared = api.xcom(DAG_ID, run_id, "prepare")
    assert prepared["env"] == "from-start"
    assert prepared["var"] == "var-value"
    assert prepared["conn_host"] == "127.0.0.1" and prepared["conn_extra"] == "pinned"
    assert api.xcom(DAG_ID, run_id, "after") == "launched"

    wait_log = api.task_log(DAG_ID, run_id, "wait", 1)
    assert "trigger" in wait_log.lower(), wait_log
    assert api.task_log(DAG_ID, run_id, "after", 1)


def test_reject_path(stack):
    api = stack.client()
    run_id = api.trigger(DAG_ID, {"label": "reject-me"})
    api.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=120)
    resp = api.respond_hitl(DAG_ID, run_id, "approve", ["Reject"])
    assert resp["responded_by"]["name"] == "demo"
    # Answering twice is refused.
    with pytest.raises(StackError, match="409"):
        api.respond_hitl(DAG_ID, run_id, "approve", ["Approve"])

    assert api.wait_for_run(DAG_ID, run_id, timeout=120) == "success"
    states = api.task_states(DAG_ID, run_id)
    assert states["approve"] == "success"
    assert states["after"] == "skipped"
    assert api.hitl_detail(DAG_ID, run_id, "approve")["chosen_options"] == ["Reject"]


def test_a_runs_key_is_found_among_airflows_runs_with_its_state(stack, monkeypatch):
    """airflow_api.runs_by_key against the real API: how a readiness check learns that the run of a job it finds on
    a node has ended (issue 54)."""
    from harness.rig import api_connection_env
    from rl_verify import settings
    from rl_verify.core.names import run_key
    from rl_verify.orchestration import airflow_api

    api = stack.client()
    run_id = api.trigger(DAG_ID, {"label": "ended-run"})
    api.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=120)
    api.mark_task_failed(DAG_ID, run_id, "approve")
    assert api.wait_for_run(DAG_ID, run_id, timeout=120) == "failed"
    for name, value in api_connection_env(stack.base_url, stack.username, stack.password).items():
        monkeypatch.setenv(name, value)
    key = run_key(run_id)
    found = airflow_api.runs_by_key(settings.AIRFLOW_API_CONN_ID, [DAG_ID], {key, "unknown-00000000"})
    assert found == {key: {"dag_id": DAG_ID, "run_id": run_id, "state": "failed"}}


def test_mark_failed_then_clear(stack):
    api = stack.client()
    run_id = api.trigger(DAG_ID, {"label": "fail-me"})
    api.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=120)
    api.mark_task_failed(DAG_ID, run_id, "approve")
    assert api.wait_for_run(DAG_ID, run_id, timeout=120) == "failed"
    states = api.task_states(DAG_ID, run_id)
    assert states["approve"] == "failed" and states["after"] == "upstream_failed"

    api.clear_task(DAG_ID, run_id, "approve", include_downstream=True)
    hitl = api.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=120)
    assert hitl["task_instance"]["try_number"] == 2
    api.respond_hitl(DAG_ID, run_id, "approve", ["Approve"])
    assert api.wait_for_run(DAG_ID, run_id, timeout=120) == "success"
    assert api.task_states(DAG_ID, run_id)["after"] == "success"
