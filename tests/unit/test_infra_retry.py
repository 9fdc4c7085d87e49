"""Issue 55: a training that failed as infrastructure is tried again by policy, never for bad input, a cancel
outside rl-verify or a node at fault, only once its processes are proven gone, and every attempt is kept."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from rl_verify import settings
from rl_verify.core import retry
from rl_verify.core.bisect_report import markdown as bisect_markdown
from rl_verify.core.report.words import attempt_lines
from rl_verify.engines import load_suite
from rl_verify.node import remote
from rl_verify.orchestration import operators, training_job
from rl_verify.orchestration.probes import infra_attempts
from rl_verify.suites import card

POLICY = training_job.retry_policy()


# --- the policy as data ----------------------------------------------------------------------------------

def test_the_shipped_policy_retries_once_and_names_its_source():
    data = json.loads(settings.INFRA_RETRY_FILE.read_text())
    assert data["source"] and POLICY.retries == 1 and POLICY.default == retry.TRANSIENT
    assert POLICY.scheduler_ends["preempted"] == retry.TRANSIENT
    assert POLICY.scheduler_ends["cancelled outside rl-verify"] == retry.NEVER


def test_a_malformed_policy_names_every_bad_field():
    with pytest.raises(ValueError) as err:
        retry.Policy.from_dict({"retries": -1, "patterns": [{"pattern": "(", "kind": "soon"}],
                                "scheduler_ends": {"preempted": "maybe"}})
    said = str(err.value)
    for part in ("retries -1", "patterns[0].pattern does not compile", "patterns[0].kind 'soon'",
                 "scheduler_ends['preempted'] 'maybe'"):
        assert part in said, said


def test_a_deployments_count_replaces_the_files():
    assert retry.Policy.from_dict({"retries": 1}, retries=0).retries == 0


# --- what kind of cause ----------------------------------------------------------------------------------

@pytest.mark.parametrize("why, tail, kind", [
    ("the grpo job exited 1", "RuntimeError: NCCL error: unhandled system error (simulated crash fault at launch)",
     retry.TRANSIENT),
    ("stalled at step 5", "", retry.TRANSIENT),
    ("teacher geo3k did not come up within 600 s", "", retry.TRANSIENT),
    ("the grpo job exited 1", "FileNotFoundError: /models/qwen3 does not look like a HF model", retry.INPUT),
    ("opd: XTUNER_OPD_TEACHER_ENDPOINTS_JSON is not set: rollout teachers are required", "", retry.INPUT),
    ("busy: job x of run y is training — not launching", "", retry.NODE),
    ("the grpo job exited 1", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
     retry.NODE),
    ("Slurm refused the grpo job: invalid partition", "", retry.INPUT),
    ("Slurm no longer knows job 12 (nor does its accounting)", "", retry.NEVER),
    ("pending in Slurm's queue for 21 s (limit 20 s)", "", retry.NEVER),
])
def test_a_cause_is_read_from_its_words(why, tail, kind):
    assert retry.classify(POLICY, why, tail).kind == kind


def test_a_log_rules_own_kind_and_slurms_end_come_before_the_words():
    assert retry.classify(POLICY, "No such file or directory", "", rule_kind=retry.NODE).kind == retry.NODE
    assert retry.classify(POLICY, "No such file or directory", "", scheduler_end="preempted").kind == retry.TRANSIENT
    assert retry.classify(POLICY, "x", "", scheduler_end="node failure").kind == retry.NODE
    assert retry.classify(POLICY, "x", "", scheduler_end="time limit").kind == retry.INPUT


def test_the_grpo_specs_node_rules_are_the_nodes_fault():
    rules = {r.pattern: r.retry for r in load_suite("grpo").log_rules}
    assert rules["[Aa]ddress already in use"] == retry.NODE
    assert rules["^Traceback \\(most recent call last\\):"] is None  # read from the exception's words


def test_cause_of_an_event_reads_its_log_rule_its_scheduler_end_and_its_last_line():
    spec = load_suite("grpo")
    hit = {"log_rule": {"pattern": "[Aa]ddress already in use", "line": "OSError: Address already in use"}}
    assert training_job.cause_of(spec, {"live": hit}, AirflowFailException("grpo ray start")).kind == retry.NODE
    ended = {"status": "scheduler", "scheduler": {"state": "ended", "detail": "PREEMPTED outside"}}
    assert training_job.cause_of(spec, ended, AirflowFailException("the grpo job: Slurm ended it")).kind == \
        retry.TRANSIENT
    crashed = {"exit_code": 1, "log_chunk": "[rl-verify] start\nRuntimeError: CUDA error (simulated)\n"}
    cause = training_job.cause_of(spec, crashed, AirflowFailException(
        "the grpo job exited 1 (see the [remote] lines below)"))
    assert cause.kind == retry.TRANSIENT and cause.why == "the grpo job exited 1 (its last line: RuntimeError: " \
                                                         "CUDA error (simulated))"


# --- whether it is tried again ---------------------------------------------------------------------------

def test_a_transient_failure_is_tried_again_until_the_retries_are_spent():
    cause = retry.Cause(retry.TRANSIENT, "crash")
    assert retry.decide(POLICY, [], cause, "node_a")[0] is True
    go, why = retry.decide(POLICY, [{"kind": retry.TRANSIENT, "node": "node_a"}], cause, "node_a")
    assert go is False and "spent" in why
    assert retry.decide(retry.Policy(retries=0), [], cause, "node_a")[0] is False


@pytest.mark.parametrize("kind", [retry.INPUT, retry.NEVER])
def test_bad_input_and_a_cancel_outside_are_never_tried_again(kind):
    assert retry.decide(POLICY, [], retry.Cause(kind, "x"), "node_a")[0] is False


def test_a_nodes_own_fault_goes_to_another_node_never_to_the_same_one_twice():
    cause = retry.Cause(retry.NODE, "GPUs held")
    go, why = retry.decide(POLICY, [], cause, "node_a")
    assert go is False and "no other eligible node" in why
    go, why = retry.decide(retry.Policy(retries=2), [], cause, "node_a", other_nodes=["node_a", "node_b"])
    assert go is True and why.endswith("tried again on node_b")
    tried = [{"kind": retry.NODE, "node": "node_b"}]
    assert retry.decide(retry.Policy(retries=2), tried, cause, "node_a", other_nodes=["node_b"])[0] is False


def test_every_attempt_is_one_line_naming_its_node_job_kind_and_why():
    lines = retry.describe([
        {"attempt": 1, "job": "grpo", "node": "rl_gpu_node", "kind": "transient", "why": "crash at launch",
         "decision": "a transient infrastructure failure (attempt 2 of 2 follows)", "retried": True},
        {"attempt": 2, "job": "grpo-t2", "node": "rl_gpu_node", "kind": None, "decided": True}])
    assert lines == [
        "attempt 1 on rl_gpu_node (job grpo): infrastructure (transient): crash at launch; tried again: a transient "
        "infrastructure failure (attempt 2 of 2 follows)",
        "attempt 2 on rl_gpu_node (job grpo-t2): ran; its training decides the suite"]
    assert attempt_lines([{"attempt": 1, "attempts": [{"attempt": 1, "job": "grpo-r1", "node": "n", "kind": None}]},
                          {"attempt": 0}]) == ["Run 2, attempt 1 on n (job grpo-r1): ran; its training decides the "
                                               "suite"]


# --- job names ---------------------------------------------------------------------------------------------

def test_each_attempt_has_a_job_folder_and_marker_of_its_own():
    assert settings.retry_job("grpo", 1) == "grpo" and settings.retry_job("grpo-r1", 2) == "grpo-r1-t2"
    assert settings.attempt_jobs("opd") == ["opd", "opd-t2", "opd-t3", "opd-t4"]
    for name in ("grpo-t2", "grpo-r1-t2", "grpo-lane"):
        assert remote.validate_suite_name(name) == name
        assert re.fullmatch(remote._MARKER_ERE.replace("(", "(?:"), f"key/{name}")
    for bad in ("grpo-t", "grpo-t2-r1", "grpo-lane-t2"):
        with pytest.raises(remote.BadInput):
            remote.validate_suite_name(bad)


def test_the_card_states_the_retry_policy():
    spec = load_suite("grpo")
    sections = card.card_sections([spec], [], "rl_gpu_node", {"grpo": []}, infra_retries=1)
    scale = "\n".join(sections["最小规模 minimum scale"])
    assert "trained again, up to 1 more time(s)" in scale and "Never for an accuracy FAIL, bad input" in scale
    off = "\n".join(card.card_sections([spec], [], "rl_gpu_node", {"grpo": []}, infra_retries=0)
                    ["最小规模 minimum scale"])
    assert "Infrastructure retries off" in off


# --- the training task's decision over the record ------------------------------------------------------------

class _Deferred(Exception):
    pass


@pytest.fixture()
def task(tmp_path, monkeypatch):
    """A GRPO training task of run ``r1`` whose record is a local folder; its stop and its deferral recorded."""
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path / "records"))
    op = operators.SuiteTrainingOperator(task_id="run_grpo", suite="grpo", resolved={"run_key": "k1",
                                                                                     "suites": ["grpo"]})
    seen: dict = {"stops": [], "notes": []}
    left: list[str] = []
    monkeypatch.setattr(operators, "suite_node", lambda resolved, suite: ("rl_gpu_node", {"run_dir": "/r/k1"}))

    def stop(conn, run_dir, job):
        seen["stops"].append(job)
        return (not left), [*left, "ray stopped"]

    def defer(context):
        seen["deferred"] = training_job.current_job(op.job_name, op._attempts(context))
        raise _Deferred

    monkeypatch.setattr(op, "_stop_attempt", stop)
    monkeypatch.setattr(op, "_defer_full", defer)
    monkeypatch.setattr(operators.airflow_api, "set_task_note", lambda *a: seen["notes"].append(a[-1]))
    monkeypatch.setattr(operators.time, "sleep", lambda s: None)
    context = {"run_id": "r1", "dag_run": SimpleNamespace(dag_id=settings.DAG_ID)}
    return SimpleNamespace(op=op, context=context, seen=seen, left=left)


def _crash(at: str = "launch") -> tuple[dict, AirflowFailException]:
    event = {"exit_code": 1, "log_chunk": f"RuntimeError: NCCL error (simulated crash fault at {at})\n"}
    return event, AirflowFailException("the grpo job exited 1 (see the [remote] lines below)")


def test_a_crash_trains_again_in_a_new_job_after_the_failed_one_is_proven_gone(task):
    training_job.record.put_json("r1", "grpo/abort.json", {"applied": True, "log_rule": {}},
                                 dag_id=settings.DAG_ID)
    with pytest.raises(_Deferred):
        task.op._failed_attempt(task.context, *_crash())
    assert task.seen["stops"] == ["grpo"] and task.seen["deferred"] == "grpo-t2"
    [entry] = training_job.attempts("r1", "grpo", settings.DAG_ID)
    assert entry["retried"] and entry["kind"] == retry.TRANSIENT and entry["node"] == "rl_gpu_node"
    assert entry["abort"]["applied"] and not training_job.record.get_json("r1", "grpo/abort.json",
                                                                          dag_id=settings.DAG_ID)
    assert "attempt 1 on rl_gpu_node (job grpo)" in task.seen["notes"][-1]


def test_the_same_crash_on_the_retry_ends_the_suite_naming_both_attempts(task):
    with pytest.raises(_Deferred):
        task.op._failed_attempt(task.context, *_crash())
    with pytest.raises(AirflowFailException) as err:
        task.op._failed_attempt(task.context, *_crash("step 3"))
    said = str(err.value)
    assert "attempt 1 on rl_gpu_node (job grpo)" in said and "attempt 2 on rl_gpu_node (job grpo-t2)" in said
    assert "spent" in said and task.seen["stops"] == ["grpo"]
    assert [a["job"] for a in training_job.attempts("r1", "grpo", settings.DAG_ID)] == ["grpo", "grpo-t2"]


def test_bad_input_is_never_tried_again_and_nothing_is_stopped_for_it(task):
    event = {"exit_code": 1, "log_chunk": "FileNotFoundError: /share/models/qwen3/config.json\n"}
    with pytest.raises(AirflowFailException) as err:
        task.op._failed_attempt(task.context, event, AirflowFailException("the grpo job exited 1"))
    assert "infrastructure (input)" in str(err.value) and task.seen["stops"] == []
    assert "deferred" not in task.seen


def test_a_failed_attempt_whose_processes_outlive_the_stop_is_not_tried_again(task):
    task.left.append("LEFT 4242")
    with pytest.raises(AirflowFailException) as err:
        task.op._failed_attempt(task.context, *_crash())
    assert "could not be proven gone (LEFT 4242" in str(err.value) and "deferred" not in task.seen


def test_a_lost_watch_is_an_attempt_too_and_a_cleared_final_attempt_is_kept_once(task):
    lost = AirflowException("the grpo job could not be watched to its end: ssh down")
    task.left.append("LEFT 1")  # the node cannot be reached: no proof
    for _ in range(2):  # a cleared task that ends the same attempt again
        with pytest.raises(AirflowFailException):
            task.op._failed_attempt(task.context, {}, lost)
    assert len(training_job.attempts("r1", "grpo", settings.DAG_ID)) == 1


def test_a_probe_row_and_the_bisection_table_show_its_attempts():
    runs = [{"attempt": 0, "attempts": [
        {"attempt": 1, "job": "grpo", "node": "n1", "kind": "transient", "why": "crash at launch", "retried": True,
         "decision": "tried again"},
        {"attempt": 2, "job": "grpo-t2", "node": "n1", "kind": None}]}]
    rows = infra_attempts([{"suite": "grpo", "outcome": {"runs": runs}}])
    assert rows[0].startswith("grpo: Run 1, attempt 1 on n1 (job grpo): infrastructure (transient): crash at launch")
    result = {"good": "a", "bad": "b", "suites": ["grpo"], "commits": [{"sha": "c" * 40, "subject": "s"}],
              "answer": {"kind": "culprit", "reason": "r", "culprit": None}, "runs": 2, "wall_s": 60,
              "nodes": ["n1"], "probes": [{"sha": "c" * 40, "outcome": "grpo FAIL", "runs": 1, "attempts": rows}]}
    table = bisect_markdown(result)
    assert "| infrastructure attempts |" in table and "attempt 2 on n1 (job grpo-t2)" in table


def test_a_log_rules_retry_kind_leaves_the_experiment_fingerprint_as_it_was():
    """Standing approvals and verified PASSes bound to the experiment survive the retry kinds (they change no
    number); any other edit of a log rule still changes it."""
    spec = load_suite("grpo")
    without = spec.model_copy(update={"raw": {**spec.raw, "log_rules": [
        {k: v for k, v in r.items() if k != "retry"} for r in spec.raw["log_rules"]]}})
    assert any("retry" in r for r in spec.raw["log_rules"])
    assert card.experiment_fingerprint([spec]) == card.experiment_fingerprint([without])
    edited = spec.model_copy(update={"raw": {**spec.raw, "log_rules": [
        {**r, "means": r["means"] + "!"} for r in spec.raw["log_rules"]]}})
    assert card.experiment_fingerprint([spec]) != card.experiment_fingerprint([edited])


def test_every_scheduler_end_the_policy_names_is_one_slurm_states_gives():
    """The policy's keys are Slurm's end words as ``node.slurm_states`` names them: a renamed end fails here, never
    silently falls through to the words."""
    from rl_verify.node import slurm_states

    words = {w for _, w in slurm_states.STATES.values() if w} | set(slurm_states.RECORDED_ENDS.values())
    assert set(POLICY.scheduler_ends) <= words, set(POLICY.scheduler_ends) - words
