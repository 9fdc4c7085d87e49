"""The training job's submit script and RLJobTrigger against the real sshd of the simulated node."""
from __future__ import annotations

import asyncio
import json
import re

import pytest
from sim_ssh import Node

from rl_verify.node import remote
from rl_verify.engines import live_config, load_suite
from rl_verify.node.ops import run_script
from rl_verify.orchestration.triggers import RLJobTrigger

pytestmark = pytest.mark.integration
CONN_ID = "watched_node"


@pytest.fixture()
def node_conn(sim_node: Node, monkeypatch: pytest.MonkeyPatch) -> Node:
    info = sim_node.info
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "ssh", "host": info["host"], "port": info["port"], "login": info["user"],
        "extra": {"key_file": info["client_key"], "host_key": info["host_key"], "no_host_key_check": False}}))
    return sim_node


def _submit(node: Node, job_dir: str, command: str, env: dict[str, str] | None = None) -> None:
    status, _, err = run_script(node.client, remote.submit_job_script(job_dir, command, env or {}))
    assert status == 0, err


def _watch(trigger: RLJobTrigger) -> dict:
    async def first_event() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first_event(), 60))


class Collected:
    """Stands in for the trigger's logger: keeps what it was given to log, message per record."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def __getattr__(self, level: str):
        return lambda msg, *args, **kw: self.records.append((level, msg % args if args else msg))


def test_the_watch_streams_the_whole_log_and_ends_with_the_jobs_exit_code(node_conn: Node, monkeypatch) -> None:
    job_dir = f"{node_conn.root}/runs/watch-1/jobs/grpo"
    lines = [f"step {i} {'é' * i}" for i in range(1, 26)]  # each under the 64-byte chunk
    body = "; ".join(f"echo {remote.shlex.quote(line)}" for line in lines)
    _submit(node_conn, job_dir, f"( echo \"marker=$RUN_MARK\"; sleep 1; {body}; printf tail; exit 3 )",
            {"RUN_MARK": "a b"})
    trigger = RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker="watch-1/grpo", poll_interval=0.2,
                           log_chunk_size=64)
    log = Collected()
    monkeypatch.setattr(RLJobTrigger, "log", log)
    event = _watch(trigger)
    assert (event["exit_code"], event["status"], event["done"]) == (3, "failed", True)
    streamed = "".join(f"{msg}\n" for level, msg in log.records if level == "info")
    # Every line exactly once, in order, none split at a chunk boundary, then the final partial line.
    assert (streamed + event["log_chunk"]).splitlines() == ["marker=a b", *lines, "tail"]


def test_a_second_watch_resumes_the_log_where_the_first_one_stopped(node_conn: Node, monkeypatch) -> None:
    job_dir = f"{node_conn.root}/runs/watch-2/jobs/opd"
    _submit(node_conn, job_dir, f"( echo line 1; echo line 2; until [ -e {job_dir}/go ]; do sleep 0.1; done; "
                                "echo line 3; exit 0 )")
    first = RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker="watch-2/opd", poll_interval=0.1)

    async def watch_until_streamed() -> None:
        events = first.run()
        task = asyncio.ensure_future(events.__anext__())
        streamed = len("line 1\nline 2\n")
        while first.log_offset < streamed:
            await asyncio.sleep(0.05)
        # The next poll records on the node what was streamed before it: wait for that record (a state).
        while (await asyncio.to_thread(node_conn.run, f"cat {job_dir}/stream_offset"))[1].strip() != str(streamed):
            await asyncio.sleep(0.05)
        task.cancel()  # the triggerer went away mid-job
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(asyncio.wait_for(watch_until_streamed(), 60))
    assert node_conn.run(f"touch {job_dir}/go")[0] == 0
    # A new monitor starts at offset 0: it resumes at the recorded offset, not at byte 0. What it shows is
    # what it streamed before the job's end plus the event's last chunk (line 3 is in one or the other,
    # depending on whether a poll saw it before the exit code was written).
    log = Collected()
    monkeypatch.setattr(RLJobTrigger, "log", log)
    again = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker="watch-2/opd", poll_interval=0.1))
    streamed = "".join(f"{msg}\n" for level, msg in log.records
                       if level == "info" and not msg.startswith("Resuming the remote log"))
    assert again["exit_code"] == 0 and streamed + again["log_chunk"] == "line 3\n"
    assert ("info", "Resuming the remote log at byte 14 (streamed by an earlier monitor)") in log.records


def test_an_unreachable_node_ends_the_watch_after_the_reconnect_budget(node_conn: Node, monkeypatch) -> None:
    monkeypatch.setattr("rl_verify.orchestration.triggers.reconnect_delay", lambda attempt: 0.05)
    info = dict(node_conn.info)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "ssh", "host": info["host"], "port": 1, "login": info["user"],
        "extra": {"key_file": info["client_key"], "host_key": info["host_key"], "no_host_key_check": False}}))
    event = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=f"{node_conn.root}/runs/none/jobs/grpo",
                                job_marker="none/grpo", max_reconnect_attempts=2))
    assert event["exit_code"] is None and event["status"] == "error"
    assert "unreachable for 3 attempts" in event["message"]


def test_a_changed_host_key_is_refused_not_accepted(node_conn: Node, monkeypatch) -> None:
    info = node_conn.info
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "ssh", "host": info["host"], "port": info["port"], "login": info["user"],
        "extra": {"key_file": info["client_key"], "host_key": other, "no_host_key_check": False}}))
    event = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=f"{node_conn.root}/runs/none/jobs/grpo",
                                job_marker="none/grpo", max_reconnect_attempts=0))
    assert event["exit_code"] is None and "host key" in event["message"].lower()


def _tracker_writer(node: Node, rows: list[dict], folder: str, step_s: float, then: str = "time.sleep(600)") -> str:
    """A job command that writes ``rows`` into ``folder``/<exp>/t.jsonl one step at a time, then
    runs the Python statement ``then`` (default: waits)."""
    payload = "\n".join(json.dumps(r) for r in rows)
    script = (f"import json, os, sys, time\nos.makedirs({folder!r} + '/20260101000000', exist_ok=True)\n"
              f"out = open({folder!r} + '/20260101000000/t.jsonl', 'a')\n"
              f"for line in {payload!r}.splitlines():\n"
              f"    out.write(line + '\\n'); out.flush(); time.sleep({step_s})\n"
              f"{then}\n")
    return f"( exec python3 -c {remote.shlex.quote(script)} )"


def test_a_certain_fail_stops_the_job_early_and_says_where(node_conn: Node) -> None:
    from tests.unit.conftest import grpo_rows  # the hand-built trackers of the engine's unit tests

    run = f"{node_conn.root}/runs/live-1"
    baseline = f"{run}/baseline.jsonl"
    node_conn.run(f"mkdir -p {run} && cat > {baseline} << 'EOF'\n"
                  + "\n".join(json.dumps(r) for r in grpo_rows()) + "\nEOF")
    rows = [r for r in grpo_rows(mismatch=lambda i: 4e-4 if i >= 3 else 1e-5) if r["step"] <= 10]
    job_dir, work_dir = f"{run}/jobs/grpo", f"{run}/work/grpo"
    _submit(node_conn, job_dir, _tracker_writer(node_conn, rows, work_dir, 0.2), {"RL_VERIFY_JOB": "live-1/grpo"})
    # What the operator hands the trigger: the engine's check built in the worker from the baseline's bytes.
    text = ("\n".join(json.dumps(r) for r in grpo_rows()) + "\n").encode()
    live = {**live_config(load_suite("grpo"), work_dir, True, text, None, baseline), "tracker_glob": "*/t.jsonl"}
    event = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker="live-1/grpo", poll_interval=0.2,
                                live=live))
    # The abort comes at the first look after the breach (later when a busy machine delays a poll); the step
    # it names is the one the FAIL became certain at, whatever that look read: 3.
    aborted_at = re.match(r"aborted at step (\d+) of 45: ", event["message"])
    assert event["status"] == "aborted" and aborted_at, event["message"]
    assert int(aborted_at.group(1)) == 3, event["message"]
    assert "mismatch_k3_kl error 0.00039 at step 3 breaks" in event["message"]
    assert event["live"]["certain"][0]["metric"] == "mismatch/mismatch_k3_kl"
    assert node_conn.wait_no_processes("20260101000000", timeout=15) == [], "the job outlived its abort"


def test_a_log_rule_line_stops_a_hung_job_as_an_infrastructure_failure_quoting_it(node_conn: Node) -> None:
    run = f"{node_conn.root}/runs/live-2"
    job_dir, work_dir = f"{run}/jobs/opd", f"{run}/work/opd"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    _submit(node_conn, job_dir, f"( echo step 1; echo {remote.shlex.quote(oom)} >&2; exec sleep 600 )",
            {"RL_VERIFY_JOB": "live-2/opd"})
    live = {**live_config(load_suite("opd"), work_dir, True, None, None, None), "tracker_glob": "*/t.jsonl"}
    event = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker="live-2/opd", poll_interval=0.2,
                                live=live))
    assert event["status"] == "log_rule" and oom in event["message"] and "ran out of memory" in event["message"]
    assert event["live"]["log_rule"]["line"] == oom
    assert node_conn.wait_no_processes("sleep 600", timeout=15) == [], "the job outlived its stop"


def test_a_job_that_exits_zero_after_a_traceback_short_of_its_steps_ends_quoting_the_exception(node_conn) -> None:
    from tests.unit.conftest import opd_rows

    run = f"{node_conn.root}/runs/live-3"
    job_dir, work_dir = f"{run}/jobs/opd", f"{run}/work/opd"
    crash = ("print('Traceback (most recent call last):\\n  File \"rl_trainer.py\", line 1, in fit\\n"
             "RuntimeError: CUDA error: an illegal memory access was encountered', flush=True)")
    # Like the real launch script: the trainer dies, `tee` exits 0, so does the script.
    job = _tracker_writer(node_conn, [r for r in opd_rows() if r["step"] <= 4], work_dir, 0.05, then=crash)
    _submit(node_conn, job_dir, f"( {job}; echo teachers stopped; exit 0 )", {"RL_VERIFY_JOB": "live-3/opd"})
    live = {**live_config(load_suite("opd"), work_dir, True, None, None, None), "tracker_glob": "*/t.jsonl"}
    event = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker="live-3/opd", poll_interval=0.2,
                                live=live))
    assert event["status"] == "log_rule" and event["exit_code"] == 0, event
    assert event["message"] == ("ended at step 4 of 25 (exit code 0) after the trainer raised an exception (log line: "
                                "RuntimeError: CUDA error: an illegal memory access was encountered)")
    assert event["live"]["log_rule"]["at_exit"] is True


def test_a_trigger_deferred_by_an_earlier_version_resumes_by_its_stored_class_path(node_conn: Node, monkeypatch):
    """What an earlier rl-verify stored for a deferred training (its class path and its live config, which
    named the suite and the baseline's path): the triggerer rebuilds it and watches the job to its end."""
    from airflow.sdk.module_loading import import_string  # what the triggerer does with the stored path

    from tests.unit.conftest import opd_rows

    run = f"{node_conn.root}/runs/legacy-1"
    job_dir, work_dir = f"{run}/jobs/opd", f"{run}/work/opd"
    rows = [r for r in opd_rows(steps=25) if r["step"] <= 3]
    _submit(node_conn, job_dir, _tracker_writer(node_conn, rows, work_dir, 0.1, then="print('done')"),
            {"RL_VERIFY_JOB": "legacy-1/opd"})
    stored = ("rl_verify.triggers.RLJobTrigger", {
        "ssh_conn_id": CONN_ID, "job_dir": job_dir, "job_marker": "legacy-1/opd", "poll_interval": 0.2,
        "log_chunk_size": 65536, "log_offset": 0, "command_timeout": 30.0, "max_reconnect_attempts": 12,
        "live": {"suite": "opd", "work_dir": work_dir, "tracker_glob": "*/t.jsonl", "baseline": None,
                 "early_abort": True, "run_id": "manual__legacy", "dag_id": "rl_accuracy_verification",
                 "version_files": ["golden.json"], "version_label": "v1: shipped"}})
    log = Collected()
    monkeypatch.setattr(RLJobTrigger, "log", log)
    trigger = import_string(stored[0])(**stored[1])
    event = _watch(trigger)
    # "done" is in the event's last chunk or was streamed before it, whichever poll read it first (a busy machine
    # lets a poll read it before the exit code is written).
    streamed = "".join(f"{msg}\n" for level, msg in log.records if level == "info")
    assert (event["status"], event["exit_code"]) == ("success", 0) and "done" in streamed + event["log_chunk"]
    assert any("deferred by an earlier version" in msg for level, msg in log.records if level == "warning")
    # It serialises under its current class path from now on, still importable by the old one.
    assert trigger.serialize()[0] == "rl_verify.orchestration.triggers.RLJobTrigger"
    assert import_string("rl_verify.triggers.RLJobTrigger") is RLJobTrigger


@pytest.mark.parametrize("ends_itself_s", [0, 60])
def test_a_lane_evidence_job_that_stops_itself_is_left_to_end_on_its_own_not_stopped(node_conn: Node,
                                                                                     ends_itself_s: int) -> None:
    """Issue 53: a lane job that records its executed lines and stops itself after the lane's k steps is not stopped
    once they are read (a process stopped while coverage.py saves leaves no evidence): the watch ends with the job's
    own exit and the k steps' reading; any other lane job is stopped as soon as its k steps are read."""
    rows = [{"step": s, "response/rewards/mean": 0.5 + s / 100} for s in range(3)]
    run = f"{node_conn.root}/runs/lane-{ends_itself_s}"
    job_dir, work_dir = f"{run}/jobs/opd-ref1", f"{run}/work/opd-ref1"
    # k = 2 steps read, then 2 s of ending (the processes saving their data) and a clean exit
    _submit(node_conn, job_dir, _tracker_writer(node_conn, rows, work_dir, 0.2, then="time.sleep(2)"),
            {"RL_VERIFY_JOB": f"lane-{ends_itself_s}/opd-ref1"})
    lane = {"work_dir": work_dir, "tracker_glob": "*/t.jsonl", "steps": 2, "exclude": [], "reference": None,
            "ends_itself_s": ends_itself_s}
    event = _watch(RLJobTrigger(ssh_conn_id=CONN_ID, job_dir=job_dir, job_marker=f"lane-{ends_itself_s}/opd-ref1",
                                poll_interval=0.2, lane=lane))
    assert event["lane"]["steps_seen"] >= 2, event
    if ends_itself_s:
        assert event.get("status") != "lane" and event["exit_code"] == 0, event
    else:
        assert event["status"] == "lane" and event.get("exit_code") is None, event
