"""Which live jobs on a node belong to runs that have ended: the job's marker and Airflow's record must agree."""

from __future__ import annotations

from rl_verify.orchestration.nodes import ended_runs

JOBS = [{"run_dir": "/r/runs/a-1", "run": "a-1", "suite": "grpo", "pid": "10"},
        {"run_dir": "/r/runs/a-1", "run": "a-1", "suite": "opd", "pid": "11"},
        {"run_dir": "/r/runs/b-2", "run": "b-2", "suite": "grpo", "pid": "12"},
        {"run_dir": "/r/runs/c-3", "run": "c-3", "suite": "grpo", "pid": "13"}]


def test_only_runs_airflow_knows_as_ended_are_named_once_each_with_their_folder():
    runs = {"a-1": {"dag_id": "d", "run_id": "a", "state": "failed"},
            "b-2": {"dag_id": "d", "run_id": "b", "state": "running"}}
    assert ended_runs(JOBS, runs, own_key="x-0") == {
        "a-1": {"dag_id": "d", "run_id": "a", "state": "failed", "run_dir": "/r/runs/a-1"}}


def test_a_run_airflow_does_not_know_or_this_runs_own_job_is_never_stopped():
    runs = {"a-1": {"dag_id": "d", "run_id": "a", "state": "success"}}
    assert ended_runs(JOBS, runs, own_key="a-1") == {}
    assert ended_runs(JOBS, {}, own_key="x-0") == {}
    assert ended_runs(JOBS, {"c-3": {"dag_id": "d", "run_id": "c", "state": "queued"}}, own_key="x-0") == {}
