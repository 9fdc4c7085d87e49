"""GPU jobs through Slurm (issue 45), end to end: a real single-node Slurm on this machine (munged, slurmctld,
slurmd; 16 GPUs as device files, two simulated 8-GPU compute nodes: harness.slurm, harness.rig), the simulated node as
its login node, a real Airflow. The simulated trainer runs inside the Slurm jobs. A verification PASS, an early abort
that cancels its job, an account Slurm refuses named before the card, a job cancelled from outside classified, a
DAG run cancelled mid-training (its job gone within 60 s), slurmctld down for a minute or restarted mid-training (the
verification ends as if nothing happened), the node set DOWN mid-job (NODE_FAIL, named, no second training), a
bisection whose probes run as concurrent Slurm jobs.
After every test Slurm holds no job of it and no process of its jobs is left. Every wait is for a state, never a
guessed duration.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.rig import CONN_ID, DAG_ID, Rig, node_connection_env
from rl_verify.core.names import run_key
from rl_verify.node.slurm_states import ACTIVE
from simulator import node as sim
from simulator.checkout import bisect_history

pytestmark = pytest.mark.e2e
BISECT_DAG_ID = "rl_regression_bisect"
PROBE_DAG_ID = "rl_accuracy_probe"
STEP_SECONDS = 0.05
#: A connection to the same login node whose account the partition does not allow.
REFUSED = "rl_slurm_unknown_account"
HELD = "rl_slurm_short_queue"
#: A short bisection history: the culprit at 2 of 3 commits, the OPD teacher regression at full size.
LAYOUT = {"commits": 3, "culprit": 2, "launch_fails": 0, "scale": 1.0}
GONE_WITHIN_S = 60


def _refused_connection(rig: Rig) -> dict[str, str]:
    """The rig's extra connections: one whose Slurm account is refused, one whose jobs may wait 20 s in the queue."""
    env = {"RL_VERIFY_JOB_POLL_INTERVAL_S": "1", "RL_VERIFY_BISECT_POLL_S": "1"}
    for conn_id, extra in ((REFUSED, {"slurm_account": "nobody"}), (HELD, {"slurm_pending_limit_s": "20"})):
        conn = json.loads(node_connection_env(conn_id, rig.node)[f"AIRFLOW_CONN_{conn_id.upper()}"])
        conn["extra"].update(rig.launcher_extra(**extra))
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
    return env


@pytest.fixture(scope="module")
def rig(start_rig):
    # Two simulated 8-GPU compute nodes behind one slurmd of 16 GPUs (harness.rig: Slurm's TaskProlog gives a job the
    # node its GPUs belong to); the first node is also the login node.
    with start_rig("e2e-slurm", step_seconds=STEP_SECONDS, database="postgres", slurm_gpus=16, nodes=2,
                   extra_env=_refused_connection) as rig:
        rig.nodes[CONN_ID] = sim.start_node(rig.node_state(), step_seconds=STEP_SECONDS, bisect=LAYOUT,
                                            login_env=rig.slurm.env)
        rig.client.create_pool(f"rl_node_{REFUSED}", 1, include_deferred=True, description="refused account")
        rig.client.create_pool(f"rl_node_{HELD}", 1, include_deferred=True, description="a 20 s queue limit")
        for dag_id in (BISECT_DAG_ID, PROBE_DAG_ID):
            rig.enable_dag(dag_id)
        yield rig


def _jobs(rig: Rig) -> list[dict[str, str]]:
    """Every job Slurm holds that is not ended: id, name, state."""
    return [job for job in rig.slurm.jobs() if job["state"] in ACTIVE]




