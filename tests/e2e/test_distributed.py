"""The distributed deployment end to end, all real on 127.0.0.1: PostgreSQL metadata database, Redis
broker, CeleryExecutor with two workers (each with its own working and staging folders: nothing shared
but the object store), the record in a SeaweedFS S3 bucket through ObjectStoragePath, two simulated
GPU nodes. Every wait is for a state (harness/rig.py), never a guessed duration.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.rig import CONN_ID, DAG_ID, RECORDS_BUCKET, WORKERS, Rig, node_connection_env
from rl_verify.core.names import run_key
from simulator import node as sim

pytestmark = pytest.mark.e2e

STEP_SECONDS = 0.1
NODE_B = f"{CONN_ID}_2"
UNPINNED = "rl_gpu_node_unpinned"


@pytest.fixture(scope="module")
def rig(start_rig):
    with start_rig("distributed-rig", records=False, step_seconds=STEP_SECONDS, nodes=2, distributed=True,
                   extra_env=_unpinned_env) as rig:
        print(f"\ndistributed rig up: {json.dumps({k: round(v, 1) for k, v in rig.timings.items()})}")
        yield rig


def _unpinned_env(rig: Rig) -> dict[str, str]:
    """Node b once more, without its pinned host key: the DAG must refuse it."""
    return {"RL_VERIFY_JOB_POLL_INTERVAL_S": "1",
            **node_connection_env(UNPINNED, rig.nodes[NODE_B], host_key=False)}


@pytest.fixture()
def nodes(rig):
    for conn_id in rig.nodes:
        sim.clear_faults(rig.node_state(conn_id))
    yield rig.nodes
    for conn_id in rig.nodes:
        sim.clear_faults(rig.node_state(conn_id))


def _stored(rig: Rig, run_id: str) -> dict[str, bytes]:
    """Every object of the run's record in the bucket, by path relative to the record."""
    client = rig.s3.client()
    prefix = f"records/{DAG_ID}/{run_key(run_id)}/"
    out: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=RECORDS_BUCKET, Prefix=prefix):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=RECORDS_BUCKET, Key=item["Key"])["Body"].read()
            out[item["Key"][len(prefix):]] = body
    return out


def _task_instances(rig: Rig, run_id: str) -> dict[str, dict[str, Any]]:
    return {ti["task_id"]: ti for ti in rig.client.task_instances(DAG_ID, run_id)}


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _why(rig: Rig, run_id: str, suite: str) -> str:
    """What a failed assertion on a run's verdict needs to be read: the suite's findings and its run log's end."""
    report = json.loads(_stored(rig, run_id).get("report.json", b"{}") or b"{}")
    abnormal = [line for entry in report.get("suites", []) if entry.get("suite") == suite
                for line in entry.get("abnormal", [])]
    log = rig.client.task_log(DAG_ID, run_id, f"run_{suite}")
    return f"findings: {abnormal}\nrun_{suite} log (end):\n{log[-4000:]}"


def _assert_record_complete(rig: Rig, run_id: str, summary: dict[str, Any]) -> dict[str, bytes]:
    stored = _stored(rig, run_id)
    assert summary["record"] == f"s3://rl_verify_records@{RECORDS_BUCKET}/records/{DAG_ID}/{run_key(run_id)}"
    manifest = json.loads(stored["manifest.json"])
    assert manifest["record"] == summary["record"]
    listed = {f["path"]: f["sha256"] for f in manifest["files"]}
    assert {"report.md", "report.html", "report.json", "card.md", "commit.json"} <= set(listed)
    for path, digest in listed.items():
        assert hashlib.sha256(stored[path]).hexdigest() == digest, f"{path}: stored object differs from manifest"
    assert set(stored) - {"manifest.json"} == set(listed), "objects in the store that the manifest does not list"
    # Nothing of any task is left on a worker's disk: the next task got it all from the store.
    for worker in WORKERS:
        assert list(rig.worker_staging(worker).iterdir()) == [], f"{worker} kept a task's working copy"
    return stored


def _assert_nodes_clean(rig: Rig) -> None:
    for conn_id in rig.nodes:
        assert sim.node_processes(rig.node_state(conn_id)) == [], conn_id


