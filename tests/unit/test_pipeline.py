"""Task bodies refuse bad input before any remote command, and fail with the reason when the record
store cannot be written (rl_verify.orchestration.verification, comparison and reporting, no Airflow server,
no node: SSH is replaced by a spy).

Connections are read the way tasks read them, from ``AIRFLOW_CONN_<ID>`` (the SDK resolves those
outside a task context too).
"""

from __future__ import annotations

from types import SimpleNamespace

import json
import os
from pathlib import Path

import pytest

from rl_verify import settings

from rl_verify.orchestration import comparison, reporting
from rl_verify.orchestration import verification as pipeline

from rl_verify.store import record

CONN_ID = "rl_sec_test_node"


class SSHSpy:
    """Stands in for pipeline.ssh_client: records every attempt and never connects."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, conn_id: str):
        self.calls.append(conn_id)
        raise AssertionError(f"an SSH connection to {conn_id!r} was opened")


@pytest.fixture()
def ssh_spy(monkeypatch) -> SSHSpy:
    spy = SSHSpy()
    monkeypatch.setattr(pipeline, "ssh_client", spy)
    return spy


@pytest.fixture()
def node_conn(monkeypatch, tmp_path):
    """A pinned SSH connection and sane node settings in the environment (nothing listens there)."""
    extra = {"key_file": str(tmp_path / "id"), "no_host_key_check": False,
             "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(
        {"conn_type": "ssh", "host": "127.0.0.1", "port": 9, "login": "nobody", "extra": extra}))
    for name, value in {"CI_SHARE_MODEL": "/share/model", "CI_SHARE_DATA": "/share/data",
                        "CI_SHARE_BASELINE": "/share/baseline", "RL_VERIFY_NODE_CHECKOUT": "/node/xtuner",
                        "RL_VERIFY_REMOTE_RUNS_DIR": "/node/runs"}.items():
        monkeypatch.setenv(name, value)
    return CONN_ID


def _params(**changes):
    return {"commit": "main", "suites": ["grpo", "opd"], "node": CONN_ID, **changes}


BAD_PARAMS = {
    "commit with ;": ({"commit": "main; rm -rf /"}, "'commit'"),
    "commit with $()": ({"commit": "$(reboot)"}, "'commit'"),
    "commit with backticks": ({"commit": "`id`"}, "'commit'"),
    "commit with a newline": ({"commit": "main\nid"}, "'commit'"),
    "commit with a trailing newline": ({"commit": "main\n"}, "'commit'"),
    "commit with a space": ({"commit": "main branch"}, "'commit'"),
    "commit with a leading -": ({"commit": "--upload-pack=evil"}, "'commit'"),
    "commit over 200 characters": ({"commit": "a" * 201}, "'commit'"),
    "unknown suite": ({"suites": ["dapo"]}, "'suites'"),
    "empty suites": ({"suites": []}, "'suites'"),
    "node with ;": ({"node": "rl_gpu_node;id"}, "'node'"),
    "unknown lane": ({"lane": "fast"}, "'lane' must be one of auto, skip, full"),
}


@pytest.mark.parametrize("label", sorted(BAD_PARAMS))
def test_resolve_commit_refuses_bad_params_without_retry_and_before_ssh(label, ssh_spy, node_conn):
    from airflow.sdk.exceptions import AirflowFailException

    changes, field = BAD_PARAMS[label]
    with pytest.raises(AirflowFailException) as err:  # AirflowFailException: no retry
        pipeline.resolve_commit(_params(**changes), "manual__bad-input")
    assert field in str(err.value)
    assert ssh_spy.calls == []


@pytest.mark.parametrize("setting,value", [
    ("RL_VERIFY_REMOTE_RUNS_DIR", "/node/runs;touch /tmp/pwned"),
    ("RL_VERIFY_NODE_CHECKOUT", "/node/$(id)"),
    ("CI_SHARE_MODEL", "/share/`id`"),
    ("CI_SHARE_DATA", "relative/data"),
    ("CI_SHARE_BASELINE", "/share/../../etc"),
])
def test_unsafe_node_settings_are_refused_naming_the_setting_before_ssh(setting, value, monkeypatch,
                                                                        ssh_spy, node_conn):
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv(setting, value)
    with pytest.raises(AirflowFailException) as err:
        pipeline.resolve_commit(_params(), "manual__bad-setting")
    assert setting in str(err.value)
    assert ssh_spy.calls == []


def test_unsafe_share_root_in_connection_extras_is_refused(monkeypatch, node_conn):
    conn = json.loads(os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"])
    conn["extra"]["ci_share_data"] = "/share/data;id"
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    with pytest.raises(ValueError, match="CI_SHARE_DATA"):
        pipeline.node_settings(CONN_ID)


# ------------------------------------------------------------------------------ record store

def _blocked(tmp_path: Path):
    """A record root below a regular file: not writable, even for root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder\n")
    return blocker, str(blocker / "records")