def _wait(what: str, predicate: Any, timeout: float, poll: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


@pytest.fixture(autouse=True)
def no_job_left(rig):
    """After every test, Slurm shows no job of it (a cancelled job may take Slurm's KillWait to leave), and no
    process of its jobs is left on a compute node: Ray's daemons leave the job's process tree, and a cancelled job
    that left them running made the next OPD job on that node fail ("Ray is already running")."""
    yield
    left: list[Any] = []
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        left = _jobs(rig) + [(conn, pid, cmd) for conn in rig.nodes
                             for pid, cmd in sim.node_processes(rig.node_state(conn)) if "rlsim-ray-" in cmd]
        if not left:
            break
        time.sleep(0.5)
    rig.slurm.cancel_all()
    # One training per job, ever: a requeued or restarted job that ran its body again would leave a second folder.
    for conn in rig.nodes:
        for work in (Path(rig.nodes[conn]["root"]) / "runs").glob("*/work/*"):
            trackers = list(work.glob("*/logs/exp_tracking/tracker.jsonl"))
            assert len(trackers) <= 1, f"{work}: {len(trackers)} trainings in one job's folder: {trackers}"
    for entry in left:
        if isinstance(entry, tuple):  # a leftover Ray daemon: ended so the next test starts clean
            subprocess.run(["kill", "-KILL", str(entry[1])], check=False)
    sim.clear_faults(rig.node_state())
    assert not left, f"Slurm jobs or job processes still there after the test: {left}"


def _step_seconds(rig: Rig, seconds: float) -> None:
    """The simulated training's step time on every compute node (read by each training at its launch)."""
    for conn in rig.nodes:
        path = Path(rig.nodes[conn]["root"]) / "sim.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "step_seconds": seconds}))


def _job_dir(rig: Rig, run_id: str, job: str) -> Path:
    return Path(rig.node["root"]) / "runs" / run_key(run_id) / "jobs" / job


def _job_id(rig: Rig, run_id: str, job: str = "grpo") -> str:
    return (_job_dir(rig, run_id, job) / "slurm_job_id").read_text().strip()


def _running(rig: Rig, run_id: str, job: str = "grpo", min_steps: int = 2) -> str:
    """Wait until Slurm runs the run's job and its tracker has ``min_steps`` rows; its Slurm job id."""
    name = f"rlv.{run_key(run_id)}.{job}"

    def ready() -> str | None:
        running = [j for j in _jobs(rig) if j["name"] == name and j["state"] == "RUNNING"]
        trackers = list((Path(rig.node["root"]) / "runs" / run_key(run_id) / "work" / job).glob(
            "*/logs/exp_tracking/tracker.jsonl"))
        rows = trackers[0].read_text(errors="replace").count("response/rewards/mean") if trackers else 0
        return running[0]["id"] if running and rows >= min_steps else None

    return _wait(f"Slurm job {name} running with {min_steps} tracker rows", ready, 240)


def _log(rig: Rig, run_id: str, task: str) -> str:
    tries = int(rig.client.task_instance(DAG_ID, run_id, task).get("try_number") or 1)
    return "\n".join(rig.client.task_log(DAG_ID, run_id, task, try_number=t) for t in range(1, tries + 1))


def _first_row_after_submit(rig: Rig, run_id: str, job: str = "grpo") -> float:
    """Seconds from the job's submission (its id recorded) to the first step row in its tracker."""
    submitted = _wait("the job's submission", lambda: (_job_dir(rig, run_id, job) / "slurm_job_id").exists() and
                      time.monotonic(), 300, poll=0.05)
    work = Path(rig.node["root"]) / "runs" / run_key(run_id) / "work" / job

    def first_row() -> float | None:
        trackers = list(work.glob("*/logs/exp_tracking/tracker.jsonl"))
        rows = trackers[0].read_text(errors="replace").count("response/rewards/mean") if trackers else 0
        return time.monotonic() if rows else None

    return _wait("the first tracker row", first_row, 300, poll=0.05) - submitted


def test_a_verification_through_slurm_passes_with_the_trainer_inside_the_job(rig):
    seen: dict[str, float] = {}
    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, timeout=900,
                  during=lambda run_id: seen.update(first_row_s=_first_row_after_submit(rig, run_id)))
    print(f"Slurm: job submitted to its first tracker row in {seen['first_row_s']:.1f} s")
    assert out.state == "success" and out.summary["verdict"] == "PASS", rig.client.failures(DAG_ID, out.run_id)
    job_id = _job_id(rig, out.run_id)
    log = _log(rig, out.run_id, "run_grpo")
    assert f"Slurm JOB {job_id} submitted in partition gpu" in log
    # The trigger read the job's Slurm state (a busy triggerer's first look may come after the short job ended).
    assert "Slurm started the job" in log or "Slurm ran the job" in log
    # The trainer ran inside the job: the batch step wrote when it started, the training's output and its exit code.
    job_dir = _job_dir(rig, out.run_id, "grpo")
    assert (job_dir / "exit_code").read_text().strip() == "0" and (job_dir / "started").exists()
    assert "launch script exited 0" in (job_dir / "stdout.log").read_text()
    assert "Slurm partition gpu is up" in _log(rig, out.run_id, "check_prerequisites")


