"""The training operator and its trigger (serialisation, poll parsing, backoff); the card approval."""

from __future__ import annotations

from rl_verify.orchestration.operators import SuiteTrainingOperator
from rl_verify.node.poll import parse_poll
from rl_verify.orchestration.triggers import RLJobTrigger, reconnect_delay


def _trigger() -> RLJobTrigger:
    return RLJobTrigger(ssh_conn_id="rl_gpu_node", job_dir="/r/k/jobs/grpo", job_marker="k/grpo", poll_interval=1,
                        log_chunk_size=1024, log_offset=7, command_timeout=30.0, max_reconnect_attempts=12)


def test_trigger_serialises_to_its_own_class_with_the_job_marker():
    path, kwargs = _trigger().serialize()
    assert path == "rl_verify.orchestration.triggers.RLJobTrigger"
    assert kwargs["job_marker"] == "k/grpo" and kwargs["log_offset"] == 7
    assert RLJobTrigger(**kwargs).serialize() == (path, kwargs)


def test_training_operator_timeout_comes_from_the_suite_budget():
    op = SuiteTrainingOperator(task_id="run_grpo", suite="grpo", resolved={})
    assert op.job_timeout_s == int(2400 * 1.5)
    assert op.max_reconnect_attempts >= 12


def test_a_running_jobs_poll_takes_whole_lines_only():
    exit_code, start, size, text, offset = parse_poll(b"- 10 40\nstep 1 done\nstep 2 do")
    assert (exit_code, start, size, text, offset) == (None, 10, 40, "step 1 done\n", 10 + 12)


def test_a_finished_jobs_last_poll_takes_the_partial_last_line():
    assert parse_poll(b"3 0 14\nhi b c\npartial") == (3, 0, 14, "hi b c\npartial", 14)


def test_a_finished_job_with_more_log_than_one_chunk_is_read_to_its_end_in_whole_lines():
    exit_code, _, size, text, offset = parse_poll(b"0 0 100\nline\npart")
    assert exit_code == 0 and text == "line\n" and offset == 5 < size


def test_a_utf8_character_cut_by_the_chunk_limit_waits_for_the_next_poll():
    chunk = "ok\nstep é".encode()[:-1]  # the chunk limit cut the two-byte character
    assert parse_poll(b"- 0 99\n" + chunk)[3] == "ok\n"


def test_a_line_longer_than_a_chunk_is_passed_on_in_pieces_without_cutting_a_character():
    chunk = ("x" * 5 + "é").encode()[:-1]  # 7-byte chunk limit, no newline in it, more log to come
    assert parse_poll(b"- 0 99\n" + chunk)[3:] == ("xxxxx", 5)


def test_unexpected_poll_output_is_an_error_naming_it():
    import pytest

    with pytest.raises(ValueError, match="unexpected job poll output"):
        parse_poll(b"bash: stat: not found\n")


def test_reconnect_backoff_is_capped_so_the_monitor_returns_soon_after_an_outage():
    delays = [reconnect_delay(n) for n in range(1, 13)]
    assert delays[0] < 2 and max(delays) <= 11
    assert 60 < sum(delays) < 140  # 12 attempts ride out a 60 s outage


from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
from airflow.providers.standard.operators.hitl import ApprovalOperator  # noqa: E402

from rl_verify import settings  # noqa: E402
from rl_verify.orchestration.approval import CardApprovalOperator  # noqa: E402


def _op(ctx):
    """The approval operator of the run ``ctx``, given that run's card as the DAG passes it."""
    return CardApprovalOperator(task_id="approve", card=ctx["ti"].card)


class FakeTI:
    map_index = -1

    def __init__(self, card, resolved=None):
        self.card, self.pushed, self.resolved = card, {}, resolved

    def xcom_push(self, key, value):
        self.pushed[key] = value

    def xcom_pull(self, task_ids=None, key=None):
        return self.resolved if task_ids == "resolve_commit" else None


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


GRANTED_AT = "2026-11-28T02:05:00+00:00"


def _context(run_type, fingerprint="fp1", run_id="scheduled__x"):
    return {"ti": FakeTI({"fingerprint": fingerprint, "markdown": "card"}),
            "dag_run": SimpleNamespace(run_type=run_type, dag_id="rl_accuracy_verification"), "run_id": run_id}


def _execute(ctx):
    return _op(ctx).execute(ctx)


def _grant(variables, fingerprint="fp1", by="alice"):
    from rl_verify.orchestration.standing import Grant

    variables[settings.STANDING_APPROVAL_VARIABLE] = Grant(
        fingerprint=fingerprint, dag_id="rl_accuracy_verification", dag_run_id="scheduled__granting",
        task_id="approve", granted_by=by, granted_at=GRANTED_AT).to_json()