def _local_store(monkeypatch, tmp_path: Path, run_id: str = "manual__1") -> Path:
    """Point the record store at a folder under ``tmp_path``; return the run's record folder in it."""
    from rl_verify import settings

    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path / "records"))
    return Path(record.location(run_id))


def test_report_into_an_unwritable_record_store_fails_naming_it_and_verdict_says_no_report(tmp_path, monkeypatch):
    blocker, blocked = _blocked(tmp_path)
    monkeypatch.setattr(settings, "RECORD_ROOT", blocked)
    with pytest.raises(OSError) as err:
        reporting.report("manual__1", _params(), None)
    assert str(blocker) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]  # nothing half-written anywhere
    with pytest.raises(RuntimeError, match="no report was written"):
        reporting.verdict(None)


def test_unwritable_record_store_fails_resolve_commit_before_the_node_is_touched(tmp_path, monkeypatch,
                                                                                ssh_spy, node_conn):
    """Fail fast: a run whose record cannot be kept must not create a worktree (or reap folders) on
    the node first; the error names the record folder."""
    blocker, blocked = _blocked(tmp_path)
    monkeypatch.setattr(settings, "RECORD_ROOT", blocked)
    with pytest.raises(Exception) as err:
        pipeline.resolve_commit(_params(), "manual__unwritable")
    assert ssh_spy.calls == [], "the node was contacted before the record store was found unwritable"
    assert str(blocker) in str(err.value)


def test_compare_in_a_dag_names_the_missing_reference_on_the_node_and_keeps_every_fetch_note(monkeypatch, tmp_path):
    from conftest import dump_rows, opd_rows

    run_dir = _local_store(monkeypatch, tmp_path)
    record.write_json(run_dir / "commit.json", {"node": "gpu_node_7"})
    (run_dir / "opd").mkdir(parents=True)
    dump_rows(run_dir / "opd" / "tracker.jsonl", opd_rows())
    record.write_json(run_dir / "opd" / "fetch.json", {
        "suite": "opd", "work_dir": "/node/runs/r/work/opd", "files": {}, "problems": [],
        "notes": ["reference baseline unreadable or missing (Permission denied): /share/other.jsonl"],
        "other_experiments": ["/node/runs/r/work/opd/20261130101010/logs/exp_tracking/tracker.jsonl"],
        "reference_baseline_missing": "/share/baseline/opd-qwen3-vl-2b-25step/tracker.jsonl"})
    result = comparison.compare("opd", "manual__1")
    findings = " ".join(result["abnormal"])
    path = "/share/baseline/opd-qwen3-vl-2b-25step/tracker.jsonl"
    assert f"no reference baseline at {path} on node gpu_node_7" in findings
    assert "${CI_SHARE_BASELINE}" in findings and "--baseline" not in json.dumps(result)
    assert "fetch: reference baseline unreadable or missing (Permission denied)" in findings
    assert "fetch: several experiment folders in /node/runs/r/work/opd; the newest was evaluated" in findings