def test_a_crash_at_launch_once_trains_again_as_a_new_slurm_job_after_the_first_is_gone(rig):
    """Issue 55 on Slurm: the first job dies at launch (a one-off fault of the simulated node); its job is proven
    gone (the launcher's stop) before a second job, with a folder and a marker of its own, trains and PASSes."""
    sim.set_fault(rig.node_state(), "grpo", "crash", at_step=0, times=1)
    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, timeout=900)
    assert out.state == "success" and out.summary["verdict"] == "PASS", rig.client.failures(DAG_ID, out.run_id)
    first, second = _job_id(rig, out.run_id, "grpo"), _job_id(rig, out.run_id, "grpo-t2")
    assert first != second
    ended = {j["id"]: j["state"] for j in rig.slurm.jobs()}
    assert ended.get(first) not in ACTIVE and ended.get(second) not in ACTIVE, ended
    attempts = json.loads((Path(out.summary["record"]) / "grpo" / "attempts.json").read_text())
    assert [(a["job"], a["kind"]) for a in attempts] == [("grpo", "transient"), ("grpo-t2", None)], attempts
    log = _log(rig, out.run_id, "run_grpo")
    assert f"Slurm JOB {first} submitted" in log and f"Slurm JOB {second} submitted" in log
    assert log.index("the node is clean") < log.index(f"Slurm JOB {second} submitted"), log[-3000:]
    assert "attempt 2 on " in Path(out.summary["report"]["md"]).read_text()


def test_an_account_slurm_refuses_is_named_before_the_card_and_nothing_is_submitted(rig):
    before = {j["id"] for j in rig.slurm.jobs()}
    out = rig.run({"commit": "main", "suites": ["grpo"], "node": REFUSED}, decision=None, timeout=600)
    assert out.state == "failed"
    assert out.tasks["check_prerequisites"] == "failed" and out.tasks["approve"] in (None, "upstream_failed")
    log = _log(rig, out.run_id, "check_prerequisites")
    assert "slurm_account" in log and "'nobody'" in log and "Fix:" in log
    assert {j["id"] for j in rig.slurm.jobs()} == before


def test_an_early_abort_cancels_the_slurm_job(rig):
    _step_seconds(rig, 0.5)  # 45 steps of 0.5 s: the live check reads the breach long before the training's end
    try:
        out = rig.run({"commit": "sim/regress-mismatch", "suites": ["grpo"], "node": CONN_ID}, timeout=900)
    finally:
        _step_seconds(rig, STEP_SECONDS)
    assert out.summary["verdict"] == "FAIL", rig.client.failures(DAG_ID, out.run_id)
    log = _log(rig, out.run_id, "run_grpo")
    job_id = _job_id(rig, out.run_id)
    assert "Early abort: killed job" in log and f"SCANCEL {job_id}" in log
    gone = re.search(rf"GONE {job_id} after (\d+) ms", log)
    assert gone, log[-3000:]
    print(f"Slurm: early abort's scancel to the job gone: {int(gone.group(1))} ms")
    # Cancelled, not ended by itself: Slurm's record (its signal may reach the training before the batch step, which
    # then records the training's death as an exit code: Slurm's end decides, tests/integration/test_slurm_server.py).
    assert {j["id"]: j["state"] for j in rig.slurm.jobs()}.get(job_id) == "CANCELLED", rig.slurm.jobs()
    assert out.summary["failure_classes"] == ["accuracy"]  # the cancel is rl-verify's own: no scheduler failure


