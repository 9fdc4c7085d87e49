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