def test_verdict_message_names_each_failed_suite_with_its_class_and_what_breached():
    summary = {"verdict": "FAIL", "record": "/records/r", "failure_classes": ["accuracy", "infrastructure"],
               "suites": [{"suite": "grpo", "verdict": "FAIL", "failure_class": "accuracy", "missing": [],
                           "breached": [{"metric": "mismatch/mismatch_k3_kl", "first_breach_step": 10,
                                         "steps": "10-45"},
                                        {"metric": "time/step", "first_breach_step": 3, "steps": "3"}]},
                          {"suite": "opd", "verdict": "FAIL", "failure_class": "infrastructure",
                           "breached": [], "missing": ["eval/gsm8k/acc"]}]}
    assert reporting.verdict_message(summary, "http://ui/r") == (
        "FAIL (accuracy + infrastructure): grpo mismatch/mismatch_k3_kl breached at steps 10-45; time/step breached "
        "at step 3 (accuracy); opd not measured: eval/gsm8k/acc (infrastructure); report: http://ui/r")


def test_a_single_class_is_said_once_at_the_front():
    summary = {"verdict": "FAIL", "record": "/records/r", "failure_classes": ["accuracy"],
               "suites": [{"suite": "grpo", "verdict": "FAIL", "failure_class": "accuracy", "missing": [],
                           "breached": [{"metric": "mismatch/mismatch_k3_kl", "first_breach_step": 1,
                                         "steps": "1-45"}]}]}
    assert reporting.verdict_message(summary) == (
        "FAIL (accuracy): grpo mismatch/mismatch_k3_kl breached at steps 1-45; report: /records/r")