def test_a_job_cancelled_outside_rl_verify_gets_its_own_failure_class(rig):
    sim.set_fault(rig.node_state(), "grpo", "hold", at_step=3)
    seen: dict[str, Any] = {}

    def cancel(run_id: str) -> None:
        seen["id"] = _running(rig, run_id)
        subprocess.run(["scancel", seen["id"]], env={**rig.slurm.env, "PATH": "/usr/bin:/bin"}, check=True)

    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, during=cancel, timeout=900)
    assert out.state == "failed" and out.summary["verdict"] == "FAIL"
    assert out.summary["failure_classes"] == ["infrastructure (cancelled outside rl-verify)"]
    report = json.loads(Path(out.summary["report"]["json"]).read_text())
    assert f"Slurm ended job {seen['id']}" in json.dumps(report)
    assert "cancelled outside rl-verify" in _log(rig, out.run_id, "run_grpo")


def test_a_dag_run_cancelled_mid_training_leaves_no_slurm_job_within_60_s(rig):
    sim.set_fault(rig.node_state(), "grpo", "hold", at_step=3)
    seen: dict[str, Any] = {}

    def cancel(run_id: str) -> None:
        job_id = _running(rig, run_id)
        # The kill is the watching trigger's on_kill: wait until a triggerer runs it (its first look at the job is
        # in the task log). A run marked failed before that is stopped by the cleanup teardown (the next test).
        _wait("the trigger watching the job", lambda: "Slurm started the job" in _log(rig, run_id, "run_grpo"), 120,
              poll=1)
        rig.client.set_run_state(DAG_ID, run_id, "failed")
        t0 = time.monotonic()
        try:
            _wait(f"Slurm job {job_id} gone", lambda: job_id not in {j["id"] for j in _jobs(rig)}, GONE_WITHIN_S)
        except AssertionError as err:
            triggerer = rig.state_dir / "airflow" / "logs" / "triggerer.log"
            words = ("kill", "cancel", "stop", "could not", "timed out")
            said = [line for line in triggerer.read_text(errors="replace").splitlines()
                    if any(w in line.lower() for w in words)] if triggerer.exists() else []
            raise AssertionError(f"{err}; run_grpo: {_log(rig, run_id, 'run_grpo')[-4000:]}; triggerer: "
                                 + "\n".join(said[-20:])) from None
        seen["gone_s"] = time.monotonic() - t0

    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, during=cancel, timeout=900)
    assert out.state == "failed" and seen["gone_s"] < GONE_WITHIN_S
    print(f"DAG run cancelled: its Slurm job gone {seen['gone_s']:.1f} s later")


def test_a_run_marked_failed_while_no_triggerer_runs_leaves_no_slurm_job_within_60_s(rig):
    """Issue 54: no trigger watches the job (the triggerer is stopped once the approval is taken, as before a
    triggerer's first look), so only the cleanup, a teardown that a run marked failed still runs, can cancel it.
    Before, the marking skipped the cleanup (all_done) and the job held its GPUs to Slurm's time limit."""
    sim.set_fault(rig.node_state(), "grpo", "hold", at_step=3)
    seen: dict[str, Any] = {}

    def mark_failed_without_triggerer(run_id: str) -> None:
        rig.client.wait_for_task(DAG_ID, run_id, "approve", timeout=300)  # the approval resumes through it
        rig.stack.stop_component("triggerer")
        try:
            job_id = _running(rig, run_id)
            _wait("run_grpo deferred", lambda: rig.client.task_instance(DAG_ID, run_id, "run_grpo")["state"]
                  == "deferred", 120, poll=1)
            rig.client.set_run_state(DAG_ID, run_id, "failed")
            t0 = time.monotonic()
            _wait(f"Slurm job {job_id} gone", lambda: job_id not in {j["id"] for j in _jobs(rig)}, GONE_WITHIN_S)
            seen["gone_s"] = time.monotonic() - t0
        finally:
            rig.stack.start_component("triggerer")

    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, during=mark_failed_without_triggerer,
                  timeout=900)
    assert out.state == "failed", out.tasks
    assert (out.tasks["run_grpo"], out.tasks["cleanup"], out.tasks["final_state"]) == ("failed", "success", "failed")
    assert "ended by hand" in _log(rig, out.run_id, "cleanup")
    print(f"DAG run marked failed with no triggerer: its Slurm job gone {seen['gone_s']:.1f} s later")