def test_suites_on_two_nodes_train_at_once_tasks_run_on_both_workers_and_the_record_lives_in_s3(rig, nodes):
    out = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": f"grpo={CONN_ID},opd={NODE_B}"})
    assert out.state == "success", json.dumps(out.tasks)
    assert out.summary["verdict"] == "PASS"
    tis = _task_instances(rig, out.run_id)
    hosts = {task: ti["hostname"] for task, ti in tis.items() if ti["state"] == "success"}
    print(f"\nworkers: {json.dumps(hosts)}")
    assert set(hosts.values()) == set(WORKERS), hosts  # one run, tasks on both workers
    # Each training took the pool of the node it used (chosen at run time by the cluster policy).
    assert tis["run_grpo"]["pool"] == f"rl_node_{CONN_ID}" and tis["run_opd"]["pool"] == f"rl_node_{NODE_B}"
    grpo, opd = tis["run_grpo"], tis["run_opd"]
    assert max(_at(grpo["start_date"]), _at(opd["start_date"])) < min(_at(grpo["end_date"]), _at(opd["end_date"])), \
        "the two trainings did not overlap"
    key = run_key(out.run_id)
    for conn_id, suite, other in ((CONN_ID, "grpo", "opd"), (NODE_B, "opd", "grpo")):
        jobs = Path(rig.nodes[conn_id]["root"]) / "runs" / key / "jobs"
        assert (jobs / suite).is_dir() and not (jobs / other).exists(), f"{suite} must train on {conn_id} only"
    stored = _assert_record_complete(rig, out.run_id, out.summary)
    assert json.loads(stored["commit.json"])["suite_nodes"] == {"grpo": CONN_ID, "opd": NODE_B}
    report = json.loads(stored["report.json"])
    assert report["verdict"] == "PASS" and report["node"] == f"grpo on {CONN_ID}, opd on {NODE_B}"
    # The record's place (the bucket's URL) is said once above the files table; each file by its path in it.
    md = stored["report.md"].decode()
    assert f"`{out.summary['record']}`" in md and "| `grpo/tracker.jsonl` |" in md
    # The API server reads the report from the bucket too.
    with httpx.Client(base_url=rig.stack.base_url, timeout=30) as http:
        token = rig.client.login()
        page = http.get(f"/rl-verify/dags/{DAG_ID}/runs/{out.run_id}/report",
                        headers={"Authorization": f"Bearer {token}"})
    assert page.status_code == 200 and "PASS" in page.text
    _assert_nodes_clean(rig)


def test_a_regression_on_the_second_node_fails_with_its_report_in_s3(rig, nodes):
    # Held (alive) before its last step: only the early abort ends it there.
    sim.set_fault(rig.node_state(NODE_B), "opd", "hold", at_step=24)
    # One run (repeats 0): the repeats have their own tests (test_confirmation.py).
    out = rig.run({"commit": "sim/regress-teacher", "suites": ["opd"], "node": NODE_B, "repeats": 0})
    assert out.state == "failed", json.dumps(out.tasks)
    assert out.tasks["compare_opd"] == "failed" and out.tasks["report"] == "success"
    assert out.summary["verdict"] == "FAIL" and out.summary["failure_classes"] == ["accuracy"], \
        _why(rig, out.run_id, "opd")
    assert _task_instances(rig, out.run_id)["run_opd"]["pool"] == f"rl_node_{NODE_B}"
    stored = _assert_record_complete(rig, out.run_id, out.summary)
    assert "distillation/reduced_distillation_kl" in stored["report.md"].decode()
    assert json.loads(stored["opd/result.json"])["verdict"] == "FAIL"
    _assert_nodes_clean(rig)


def test_an_unknown_node_and_an_unpinned_node_fail_before_anything_is_launched_naming_both(rig, nodes):
    out = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": f"grpo=no_such_node,opd={UNPINNED}"},
                  decision=None)
    assert out.state == "failed" and out.tasks["resolve_commit"] == "failed", json.dumps(out.tasks)
    assert out.tasks["run_grpo"] == out.tasks["run_opd"] == "upstream_failed"
    log = rig.client.task_log(DAG_ID, out.run_id, "resolve_commit")
    assert "node 'no_such_node': there is no Airflow connection with this id" in log
    assert f"connection '{UNPINNED}' has no pinned host key" in log
    for conn_id in rig.nodes:
        assert not (Path(rig.nodes[conn_id]["root"]) / "runs" / run_key(out.run_id)).exists()