def test_compare_of_a_failing_suite_is_marked_failed_after_its_result_is_kept(monkeypatch, tmp_path, caplog):
    from airflow.sdk.exceptions import AirflowFailException
    from conftest import dump_rows, opd_rows

    run_dir = _local_store(monkeypatch, tmp_path)
    (run_dir / "opd").mkdir(parents=True)
    worse = opd_rows(change=lambda m, s, v: v - 0.2 if m == "eval/gsm8k/acc" and s >= 10 else v)
    dump_rows(run_dir / "opd" / "tracker.jsonl", worse)
    record.write_json(run_dir / "opd" / "fetch.json", {"suite": "opd", "work_dir": "/w", "files": {},
                                                         "problems": [], "notes": [], "other_experiments": []})
    with pytest.raises(AirflowFailException) as err:
        comparison.compare("opd", "manual__1")
    assert str(err.value) == ("FAIL (accuracy): opd eval/gsm8k/acc breached at steps 10-25 (the verdict, the next "
                              "step and the report link are above)")
    assert json.loads((run_dir / "opd" / "result.json").read_text())["verdict"] == "FAIL"
    # The task log says the verdict, the breach, the first next step and the report's link before Airflow's
    # traceback of the failure (issue 23: a FAIL's log must not read like a crash).
    (said,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    first, breached, step, link = said.splitlines()
    assert first == "opd: FAIL (accuracy)" and breached == "  breached: eval/gsm8k/acc at step(s) 10-25"
    assert step.startswith("  next step: first, ") and "jump at step 10" in step
    assert link.startswith("  report: /dags/rl_accuracy_verification/runs/manual__1/plugin/verification-report")


def test_a_fail_verdict_is_one_line_with_the_report_view_link(monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from rl_verify.orchestration import links

    from rl_verify.orchestration import notify

    monkeypatch.setattr(links, "ui_base_url", lambda: "http://airflow.example:8080")
    sent = []
    monkeypatch.setattr(notify, "send", lambda title, body, failure=False: sent.append((title, body)))
    monkeypatch.setattr(reporting, "_note_run", lambda run_id, note: sent.append(("note", note)))
    summary = {"verdict": "FAIL", "record": "/r", "failure_classes": ["accuracy"], "failed_suites": ["grpo"],
               "suites": [{"suite": "grpo", "verdict": "FAIL", "failure_class": "accuracy", "missing": [],
                           "breached": [{"metric": "mismatch/mismatch_k3_kl", "first_breach_step": 1,
                                         "steps": "1-45"}]}]}
    with pytest.raises(AirflowFailException) as err:
        reporting.verdict(summary, "manual__2026-11-30T10:00:00+00:00")
    assert str(err.value) == (
        "FAIL (accuracy): grpo mismatch/mismatch_k3_kl breached at steps 1-45; report: http://airflow.example:8080"
        "/dags/rl_accuracy_verification/runs/manual__2026-11-30T10%3A00%3A00%2B00%3A00/plugin/verification-report")


def test_without_a_notification_connection_nothing_is_sent_and_the_log_says_how_to_add_one(monkeypatch, caplog):
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from rl_verify.orchestration import notify

    def missing(conn_id):
        raise AirflowNotFoundException(conn_id)

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(missing))
    with caplog.at_level("INFO"):
        assert notify.send("t", "b") is False
    assert "rl_verify_notify" in caplog.text and "nothing sent" in caplog.text


def test_the_verdict_message_names_class_breach_next_step_and_report_link(monkeypatch):
    from rl_verify.orchestration import links
    from rl_verify.orchestration import notify

    monkeypatch.setattr(links, "ui_base_url", lambda: "http://ui")
    summary = {"verdict": "FAIL", "failure_classes": ["accuracy"],
               "suites": [{"suite": "grpo", "verdict": "FAIL", "failure_class": "accuracy", "missing": [],
                           "breached": [{"metric": "mismatch/mismatch_k3_kl", "first_breach_step": 1,
                                         "steps": "1-45"}]}]}
    title, body = notify.verdict(summary, "main (abc)", "manual__1", "check the train/inference mismatch first")
    assert title == "rl-verify FAIL (accuracy): main (abc)"
    assert body.splitlines() == ["grpo mismatch/mismatch_k3_kl breached at steps 1-45 (accuracy)",
                                 "Next step: check the train/inference mismatch first",
                                 "Report: http://ui/dags/rl_accuracy_verification/runs/manual__1/plugin/verification-report"]


def test_the_verdict_message_carries_the_drift_alarm_as_information_on_a_pass_and_a_fail(monkeypatch):
    from rl_verify.orchestration import links
    from rl_verify.orchestration import notify

    monkeypatch.setattr(links, "ui_base_url", lambda: "http://ui")
    alarm = "eval/gsm8k/acc 3.10x the prior's spread (noisier; ...)"
    suite = {"suite": "opd", "verdict": "PASS", "failure_class": None, "missing": [], "breached": [], "drift": [alarm]}
    _, body = notify.verdict({"verdict": "PASS", "suites": [suite]}, "main (abc)", "manual__1", None)
    assert f"opd: Drift alarm (information, not a FAIL): the runs' spread left the prior's plausible range, a " \
           f"noisier node or a changed library? The rule decides with the pooled spread: {alarm}" in body.splitlines()
    failing = {**suite, "verdict": "FAIL", "failure_class": "accuracy",
               "breached": [{"metric": "eval/gsm8k/acc", "first_breach_step": 5, "steps": "5"}]}
    _, body = notify.verdict({"verdict": "FAIL", "failure_classes": ["accuracy"], "suites": [failing]}, "main (abc)",
                             "manual__1", None)
    assert any(line.startswith("opd: Drift alarm") and line.endswith(alarm) for line in body.splitlines())
    assert notify.suite_summary(SimpleNamespace(suite="opd", verdict="PASS", failure_class=None, checks=[],
                                                abnormal=[]),
                                {"outcome": "PASS", "spread": {"drift": [alarm]}})["drift"] == [alarm]