def test_a_job_held_in_the_queue_past_the_pending_limit_is_cancelled_naming_the_hold(rig):
    """Issue 54: a job someone holds (``scontrol hold``) while it waits for GPUs stays PENDING (JobHeldUser): the
    watch cancels it once the connection's pending limit (20 s here) is spent, and the report names Slurm's reason."""
    blocker = rig.slurm.run("sbatch", "--parsable", "-p", "gpu", "-A", "rl-verify", "--gres=gpu:16", "-J",
                            "blocker", "--wrap", "sleep 900", check=True).stdout.strip().split(";")[0]
    seen: dict[str, Any] = {}
    try:
        _wait("the blocker job running", lambda: {j["id"]: j["state"] for j in _jobs(rig)}.get(blocker) == "RUNNING",
              60)

        def hold(run_id: str) -> None:
            name = f"rlv.{run_key(run_id)}.grpo"
            job = _wait(f"{name} pending behind the blocker",
                        lambda: next((j for j in _jobs(rig) if j["name"] == name and j["state"] == "PENDING"), None),
                        300, poll=1)
            seen["id"] = job["id"]
            rig.slurm.run("scontrol", "hold", job["id"], check=True)
            seen["held_at"] = time.monotonic()
            rig.slurm.run("scancel", blocker, check=True)   # GPUs free: only the hold keeps the job waiting

        out = rig.run({"commit": "main", "suites": ["grpo"], "node": HELD}, during=hold, timeout=900)
    finally:
        rig.slurm.run("scancel", blocker)
    assert out.state == "failed" and out.summary["verdict"] == "FAIL", out.tasks
    assert out.summary["failure_classes"] == ["infrastructure (never scheduled)"], out.summary
    log = _log(rig, out.run_id, "run_grpo")
    # root's hold is an administrator's (JobHeldAdmin), a user's own JobHeldUser: Slurm's reason, as it said it.
    assert re.search(r"reason JobHeld(Admin|User); the job was cancelled", log), log[-3000:]
    assert re.search(r"JobHeld(Admin|User)", json.dumps(json.loads(Path(out.summary["report"]["json"]).read_text())))
    assert seen["id"] not in {j["id"] for j in _jobs(rig)}
    print(f"a job held in the queue: hold to the run's end {time.monotonic() - seen['held_at']:.1f} s")


