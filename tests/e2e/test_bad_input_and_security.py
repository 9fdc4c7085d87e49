"""Bad input and security through a real Airflow (one Rig for the module, few runs).

1. Every bad ``commit`` / ``suites`` of the issue's matrix is refused by the REST API at trigger time
   (HTTP 400 naming the param and the JSON-schema rule): no DAG run, no SSH login on the node, no
   new folder under the node's runs root.
2. A ref that does not exist fails resolve_commit on its first try (no retry), the log names the
   ref, nothing is created or launched on the node.
3. The approval is restricted to the users in RL_VERIFY_APPROVERS: another user gets HTTP 403.
4. No private key, password, secret or token of the deployment appears in any log of these runs.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

from harness.airflow_stack import StackError
from harness.rig import DAG_ID
from rl_verify.core.names import run_key
from simulator import node as sim


ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.e2e
APPROVER = "alice"  # not the demo user the client logs in as
NODE_CONN = "rl_gpu_node"


@pytest.fixture(scope="module")
def rig(start_rig):
    with start_rig("e2e-security", step_seconds=0.1, database="postgres",
                   extra_env={"RL_VERIFY_APPROVERS": APPROVER}) as rig:
        yield rig


# ------------------------------------------------------------------------------ observations

def _dag_runs(rig) -> set[str]:
    return {r["dag_run_id"] for r in rig.client.dag_runs(DAG_ID, limit=100)}


def _runs_root(rig) -> Path:
    return Path(rig.node["root"]) / "runs"


def _run_folders(rig) -> set[str]:
    root = _runs_root(rig)
    return {p.name for p in root.iterdir()} if root.exists() else set()


def _ssh_logins(rig) -> int:
    log = rig.state_dir / "node" / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey") if log.exists() else 0


def _assert_node_clean(rig) -> None:
    state = rig.state_dir / "node"
    assert sim.node_processes(state) == []
    assert not sim.ray_running(state)


# ------------------------------------------------------------------------------ 1. trigger time

# label -> (conf change, param named, words of the JSON-schema rule that must be in the message)
MATRIX = {
    "commit with ;": ({"commit": "main; rm -rf /"}, "commit", ("does not match",)),
    "commit with $()": ({"commit": "$(touch /tmp/pwned)"}, "commit", ("does not match",)),
    "commit with backticks": ({"commit": "`id`"}, "commit", ("does not match",)),
    "commit with a newline": ({"commit": "main\nid"}, "commit", ("does not match",)),
    "commit with a trailing newline": ({"commit": "main\n"}, "commit", ("does not match",)),
    "commit with a space": ({"commit": "main branch"}, "commit", ("does not match",)),
    "commit with a leading -": ({"commit": "--upload-pack=touch /tmp/pwned"}, "commit", ("does not match",)),
    "commit over 200 characters": ({"commit": "a" * 201}, "commit", ("too long",)),
    "empty commit": ({"commit": ""}, "commit", ("non-empty", "too short", "does not match")),
    "unknown suite": ({"suites": ["dapo"]}, "suites", ("is not one of",)),
    "baseline versions not suite=N": ({"baseline_versions": "opd=latest"}, "baseline_versions", ("does not match",)),
    "unknown suite among known": ({"suites": ["grpo", "nope"]}, "suites", ("is not one of",)),
    "empty suites": ({"suites": []}, "suites", ("non-empty", "too short")),
}


@pytest.mark.parametrize("label", list(MATRIX))
def test_bad_input_is_refused_at_trigger_time_before_anything_runs(rig, label):
    change, param, rule = MATRIX[label]
    conf = {"commit": "main", "suites": ["grpo", "opd"], "node": NODE_CONN, **change}
    runs, folders, logins = _dag_runs(rig), _run_folders(rig), _ssh_logins(rig)
    try:
        run_id = rig.client.trigger(DAG_ID, conf=conf)
    except StackError as err:
        refused = err
    else:
        # Accepted: let the run end so it does not hold the DAG (max_active_runs=1), then report
        # what happened to it.
        state = rig.client.wait_for_run(DAG_ID, run_id, timeout=300)
        tasks = rig.client.task_states(DAG_ID, run_id)
        log = rig.client.task_log(DAG_ID, run_id, "resolve_commit")
        reasons = sorted(set(re.findall(r"param '[a-z]+'[^\"\n]{0,200}", log)))
        pytest.fail(f"{label}: {conf[param]!r} was ACCEPTED at trigger time (HTTP 200, run {run_id}); "
                    f"the run ended {state}, resolve_commit {tasks.get('resolve_commit')}, "
                    f"SSH logins during the run: {_ssh_logins(rig) - logins}, new run folders: "
                    f"{sorted(_run_folders(rig) - folders)}; resolve_commit said: {reasons}")
    assert refused.status == 400, refused
    detail = json.loads(refused.body).get("detail")
    assert isinstance(detail, str) and f"param {param}" in detail, detail
    assert any(word in detail for word in rule), detail
    time.sleep(2)  # anything started by the request would show by now
    assert _dag_runs(rig) == runs
    assert _ssh_logins(rig) == logins, "the node was contacted"
    assert _run_folders(rig) == folders


# ------------------------------------------------------------------------------ 2. ref missing on the node

def test_nonexistent_ref_fails_resolve_commit_once_naming_it_and_launches_nothing(rig):
    ref = f"no-such-ref-{uuid.uuid4().hex[:8]}"
    out = rig.run({"commit": ref, "suites": ["grpo", "opd"], "node": NODE_CONN}, decision=None, timeout=300)
    assert out.state == "failed", out.tasks
    assert out.tasks["resolve_commit"] == "failed"
    ti = rig.client.task_instance(DAG_ID, out.run_id, "resolve_commit")
    assert ti["try_number"] == 1, "a missing ref was retried"
    log = rig.client.task_log(DAG_ID, out.run_id, "resolve_commit")
    assert f"'{ref}' does not exist" in log, log[-3000:]
    for task in ("check_prerequisites", "experiment_card", "approve", "run_grpo", "run_opd"):
        assert out.tasks[task] == "upstream_failed", out.tasks
    assert not (_runs_root(rig) / run_key(out.run_id)).exists(), "a run folder was made for a missing ref"
    assert not list(_runs_root(rig).glob("*/jobs/*/pid")) if _runs_root(rig).exists() else True
    assert out.summary and out.summary["verdict"] == "FAIL"
    _assert_node_clean(rig)


def test_a_pinned_baseline_version_that_does_not_exist_fails_before_any_ssh_naming_it(rig):
    logins = _ssh_logins(rig)
    out = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": NODE_CONN, "baseline_versions": "opd=9"},
                  decision=None, timeout=300)
    assert out.state == "failed" and out.tasks["resolve_commit"] == "failed", out.tasks
    assert rig.client.task_instance(DAG_ID, out.run_id, "resolve_commit")["try_number"] == 1
    log = rig.client.task_log(DAG_ID, out.run_id, "resolve_commit")
    assert "baseline opd v9 does not exist (versions: v1)" in log, log[-3000:]
    assert "Fix: fix the param 'baseline_versions'" in log
    assert _ssh_logins(rig) == logins, "the node was contacted for a run whose baseline does not exist"
    assert not (_runs_root(rig) / run_key(out.run_id)).exists()
    _assert_node_clean(rig)


# ------------------------------------------------------------------------------ 3. approvers

def test_approval_is_restricted_to_the_named_approvers(rig):
    run_id = rig.client.trigger(DAG_ID, conf={"commit": "main", "suites": ["grpo"], "node": NODE_CONN})
    try:
        detail = rig.client.wait_for_hitl(DAG_ID, run_id, task_id="approve", timeout=300)
        assert [u["id"] for u in detail["assigned_users"]] == [APPROVER]
        try:
            answer = rig.client.respond_hitl(DAG_ID, run_id, "approve", ["Approve"])
        except StackError as err:
            assert err.status == 403, err
            assert "not a respondent" in err.body, err
        else:
            pytest.fail(f"user {rig.client.username!r} (not an approver) could approve: {answer}")
        assert rig.client.task_instance(DAG_ID, run_id, "run_grpo")["state"] in (None, "scheduled", "none")
    finally:
        # End the run: the approval is failed by an operator action; cleanup then runs.
        if rig.client.dag_run(DAG_ID, run_id)["state"] not in ("success", "failed"):
            rig.client.mark_task_failed(DAG_ID, run_id, "approve")
        state = rig.client.wait_for_run(DAG_ID, run_id, timeout=300)
    tasks = rig.client.task_states(DAG_ID, run_id)
    assert state == "failed" and tasks["run_grpo"] == "upstream_failed", tasks
    assert not list((_runs_root(rig) / run_key(run_id)).glob("jobs/*/pid")), "a training was launched"
    _assert_node_clean(rig)


# ------------------------------------------------------------------------------ 4. secrets in logs

_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")


def _private_key_lines(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    body = [line for line in lines if line and not line.startswith("-----")]
    return [line for line in body if len(line) >= 20]


def _secrets(rig) -> dict[str, str]:
    stack_state = rig.state_dir / "airflow"
    found = {"demo password": rig.stack.password}
    for name, value in json.loads((stack_state / "secrets.json").read_text()).items():
        found[f"secrets.json {name}"] = str(value)
    keys = {"client key": Path(rig.node["client_key"]),
            "node host key": rig.state_dir / "node" / "keys" / "ssh_host_ed25519_key"}
    for what, path in keys.items():
        lines = _private_key_lines(path)
        assert lines, f"cannot read {what} {path}"
        found[f"{what} (whole body)"] = "".join(lines)
        for i, line in enumerate(lines):
            found[f"{what} line {i + 1}"] = line
    return found


def _scan(files: list[Path], secrets: dict[str, str]) -> list[str]:
    leaks = []
    for path in files:
        text = path.read_text(errors="replace")
        leaks += [f"{what} in {path}" for what, value in secrets.items() if value and value in text]
        leaks += [f"a JWT ({m.group(0)[:16]}...) in {path}" for m in _JWT.finditer(text)]
    return leaks


def test_no_key_password_or_token_in_any_task_log(rig):
    logs_dir = rig.stack.home / "logs"
    files = [p for p in logs_dir.rglob("*") if p.is_file()]
    task_logs = [p for p in files if f"dag_id={DAG_ID}" in str(p)]
    assert len(task_logs) >= 5, f"too few task logs to scan under {logs_dir}: {task_logs}"
    assert any("task_id=resolve_commit" in str(p) for p in task_logs)
    leaks = _scan(files, _secrets(rig))
    assert not leaks, "\n".join(leaks)


def test_no_key_password_or_token_in_the_airflow_component_logs(rig):
    files = [p for p in (rig.state_dir / "airflow" / "logs").glob("*.log") if p.is_file()]
    assert files
    leaks = _scan(files, _secrets(rig))
    assert not leaks, "\n".join(leaks)
