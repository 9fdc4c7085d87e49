"""Contract with the SSH provider (apache-airflow-providers-ssh, pinned in requirements.txt).

``SuiteTrainingOperator`` and ``RLJobTrigger`` extend the provider's ``SSHRemoteJobOperator`` and
``SSHRemoteJobTrigger``. Where they lean on members the provider does not document, this test pins
exactly those members (names, signatures, and the state the operator's ``execute_complete`` and
``on_kill`` read), so a provider upgrade that changes them fails here, not in a night's run.
"""

from __future__ import annotations

import inspect

from airflow.providers.ssh.operators.ssh_remote_job import SSHRemoteJobOperator
from airflow.providers.ssh.triggers.ssh_remote_job import SSHRemoteJobTrigger
from airflow.providers.ssh.utils import remote_job

from rl_verify.operators import RLJobTrigger


def params(func) -> list[str]:
    return list(inspect.signature(func).parameters)


def test_operator_reads_the_job_state_the_package_sets_before_deferring():
    # _launch_or_attach sets these three instead of the parent's execute(): the parent's
    # execute_complete/on_kill must still read them under these names.
    source = inspect.getsource(SSHRemoteJobOperator)
    for name in ("self._paths", "self._detected_os", "self._job_id"):
        assert name in source, name
    assert params(SSHRemoteJobOperator.execute_complete) == ["self", "context", "event"]
    assert {"trigger", "method_name", "kwargs", "timeout"} <= set(params(SSHRemoteJobOperator.defer))


def test_trigger_members_the_package_overrides_or_calls():
    assert params(SSHRemoteJobTrigger._reconnect_delay) == ["self", "attempt"]
    assert params(SSHRemoteJobTrigger._read_log_chunk) == ["self", "conn"]
    assert params(SSHRemoteJobTrigger._run_command) == ["self", "conn", "command"]
    assert params(SSHRemoteJobTrigger._connect) == ["self"]
    assert params(SSHRemoteJobTrigger._close) == ["conn"]
    for coroutine in ("_read_log_chunk", "_run_command", "_connect", "_close"):
        assert inspect.iscoroutinefunction(getattr(SSHRemoteJobTrigger, coroutine)), coroutine


def test_trigger_serialisation_keys_the_package_extends():
    trigger = RLJobTrigger(ssh_conn_id="c", remote_host=None, job_id="grpo", job_dir="/j", log_file="/j/stdout.log",
                           exit_code_file="/j/exit_code", remote_os="posix", poll_interval=1, log_chunk_size=1024,
                           log_offset=3, command_timeout=30.0, max_reconnect_attempts=2, job_marker="k/grpo")
    _, parent = SSHRemoteJobTrigger.serialize(trigger)
    assert {"job_dir", "log_offset", "log_file", "exit_code_file", "job_id"} <= set(parent)


def test_remote_job_helpers_the_package_builds_its_job_with():
    paths = remote_job.RemoteJobPaths(job_id="grpo", remote_os="posix", base_dir="/runs/k/jobs")
    assert paths.job_dir == "/runs/k/jobs/grpo"
    assert {"log_file", "exit_code_file", "pid_file"} <= set(dir(paths))
    assert params(remote_job.build_posix_wrapper_command) == ["command", "paths", "environment"]