@pytest.mark.parametrize("accounting", [True, False], ids=["with-accounting", "without-accounting"])
def test_a_job_slurm_forgot_while_nobody_watched_is_read_from_accounting_or_named(rig, accounting):
    """Issue 54: the job is cancelled outside rl-verify while no triggerer runs, and slurmctld forgets it
    (MinJobAge) before the watch looks again. With accounting its end comes from sacct (the same class as a cancel
    the watch saw); without, the job is named as one Slurm no longer knows. Before, squeue's "Invalid job id" read
    GONE and sacct was never asked."""
    sim.set_fault(rig.node_state(), "grpo", "hold", at_step=3)
    seen: dict[str, Any] = {}

    def forget(run_id: str) -> None:
        seen["id"] = job_id = _running(rig, run_id)
        _wait("the trigger watching the job", lambda: "Slurm started the job" in _log(rig, run_id, "run_grpo"), 120,
              poll=1)
        rig.stack.stop_component("triggerer")
        try:
            rig.slurm.reconfigure(min_job_age=2, accounting=accounting)
            rig.slurm.run("scancel", job_id, check=True)
            # slurmctld purges ended jobs older than MinJobAge about once a minute.
            _wait(f"slurmctld forgetting job {job_id}", lambda: job_id not in {j["id"] for j in rig.slurm.jobs()},
                  180, poll=1)
        finally:
            rig.stack.start_component("triggerer")
            seen["back_at"] = time.monotonic()

    try:
        out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, during=forget, timeout=900)
    finally:
        rig.slurm.reconfigure(min_job_age=300, accounting=True)
    assert out.state == "failed" and out.summary["verdict"] == "FAIL", out.tasks
    log = _log(rig, out.run_id, "run_grpo")
    if accounting:
        assert out.summary["failure_classes"] == ["infrastructure (cancelled outside rl-verify)"], out.summary
        assert f"Slurm ended job {seen['id']}" in json.dumps(json.loads(Path(out.summary["report"]["json"])
                                                                        .read_text()))
    else:
        assert out.summary["failure_classes"][0].startswith("infrastructure"), out.summary
        assert f"no longer knows job {seen['id']}" in log, log[-3000:]
    back_s = time.monotonic() - seen["back_at"]
    print(f"a job Slurm forgot ({'with' if accounting else 'without'} accounting): "
          f"{out.summary['failure_classes']}, triggerer back to the run's end {back_s:.1f} s")


@pytest.mark.parametrize("outage_s", [60, 0], ids=["down-60s", "restarted"])
def test_a_controller_outage_mid_training_ends_the_verification_as_if_nothing_happened(rig, outage_s):
    """slurmctld down for 60 s at least while a healthy job trains, its body ending inside the outage (every squeue
    fails meanwhile), or restarted at once. The watch takes the silence as "unknown", never as an end (issue 54: one
    failed squeue used to end it as "Slurm no longer knows job N", an infrastructure FAIL of a healthy run)."""
    # Held at step 5 until the watch has met the silence: then the body ends while Slurm is still down.
    sim.set_fault(rig.node_state(), "grpo", "hold", at_step=5)
    seen: dict[str, Any] = {}

    def outage(run_id: str) -> None:
        seen["id"] = _running(rig, run_id, min_steps=3)
        _wait("the trigger watching the job", lambda: "Slurm started the job" in _log(rig, run_id, "run_grpo"), 120,
              poll=1)
        rig.slurm.stop_controller()
        down = seen["fault_at"] = time.monotonic()
        try:
            if outage_s:
                _wait("the watch meeting the silence", lambda: "Slurm does not answer" in
                      _log(rig, run_id, "run_grpo"), 300, poll=1)
                sim.release(rig.node_state(), "grpo")
                _wait("the body's end", (_job_dir(rig, run_id, "grpo") / "exit_code").exists, 300, poll=1)
                _wait(f"{outage_s} s of outage", lambda: time.monotonic() - down >= outage_s, 120, poll=1)
        finally:
            seen["down_s"] = time.monotonic() - down
            seen["back_s"] = rig.slurm.start_controller()
            sim.release(rig.node_state(), "grpo")

    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, during=outage, timeout=900)
    print(f"Slurm: controller down {seen['down_s']:.0f} s, answering {seen['back_s']:.1f} s after its start; "
          f"fault to verdict {time.monotonic() - seen['fault_at']:.0f} s")
    assert out.state == "success" and out.summary["verdict"] == "PASS", rig.client.failures(DAG_ID, out.run_id)
    log = _log(rig, out.run_id, "run_grpo")
    if outage_s:
        assert "Slurm does not answer" in log and "taken as still running" in log, log[-3000:]
    job_dir = _job_dir(rig, out.run_id, "grpo")
    assert (job_dir / "exit_code").read_text().strip() == "0" and not (job_dir / "scheduler_end").exists()
    work = Path(rig.node["root"]) / "runs" / run_key(out.run_id) / "work" / "grpo"
    assert len(list(work.glob("*/logs/exp_tracking/tracker.jsonl"))) == 1  # one training