@pytest.fixture()
def airflow_record(monkeypatch):
    """Airflow's record of the granting response, as the REST API would return it."""
    from datetime import datetime

    from rl_verify.orchestration import airflow_api
    from rl_verify.orchestration.standing import ApprovalRecord

    record = {"value": ApprovalRecord(
        run_type="scheduled", responded_by="alice", responded_at=datetime.fromisoformat(GRANTED_AT),
        chosen_options=["Approve"], params_input={"standing_approval": True},
        body="card ... Experiment fingerprint: `%s` (suites...)" % ("f" * 16))}
    monkeypatch.setattr(airflow_api, "approval_record", lambda conn, dag, run, task: record["value"])
    monkeypatch.setattr("rl_verify.orchestration.approval._now",
                        lambda: datetime.fromisoformat("2026-11-30T02:00:00+00:00"))
    return record


def test_scheduled_run_proceeds_on_a_standing_approval_verified_against_the_record(variables, waited,
                                                                                   airflow_record):
    _grant(variables, fingerprint="f" * 16)
    ctx = _context("scheduled", fingerprint="f" * 16)
    result = _op(ctx).execute(ctx)
    assert waited == [] and result["chosen_options"] == ["Approve"]
    assert ctx["ti"].pushed["decision"] == {"chosen_options": ["Approve"], "by": "alice", "at": GRANTED_AT,
                                            "standing": True, "granted_in": "scheduled__granting",
                                            "bisection": None}


def test_a_forged_grant_naming_another_user_waits_for_a_person(variables, waited, airflow_record):
    _grant(variables, fingerprint="f" * 16, by="mallory")
    assert _execute(_context("scheduled", fingerprint="f" * 16)) == "WAIT"


def test_a_changed_card_waits_for_a_human_again(variables, waited, airflow_record):
    _grant(variables, fingerprint="0" * 16)
    assert _execute(_context("scheduled", fingerprint="f" * 16)) == "WAIT"
    assert waited == ["waited"]


def test_a_grant_that_cannot_be_verified_waits(variables, waited, monkeypatch):
    _grant(variables, fingerprint="f" * 16)
    monkeypatch.delenv("AIRFLOW_CONN_RL_VERIFY_AIRFLOW_API", raising=False)
    assert _execute(_context("scheduled", fingerprint="f" * 16)) == "WAIT"


def test_manual_runs_always_wait_for_a_human(variables, waited, airflow_record):
    _grant(variables, fingerprint="f" * 16)
    assert _execute(_context("manual", fingerprint="f" * 16)) == "WAIT"


def test_the_wait_is_bounded_by_the_configured_timeout(variables, waited, monkeypatch):
    monkeypatch.setenv("RL_VERIFY_APPROVAL_TIMEOUT_S", "90")
    ctx = _context("manual")
    op = _op(ctx)
    op.execute(ctx)
    assert op.response_timeout.total_seconds() == 90 and op.defaults is None  # never approved by default


def _event(chosen, standing=False, who="bob"):
    return {"chosen_options": chosen, "params_input": {"standing_approval": standing},
            "responded_by_user": {"id": who, "name": who}, "responded_at": "2026-11-29T10:00:00+00:00"}


def test_approving_a_scheduled_card_with_standing_approval_records_the_grant(variables, monkeypatch):
    from rl_verify.orchestration.standing import parse_grant

    monkeypatch.setattr(ApprovalOperator, "execute_complete", lambda self, context, event: event)
    ctx = _context("scheduled", fingerprint="fp9", run_id="scheduled__9")
    _op(ctx).execute_complete(ctx, _event(["Approve"], standing=True))
    grant = parse_grant(variables[settings.STANDING_APPROVAL_VARIABLE])
    assert (grant.fingerprint, grant.granted_by, grant.dag_run_id, grant.task_id) == ("fp9", "bob", "scheduled__9",
                                                                                     "approve")
    assert ctx["ti"].pushed["decision"]["by"] == "bob"


def test_a_manual_runs_approval_never_grants_a_standing_approval(variables, monkeypatch):
    monkeypatch.setattr(ApprovalOperator, "execute_complete", lambda self, context, event: event)
    ctx = _context("manual")
    _op(ctx).execute_complete(ctx, _event(["Approve"], standing=True))
    assert settings.STANDING_APPROVAL_VARIABLE not in variables


