"""The private single-node Slurm (harness/slurm.py), for real: Debian's munged, slurmctld and slurmd as root, 16 fake
GPUs, partition ``gpu`` (accounts rl-verify and ml-infra, QOS normal) and ``gpu-down``. Every wait polls squeue or
sinfo against a deadline; nothing sleeps a fixed time.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (scripts/ensure_slurm.sh, run by `make test`):
a missing one is a failure, not a skip.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from harness.slurm import Slurm, slurm_available

pytestmark = pytest.mark.integration

GPUS = 16
ACCOUNT = "rl-verify"
#: How long a cancelled job may take to leave RUNNING (the DAG's promise for a cancelled run's job).
GONE_WITHIN_S = 60
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    reason = slurm_available()
    if reason:
        pytest.fail(reason)
    cluster = Slurm(tmp_path_factory.mktemp("slurm"), gpus=GPUS)
    with cluster:
        print(f"\nslurm ready in {cluster.started_in:.1f}s ({cluster.conf_path})")
        yield cluster
        cluster.cancel_all()
        assert cluster.active_jobs() == [], "squeue still shows jobs after the module"
    assert not cluster.running()
    assert not any(p.exists() for p in (cluster.state_dir / "dev").glob("nvidia*")), "device files left behind"


@pytest.fixture(autouse=True)
def no_job_left(slurm: Slurm) -> Iterator[None]:
    """Each test starts and ends with an empty queue."""
    slurm.cancel_all()
    yield
    slurm.cancel_all()


def _sbatch(slurm: Slurm, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sbatch", *args], env={**os.environ, **slurm.env}, text=True, capture_output=True,
                          timeout=30)


def _submit(slurm: Slurm, *args: str) -> str:
    """sbatch --parsable with the allowed account in the default partition; the job id."""
    r = _sbatch(slurm, "--parsable", "-p", "gpu", f"--account={ACCOUNT}", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _wait(what: str, predicate: Callable[[], _T | None], timeout: float = 60.0, poll: float = 0.2) -> _T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def _job(slurm: Slurm, job_id: str) -> dict[str, str]:
    return next((j for j in slurm.jobs() if j["id"] == job_id), {"id": job_id, "state": "GONE", "reason": ""})


def test_a_gpu_job_runs_and_sees_its_eight_devices(slurm: Slurm, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job = _submit(slurm, "--gres=gpu:8", f"--output={out}", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    _wait(f"job {job} completed", lambda: _job(slurm, job)["state"] == "COMPLETED")
    indexes = out.read_text().strip().split(",")
    assert len(indexes) == 8 and all(i.isdigit() for i in indexes), out.read_text()
    assert len(set(indexes)) == 8


def test_two_eight_gpu_jobs_run_at_once_and_a_third_waits_for_resources(slurm: Slurm) -> None:
    first, second, third = (_submit(slurm, "--gres=gpu:8", "--job-name=busy", "--output=/dev/null",
                                     "--wrap", "sleep 300") for _ in range(3))

    def states() -> dict[str, dict[str, str]] | None:
        jobs = {j: _job(slurm, j) for j in (first, second, third)}
        running = [j for j in (first, second) if jobs[j]["state"] == "RUNNING"]
        third_waits = jobs[third]["state"] == "PENDING" and jobs[third]["reason"] == "Resources"
        return jobs if len(running) == 2 and third_waits else None

    jobs = _wait("two jobs RUNNING and the third PENDING (Resources)", states)
    assert {j["name"] for j in jobs.values()} == {"busy"}
    assert {j["user"] for j in jobs.values()} == {"root"}


@pytest.mark.parametrize(("option", "refusal"), [
    ("--account=unknown", "Invalid account"),
    (f"--account={ACCOUNT} --qos=unknown", "Invalid qos"),
])
def test_an_unknown_account_or_qos_is_refused_by_test_only(slurm: Slurm, option: str, refusal: str) -> None:
    refused = _sbatch(slurm, "--test-only", "-p", "gpu", "--gres=gpu:8", *option.split(), "--wrap", "true")
    assert refused.returncode != 0 and refusal in refused.stderr, refused.stderr
    for allowed in (f"--account={ACCOUNT}", f"--account={ACCOUNT} --qos=normal", "--account=ml-infra"):
        ok = _sbatch(slurm, "--test-only", "-p", "gpu", "--gres=gpu:8", *allowed.split(), "--wrap", "true")
        assert ok.returncode == 0, f"{allowed}: {ok.stderr}"


def test_the_down_partition_shows_down_in_sinfo(slurm: Slurm) -> None:
    r = slurm.run("sinfo", "--noheader", "--format=%P %a", check=True)
    avail = dict(line.split() for line in r.stdout.splitlines())
    assert avail == {"gpu*": "up", "gpu-down": "down"}


def test_scancel_makes_a_running_job_leave_running_within_a_minute(slurm: Slurm) -> None:
    job = _submit(slurm, "--gres=gpu:8", "--output=/dev/null", "--wrap", "sleep 300")
    _wait(f"job {job} RUNNING", lambda: _job(slurm, job)["state"] == "RUNNING")
    t0 = time.monotonic()
    slurm.run("scancel", job, check=True)
    _wait(f"job {job} no longer RUNNING", lambda: _job(slurm, job)["state"] != "RUNNING", timeout=GONE_WITHIN_S)
    print(f"\nscancel -> not RUNNING in {time.monotonic() - t0:.1f}s ({_job(slurm, job)['state']})")
    _wait(f"job {job} out of the active queue", lambda: not slurm.active_jobs(), timeout=GONE_WITHIN_S)
    print(f"scancel -> squeue empty in {time.monotonic() - t0:.1f}s")


def _marked(value: str) -> list[int]:
    """The pids whose environment holds RL_VERIFY_JOB=<value>."""
    want = f"RL_VERIFY_JOB={value}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and want in (d / "environ").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_scancel_ends_the_processes_a_launched_job_detached_from_its_process_tree(slurm: Slurm, tmp_path: Path) -> None:
    """Ray's daemons leave the job's process tree; Slurm tracking processes by parentage (proctrack/linuxproc) does
    not signal them. A plain batch job's detached process outlives its scancel; the Slurm launcher's batch step ends
    every process carrying the job's marker when Slurm signals it."""
    from rl_verify.node import launcher as launchers

    detach = "( ( setsid sleep 300 </dev/null >/dev/null 2>&1 & ); sleep 300 )"
    plain = _submit(slurm, "--gres=gpu:8", "--output=/dev/null", "--export=ALL,RL_VERIFY_JOB=plain/grpo",
                    "--wrap", detach)
    _wait("the plain job's detached sleep", lambda: len(_marked("plain/grpo")) >= 2)
    slurm.run("scancel", plain, check=True)
    _wait(f"job {plain} out of the active queue", lambda: not slurm.active_jobs(), timeout=GONE_WITHIN_S)
    escaped = _marked("plain/grpo")
    for pid in escaped:
        os.kill(pid, 9)
    assert escaped, "expected the detached sleep to outlive a plain job's scancel"

    chosen = launchers.launcher_for(launchers.launcher_config(
        {"launcher": "slurm", "slurm_partition": "gpu", "slurm_account": ACCOUNT}))
    job_dir = tmp_path / "jobs" / "grpo"
    script = chosen.run(str(job_dir), detach, {"RL_VERIFY_JOB": "itest/grpo"}, "itest", "grpo", 8)
    out = subprocess.run(["bash", "-s"], input=script, env={**os.environ, **slurm.env}, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0 and "submitted" in out.stdout, out.stderr
    job = (job_dir / "slurm_job_id").read_text().strip()
    _wait("the launched job's detached sleep", lambda: len(_marked("itest/grpo")) >= 2)
    t0 = time.monotonic()
    slurm.run("scancel", job, check=True)
    _wait("no process of the launched job left", lambda: not _marked("itest/grpo"), timeout=GONE_WITHIN_S)
    print(f"\nscancel -> no process of the job in {time.monotonic() - t0:.1f}s")
    # Slurm's signal may reach the body before the batch step, which then records the body's death as exit code 143:
    # written here whether or not this run raced so, the job's state is still Slurm's end, named as outside.
    (job_dir / "exit_code").write_text("143\n")

    def status() -> str:
        return subprocess.run(["bash", "-s"], input=chosen.status(str(job_dir)), env={**os.environ, **slurm.env},
                              text=True, capture_output=True, timeout=60).stdout.strip()

    # While Slurm completes the job (KillWait) it is still running to rl-verify; then Slurm's end names it.
    said = _wait("Slurm's end of the job", lambda: (s := status()) != "running" and s, timeout=GONE_WITHIN_S)
    assert said == "ended CANCELLED outside"
    poll = subprocess.run(["bash", "-s"], input=chosen.log(str(job_dir), 0, 1024), env={**os.environ, **slurm.env},
                          text=True, capture_output=True, timeout=60)
    header = poll.stdout.partition("\n")[0].split()
    assert header[0] == "-" and header[4] == "ended:CANCELLED:outside", poll.stdout  # no exit code of the job's own