def test_a_node_set_down_mid_job_ends_as_node_failure_with_no_second_training(rig):
    """The compute node set DOWN while the job trains: Slurm ends it NODE_FAIL, and with --no-requeue it never starts
    again; the verification ends FAIL (infrastructure (node failure)), naming Slurm's end."""
    sim.set_fault(rig.node_state(), "grpo", "hold", at_step=3)
    seen: dict[str, Any] = {}

    def node_down(run_id: str) -> None:
        seen["id"] = _running(rig, run_id, min_steps=2)
        rig.slurm.run("scontrol", "update", f"nodename={rig.slurm.hostname}", "state=down", "reason=rlv-test",
                      check=True)
        seen["fault_at"] = time.monotonic()
        try:
            _wait(f"job {seen['id']} ended by the node's failure", lambda: {j["id"]: j["state"] for j in
                  rig.slurm.jobs()}.get(seen["id"]) not in (None, *ACTIVE), 120)
        finally:
            # Refused ("Invalid node state specified") where slurmd's next registration has already returned the
            # node to service (ReturnToService): the wait below is what counts.
            rig.slurm.run("scontrol", "update", f"nodename={rig.slurm.hostname}", "state=resume")
            _wait("the node back", lambda: rig.slurm.node_state() in ("idle", "mixed", "allocated"), 120)

    out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, during=node_down, timeout=900)
    print(f"Slurm: node set down to verdict {time.monotonic() - seen['fault_at']:.0f} s")
    assert out.state == "failed" and out.summary["verdict"] == "FAIL"
    assert out.summary["failure_classes"] == ["infrastructure (node failure)"], out.summary
    assert "NODE_FAIL" in _log(rig, out.run_id, "run_grpo")
    job_dir = _job_dir(rig, out.run_id, "grpo")
    assert (job_dir / "scheduler_end").read_text().split()[0] == "NODE_FAIL"
    assert not (job_dir / "exit_code").exists() or (job_dir / "exit_code").read_text().strip() != "0"
    work = Path(rig.node["root"]) / "runs" / run_key(out.run_id) / "work" / "grpo"
    assert len(list(work.glob("*/logs/exp_tracking/tracker.jsonl"))) == 1  # never started a second time


def test_a_bisection_runs_its_probes_as_concurrent_slurm_jobs_and_names_the_culprit(rig):
    history = bisect_history(Path(rig.node["root"]))
    most, stop = [0], threading.Event()

    def watch() -> None:  # the most probe jobs Slurm ran at once
        while not stop.is_set():
            running = [j for j in _jobs(rig) if j["state"] == "RUNNING" and j["name"].startswith("rlv.")]
            most[0] = max(most[0], len(running))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run_id = rig.client.trigger(BISECT_DAG_ID, conf={"good": history["commits"][0], "bad": history["commits"][-1],
                                                         "suites": ["opd"], "nodes": CONN_ID})
        detail = rig.client.wait_for_hitl(BISECT_DAG_ID, run_id, task_id="approve", timeout=600)
        assert "2 at once, Slurm" in detail["body"]
        rig.client.respond_hitl(BISECT_DAG_ID, run_id, "approve", ["Approve"])
        state = rig.client.wait_for_run(BISECT_DAG_ID, run_id, timeout=1500)
    finally:
        stop.set()
        watcher.join()
    result = json.loads((Path(rig.record_root) / BISECT_DAG_ID / run_key(run_id) / "bisection.json").read_text())
    assert state == "success" and result["answer"]["culprit"]["sha"] == history["culprit"], result.get("answer")
    assert most[0] == 2, f"at most {most[0]} probe job(s) ran at once"
    print(f"bisection: {len(result['probes'])} probe(s), at most {most[0]} Slurm jobs at once")