def test_a_reject_is_recorded_before_downstream_is_skipped_and_revokes_the_grant(variables, monkeypatch):
    from rl_verify.orchestration.standing import parse_grant

    def skip(self, context, event):
        raise RuntimeError("downstream skipped")  # the parent raises to skip on Reject

    monkeypatch.setattr(ApprovalOperator, "execute_complete", skip)
    _grant(variables, fingerprint="fp1")
    ctx = _context("scheduled")
    with pytest.raises(RuntimeError):
        _op(ctx).execute_complete(ctx, _event(["Reject"], who="carol"))
    assert ctx["ti"].pushed["decision"]["chosen_options"] == ["Reject"]
    assert parse_grant(variables[settings.STANDING_APPROVAL_VARIABLE]).revoked_by == "carol"


def test_an_unanswered_card_times_out_as_not_approved_and_skips_downstream(variables, monkeypatch):
    skipped = []
    monkeypatch.setattr(CardApprovalOperator, "skip", lambda self, ti, tasks: skipped.extend(tasks))
    ctx = _context("scheduled")
    op = _op(ctx)
    ctx["task"] = SimpleNamespace(get_direct_relatives=lambda upstream: [SimpleNamespace(is_teardown=False)])
    result = op.execute_complete(ctx, {"error": "The Human-in-the-loop response timeout has passed without a "
                                                "response.", "error_type": "timeout"})
    assert result == {"chosen_options": [], "timed_out": True} and len(skipped) == 1
    decision = ctx["ti"].pushed["decision"]
    assert decision["timed_out"] is True and decision["chosen_options"] == [] and decision["by"] is None


def test_approvers_restrict_who_may_answer(monkeypatch):
    monkeypatch.setenv("RL_VERIFY_APPROVERS", "alice, bob")
    op = CardApprovalOperator(task_id="approve", card={"markdown": "card", "fingerprint": "f"})
    assert op.assigned_users == [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]


def test_a_manual_runs_card_does_not_offer_a_standing_approval_and_a_scheduled_one_does(variables, monkeypatch):
    offered = {}
    monkeypatch.setattr(ApprovalOperator, "execute", lambda self, context: offered.update(
        {context["dag_run"].run_type: sorted(self.params.keys())}))
    for run_type in ("manual", "scheduled"):
        ctx = _context(run_type)
        _op(ctx).execute(ctx)
    assert offered == {"manual": [], "scheduled": ["standing_approval"]}


def test_an_approved_card_skips_every_task_of_the_suites_the_run_does_not_test_at_once():
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    from rl_verify.orchestration import verification_dag

    with DAG("skip_probe", schedule=None, params=verification_dag.params()) as dag:
        verification_dag.build()
    approve = dag.get_task("approve")
    ti = FakeTI({"fingerprint": "fp", "markdown": "card"}, resolved={"suites": ["opd"]})
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        approve._skip_unselected_suites({"ti": ti, "task": approve})
    names = sorted(skipped.value.tasks)
    assert names == sorted(t for t in dag.task_ids if t.endswith(("_grpo",)) or "_grpo-r" in t), names
    assert "run_grpo" in names and "confirm_grpo" in names and "repeat_grpo-r3" in names
    assert not any("opd" in t for t in names)  # the suite under test keeps every task
    # Both suites tested: nothing skipped, the task ends normally.
    approve._skip_unselected_suites({"ti": FakeTI({}, resolved={"suites": ["grpo", "opd"]}), "task": approve})


def _built_approve():
    from airflow.sdk import DAG

    from rl_verify.orchestration import verification_dag

    with DAG("unchanged_probe", schedule=None, params=verification_dag.params()) as dag:
        verification_dag.build()
    return dag, dag.get_task("approve")


def test_when_every_suite_is_unchanged_nobody_is_asked_and_every_suite_task_is_skipped(waited):
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    dag, approve = _built_approve()
    entry = {"sha": "a" * 40, "run_id": "r", "report": "/r", "files": ["docs/a.md"], "why": "docs only"}
    ti = FakeTI({"fingerprint": "fp", "markdown": "card"},
                resolved={"suites": ["grpo", "opd"], "unchanged": {"grpo": entry, "opd": entry}})
    ctx = {"ti": ti, "task": approve, "run_id": "manual__x",
           "dag_run": SimpleNamespace(run_type="scheduled", dag_id="rl_accuracy_verification")}
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        approve.execute(ctx)
    assert waited == []  # no person asked, no standing approval looked up or spent
    assert ti.pushed["decision"]["not_needed"] is True and ti.pushed["decision"]["by"] is None
    names = set(skipped.value.tasks)
    assert {"run_grpo", "run_opd", "confirm_grpo", "confirm_opd", "repeat_opd-r1"} <= names
    assert not names & {"report", "cleanup", "verdict"}


