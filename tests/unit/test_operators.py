"""The training trigger keeps its kill hook and its job marker across serialisation."""

from __future__ import annotations

from rl_verify.operators import RLJobTrigger, SuiteTrainingOperator


def _trigger() -> RLJobTrigger:
    return RLJobTrigger(ssh_conn_id="rl_gpu_node", remote_host=None, job_id="grpo", job_dir="/r/k/jobs/grpo",
                        log_file="/r/k/jobs/grpo/stdout.log", exit_code_file="/r/k/jobs/grpo/exit_code",
                        remote_os="posix", poll_interval=1, log_chunk_size=1024, log_offset=7,
                        command_timeout=30.0, max_reconnect_attempts=12, job_marker="k/grpo")


def test_trigger_serialises_to_its_own_class_with_the_job_marker():
    path, kwargs = _trigger().serialize()
    assert path == "rl_verify.operators.RLJobTrigger"
    assert kwargs["job_marker"] == "k/grpo" and kwargs["log_offset"] == 7
    assert RLJobTrigger(**kwargs).serialize() == (path, kwargs)


def test_training_operator_timeout_comes_from_the_suite_budget():
    op = SuiteTrainingOperator(task_id="run_grpo", suite="grpo")
    assert op.timeout == int(2400 * 1.5)
    assert op.max_reconnect_attempts >= 12 and op.ssh_conn_id == "{{ params.node }}"


import json  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
from airflow.providers.standard.operators.hitl import ApprovalOperator  # noqa: E402

from rl_verify import settings  # noqa: E402
from rl_verify.operators import CardApprovalOperator  # noqa: E402


class FakeTI:
    def __init__(self, card):
        self.card, self.pushed = card, {}

    def xcom_pull(self, task_ids=None, key="return_value"):
        return self.card if task_ids == "experiment_card" else None

    def xcom_push(self, key, value):
        self.pushed[key] = value


@pytest.fixture()
def variables(monkeypatch):
    store: dict[str, str] = {}
    from airflow.sdk import Variable

    monkeypatch.setattr(Variable, "get", staticmethod(lambda key, default=None: store.get(key, default)))
    monkeypatch.setattr(Variable, "set", staticmethod(lambda key, value, **kw: store.__setitem__(key, value)))
    return store


@pytest.fixture()
def waited(monkeypatch):
    calls = []
    monkeypatch.setattr(ApprovalOperator, "execute", lambda self, context: calls.append("waited") or "WAIT")
    return calls


def _context(run_type, fingerprint="fp1"):
    return {"ti": FakeTI({"fingerprint": fingerprint, "markdown": "card"}), "dag_run": SimpleNamespace(run_type=run_type),
            "run_id": "scheduled__x"}


def _grant(variables, fingerprint="fp1"):
    variables[settings.STANDING_APPROVAL_VARIABLE] = json.dumps(
        {"fingerprint": fingerprint, "granted_by": "alice", "granted_at": "2026-11-28T02:05:00Z"})


def test_scheduled_run_with_the_same_card_proceeds_on_the_standing_approval(variables, waited):
    _grant(variables)
    ctx = _context("scheduled")
    result = CardApprovalOperator(task_id="approve").execute(ctx)
    assert waited == [] and result["chosen_options"] == ["Approve"]
    assert ctx["ti"].pushed["decision"] == {"chosen_options": ["Approve"], "by": "alice",
                                            "at": "2026-11-28T02:05:00Z", "standing": True}


def test_a_changed_card_waits_for_a_human_again(variables, waited):
    _grant(variables, fingerprint="old-card")
    assert CardApprovalOperator(task_id="approve").execute(_context("scheduled")) == "WAIT"
    assert waited == ["waited"]


def test_manual_runs_always_wait_for_a_human(variables, waited):
    _grant(variables)
    assert CardApprovalOperator(task_id="approve").execute(_context("manual")) == "WAIT"


def test_approving_with_standing_approval_records_who_and_which_card(variables, monkeypatch):
    monkeypatch.setattr(ApprovalOperator, "execute_complete", lambda self, context, event: event)
    ctx = _context("manual", fingerprint="fp9")
    event = {"chosen_options": ["Approve"], "params_input": {"standing_approval": True},
             "responded_by_user": {"id": "bob", "name": "bob"}, "responded_at": "2026-11-29T10:00:00Z"}
    CardApprovalOperator(task_id="approve").execute_complete(ctx, event)
    stored = json.loads(variables[settings.STANDING_APPROVAL_VARIABLE])
    assert stored["fingerprint"] == "fp9" and stored["granted_by"] == "bob"
    assert ctx["ti"].pushed["decision"]["by"] == "bob"


def test_a_reject_is_recorded_before_downstream_is_skipped(variables, monkeypatch):
    def skip(self, context, event):
        raise RuntimeError("downstream skipped")  # the parent raises to skip on Reject

    monkeypatch.setattr(ApprovalOperator, "execute_complete", skip)
    ctx = _context("manual")
    event = {"chosen_options": ["Reject"], "params_input": {}, "responded_by_user": {"id": "carol", "name": "carol"},
             "responded_at": "t"}
    with pytest.raises(RuntimeError):
        CardApprovalOperator(task_id="approve").execute_complete(ctx, event)
    assert ctx["ti"].pushed["decision"]["chosen_options"] == ["Reject"]
    assert settings.STANDING_APPROVAL_VARIABLE not in variables


def test_approvers_restrict_who_may_answer(monkeypatch):
    monkeypatch.setenv("RL_VERIFY_APPROVERS", "alice, bob")
    op = CardApprovalOperator(task_id="approve")
    assert op.assigned_users == [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]


def test_reconnect_backoff_is_capped_so_the_monitor_returns_soon_after_an_outage():
    trigger = _trigger()
    delays = [trigger._reconnect_delay(n) for n in range(1, 13)]
    assert delays[0] < 2 and max(delays) <= 11
    assert 60 < sum(delays) < 140  # 12 attempts ride out a 60 s outage