def test_an_unchanged_suite_among_trained_ones_is_skipped_after_the_approval_and_the_others_train(waited):
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    dag, approve = _built_approve()
    entry = {"sha": "a" * 40, "run_id": "r", "report": "/r", "files": [], "why": "same commit"}
    ti = FakeTI({"fingerprint": "fp", "markdown": "card"},
                resolved={"suites": ["grpo", "opd"], "unchanged": {"opd": entry}})
    ctx = {"ti": ti, "task": approve, "run_id": "manual__x", "params": {"commit": "main", "suites": ["grpo", "opd"]},
           "dag_run": SimpleNamespace(run_type="manual", dag_id="rl_accuracy_verification")}
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        approve.execute(ctx)
    assert waited == ["waited"]  # grpo trains: a person approves its card
    names = set(skipped.value.tasks)
    assert "run_opd" in names and "confirm_opd" in names and not any("grpo" in t for t in names)


def test_a_repeat_gate_that_says_no_skips_that_repeat_and_every_later_one_of_its_suite_at_once(monkeypatch):
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    from rl_verify.orchestration import confirmation, verification_dag

    with DAG("gate_probe", schedule=None, params=verification_dag.params()) as dag:
        verification_dag.build()
    gate = dag.get_task("repeat_opd-r1")
    ti = FakeTI({})
    ti.task, ti.task_id = gate, gate.task_id
    monkeypatch.setattr(confirmation, "repeat_gate", lambda suite, attempt, run_id: False)
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        gate.python_callable("opd", 1, run_id="r", ti=ti)
    names = set(skipped.value.tasks)
    assert names == {f"{kind}_opd-r{k}" for kind in ("run", "fetch", "compare") for k in (1, 2, 3)} | {
        "repeat_opd-r2", "repeat_opd-r3"}, sorted(names)
    # A yes skips nothing: the repeat trains.
    monkeypatch.setattr(confirmation, "repeat_gate", lambda suite, attempt, run_id: True)
    assert gate.python_callable("opd", 1, run_id="r", ti=ti) is True


def test_a_poll_cut_by_sshd_going_down_is_a_lost_connection_the_monitor_reconnects_after():
    import asyncio
    from types import SimpleNamespace

    class CutSession:
        async def run(self, *args, **kwargs):  # what asyncssh returns when sshd dies mid-command
            return SimpleNamespace(stdout=b"", exit_status=None)

    with pytest.raises(ConnectionError, match="session ended before the command did"):
        asyncio.run(_trigger()._poll(CutSession()))


def test_a_training_the_live_check_stopped_on_purpose_succeeds_and_every_other_bad_end_fails():
    """Issue 35: an early abort is the live check doing its job (the FAIL is the comparison's red), not a crash."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from rl_verify.orchestration.training_job import training_failure as _training_failure

    assert _training_failure("opd", {"status": "aborted", "exit_code": None, "message": "aborted at step 5"}) is None
    assert _training_failure("opd", {"status": "success", "exit_code": 0}) is None
    rule = _training_failure("grpo", {"status": "log_rule", "exit_code": None, "message": "Ray never saw 8 GPUs"})
    assert isinstance(rule, AirflowFailException) and "Ray never saw 8 GPUs" in str(rule)
    crashed = _training_failure("grpo", {"status": "failed", "exit_code": 1})
    assert isinstance(crashed, AirflowFailException) and "exited 1" in str(crashed)
    stalled = _training_failure("grpo", {"status": "failed", "exit_code": 124,
                                         "log_chunk": "x\n[rl-verify] STALLED at step 7: no new step for 600 s\n"})
    assert str(stalled) == "STALLED at step 7: no new step for 600 s"
    lost = _training_failure("grpo", {"status": "error", "exit_code": None, "message": "node unreachable"})
    assert type(lost) is AirflowException and "node unreachable" in str(lost)  # retryable: a retry re-attaches


def test_the_task_log_says_slurm_ran_the_job_even_when_it_finished_before_the_first_look(capsys):
    seen_running, seen_finished = _trigger(), _trigger()
    seen_running._note_scheduler({"state": "running", "detail": ""})
    seen_running._note_scheduler({"state": "finished", "detail": ""})  # its end comes with the job's event
    seen_finished._note_scheduler({"state": "finished", "detail": ""})
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if "Slurm" in line]
    assert len(said) == 2, said
    assert "Slurm started the job" in said[0]
    assert "Slurm ran the job: its batch step had finished by the watch's first look" in said[1]
