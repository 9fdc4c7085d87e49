"""The node's GPUs as nvidia-smi shows them (issue 32): the real outputs captured on an NVIDIA H200
(tests/data/nvidia_smi/, SOURCE says where and when) parsed as the readiness check and cleanup parse them; the
node script's gpu_state (sh/lib_gpu.sh) over a stand-in nvidia-smi that replays them; the simulated node's
nvidia-smi answering in exactly their format. Issue 43: each process attributed (this run's, another rl-verify
run's live training, a leftover of an ended run, foreign), and another run's training never advised to be killed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_verify.node import gpu as node_gpu
from rl_verify.node import ops, remote
from rl_verify.suites.spec import NodeNeeds

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "nvidia_smi"
SIM_SMI = ROOT / "simulator" / "node_bin" / "nvidia-smi"
STAGES = ("idle", "foreign", "job", "after-cleanup")


def captured(stage: str, query: str) -> str:
    return (DATA / f"{stage}.query-{query}.csv").read_text()


def reading(stage: str, whose: str = "other", job: str = "-", job_state: str = "-") -> node_gpu.GpuReading:
    """The stage's capture as gpu_state would have printed it, every process ``whose``, carrying the job marker
    ``job`` of another rl-verify run whose job is ``job_state`` (CONSTRUCTED fields around the captured rows)."""
    lines = [f"GPUMEM\t{line}" for line in captured(stage, "gpu").splitlines()]
    lines += [f"GPUAPP\t{line}\tbob\t{whose}\tpython3 train.py\t{job}\t{job_state}"
              for line in captured(stage, "compute-apps").splitlines()]
    return node_gpu.gpu_reading(lines)


# ----------------------------------------------------------------------------- the captured H200 outputs
def test_the_captures_say_where_they_come_from():
    source = (DATA / "SOURCE").read_text()
    assert "NVIDIA H200" in source and "driver: 580.159.04" in source and re.search(r"date: 20\d\d-", source)


def test_an_idle_h200_reads_zero_mib_and_no_process():
    gpus, other = node_gpu.parse_gpu_query(captured("idle", "gpu"))
    assert other == [] and len(gpus) == 1
    (gpu,) = gpus
    assert gpu["name"] == "NVIDIA H200" and gpu["used_mib"] == 0 and gpu["total_mib"] == 143771
    assert gpu["uuid"].startswith("GPU-") and re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d", gpu["bus_id"])
    assert gpu["error"] is None
    assert node_gpu.parse_compute_apps(captured("idle", "compute-apps")) == ([], [])
    assert node_gpu.gpu_problems(reading("idle"), 1024) == []
    assert node_gpu.gpu_release_line(reading("idle")).startswith("GPUs free")


def test_a_foreign_cuda_process_makes_the_node_not_ready_naming_gpu_pid_user_command_memory_and_fix():
    apps, other = node_gpu.parse_compute_apps(captured("foreign", "compute-apps"))
    assert other == [] and len(apps) == 1 and apps[0]["used_mib"] > 4096  # 4 GiB asked + the CUDA context
    (problem,) = node_gpu.gpu_problems(reading("foreign"), 1024)
    pid, mib = apps[0]["pid"], apps[0]["used_mib"]
    assert problem.startswith("not ready: GPU 0 (")
    for words in (f"pid {pid} of user bob (python3 train.py)", f"holding {mib} MiB of 143771 MiB",
                  f"Fix: ask bob to stop it (a leftover of a crashed run: kill {pid})"):
        assert words in problem, problem
    # Its memory.used is the process's plus a few MiB of the driver: under the floor, not a second problem.
    (gpu,) = reading("foreign").gpus
    assert 0 <= gpu["used_mib"] - mib < 100


def test_the_runs_own_processes_during_a_job_are_not_a_problem_another_runs_are():
    apps, _ = node_gpu.parse_compute_apps(captured("job", "compute-apps"))
    assert len({a["pid"] for a in apps}) == 2  # the job's process and its detached grandchild
    assert node_gpu.gpu_problems(reading("job", "own"), 1024) == []
    theirs = node_gpu.gpu_problems(reading("job", "other"), 1024)
    assert len(theirs) == 2 and all(f"pid {a['pid']} " in p for a, p in zip(apps, theirs))
    assert node_gpu.gpu_release_line(reading("job", "own")).startswith(
        f"GPU memory still held by pid {apps[0]['pid']} ({apps[0]['used_mib']} MiB)")
    # Another run's or user's live processes are not this run's memory: named, not "held".
    assert node_gpu.gpu_release_line(reading("job", "other")).startswith(
        f"GPUs free of this run's processes; in use by others (the next run is refused while they run): "
        f"pid {apps[0]['pid']} ({apps[0]['used_mib']} MiB), on GPU 0: bob's python3 train.py")


#: The readiness script's whole output from another run's point of view while a run's job trains, beside a leftover
#: of a run whose job ended and a foreign process (scripts/gpu_node_check.py's stage another-run), captured on an H100
#: (SOURCE says how).
ANOTHER_RUN = sorted(DATA.glob("another-run*.prerequisites.out"))


@pytest.mark.parametrize("path", ANOTHER_RUN, ids=lambda p: p.name)
def test_the_readiness_while_another_run_trains_names_that_run_for_each_of_its_processes_and_never_says_kill(path):
    result = ops.parse_prerequisites(path.read_text())
    (busy,) = result.busy
    key = re.match(r"node busy: run (\S+), suite gpu, since ", busy).group(1)
    reading = result.readiness["gpu"]
    stage = path.name.removesuffix(".prerequisites.out")
    apps, _ = node_gpu.parse_compute_apps(captured(stage, "compute-apps"))
    assert sorted(a["pid"] for a in reading.apps) == sorted(a["pid"] for a in apps)  # the same moment
    kinds = [node_gpu.attribution(a) for a in reading.apps]
    assert sorted(kinds) == sorted([node_gpu.LIVE_RUN] * 2 + [node_gpu.ENDED_RUN, node_gpu.FOREIGN])
    problems = ops.readiness_problems(NodeNeeds(gpus=1), result.readiness)
    assert len(problems) == 4  # one line per process; the memory is theirs (nothing unexplained above the floor)
    for app in reading.apps:
        (line,) = [p for p in problems if f": pid {app['pid']} of user " in p]
        kind = node_gpu.attribution(app)
        if kind == node_gpu.LIVE_RUN:
            assert f"is in use by the live training of rl-verify run {key}, suite gpu: " in line
            assert "Fix: wait until that run's training ends" in line and "kill" not in line.lower()
        elif kind == node_gpu.ENDED_RUN:
            assert f"is in use by a leftover of rl-verify run {key}-ended, suite gpu, whose job has ended" in line
            assert f"Fix: stop it (kill {app['pid']})" in line
        else:
            assert "is in use by a process that is not this run's" in line and f"kill {app['pid']}" in line


def test_another_live_runs_processes_are_named_as_that_run_and_never_advised_to_be_killed():
    """issue 43: with another rl-verify run training, its GPU processes (its job marker, its job live) are that run's:
    named as the node busy line names it, to be waited for; no line advises `kill`."""
    apps, _ = node_gpu.parse_compute_apps(captured("job", "compute-apps"))
    r = reading("job", "other", "manual__2026-12-03-abc/grpo-r1", "live")
    assert [node_gpu.attribution(a) for a in r.apps] == [node_gpu.LIVE_RUN] * 2
    problems = node_gpu.gpu_problems(r, 1024)
    assert len(problems) == 2
    for app, problem in zip(apps, problems):
        assert problem.startswith("not ready: GPU 0 (00000000:00:06.0) is in use by the live training of rl-verify "
                                  f"run manual__2026-12-03-abc, suite grpo-r1: pid {app['pid']} of user bob "
                                  f"(python3 train.py), holding {app['used_mib']} MiB of 143771 MiB."), problem
        assert "Fix: wait until that run's training ends" in problem and "leave it running" in problem
        assert "kill" not in problem.lower() and "not this run's" not in problem


def test_a_leftover_of_a_run_whose_job_ended_is_named_as_that_run_and_its_kill_advised():
    """A process still carrying the marker of a job that has ended (exit_code written, or its group gone: a crashed
    run's detached worker) trains nothing: a leftover, stopped with today's advice, naming whose it was."""
    apps, _ = node_gpu.parse_compute_apps(captured("job", "compute-apps"))
    r = reading("job", "other", "scheduled__2026-12-01/opd", "ended")
    assert {node_gpu.attribution(a) for a in r.apps} == {node_gpu.ENDED_RUN}
    for app, problem in zip(apps, node_gpu.gpu_problems(r, 1024)):
        assert "is in use by a leftover of rl-verify run scheduled__2026-12-01, suite opd, whose job has ended: " \
               f"pid {app['pid']} of user bob" in problem
        assert f"Fix: stop it (kill {app['pid']}): its job is over and nothing of that run trains" in problem


def test_a_process_of_a_run_this_runs_folder_does_not_hold_is_named_and_stopped_only_once_it_has_ended():
    """A job marker whose job folder is not under this deployment's runs root (another deployment on the node, or a
    run whose folder was reaped): the node cannot say whether it trains, so the kill is conditional."""
    r = reading("foreign", "other", "k-elsewhere/grpo", "unknown")
    (app,) = r.apps
    assert node_gpu.attribution(app) == node_gpu.UNKNOWN_RUN
    (problem,) = node_gpu.gpu_problems(r, 1024)
    assert "a process of rl-verify run k-elsewhere, suite grpo, not a job of this deployment's runs folder" in problem
    assert "whether that run still trains" in problem and f"only once it has ended, stop it (kill {app['pid']})" \
        in problem


def test_a_process_without_a_job_marker_keeps_todays_message():
    for r in (reading("foreign"), reading("foreign", "other", "-", "-")):
        (app,) = r.apps
        assert node_gpu.attribution(app) == node_gpu.FOREIGN and app["job"] is None and app["job_state"] is None
        (problem,) = node_gpu.gpu_problems(r, 1024)
        assert "is in use by a process that is not this run's: " in problem and f"kill {app['pid']}" in problem


def test_cleanup_names_another_live_runs_processes_as_its_training_and_a_leftover_as_that_runs():
    apps, _ = node_gpu.parse_compute_apps(captured("job", "compute-apps"))
    live = node_gpu.gpu_release_line(reading("job", "other", "k-2/grpo", "live"))
    assert live.startswith(f"GPUs free of this run's processes; in use by others (the next run is refused while they "
                           f"run): pid {apps[0]['pid']} ({apps[0]['used_mib']} MiB), on GPU 0: the live training of "
                           "rl-verify run k-2, suite grpo;")
    ended = node_gpu.gpu_release_line(reading("job", "other", "k-2/grpo", "ended"))
    assert "bob's python3 train.py (a leftover of rl-verify run k-2, suite grpo, whose job has ended)" in ended


def test_after_cleanup_the_gpus_are_free():
    assert node_gpu.parse_compute_apps(captured("after-cleanup", "compute-apps")) == ([], [])
    line = node_gpu.gpu_release_line(reading("after-cleanup"))
    assert line.startswith("GPUs free: no compute process on the node's 1 GPU(s)")


def test_a_pid_the_driver_lists_that_is_no_process_here_holds_memory_until_reset():
    r = reading("foreign", "gone")
    (problem,) = node_gpu.gpu_problems(r, 1024)
    assert "no process of the node now" in problem and "nvidia-smi --gpu-reset -i 0" in problem
    held = node_gpu.gpu_release_line(r)
    pid = r.apps[0]["pid"]
    assert held.startswith(f"GPU memory still held by pid {pid} ({r.apps[0]['used_mib']} MiB), on GPU 0")
    assert "Fix:" in held


def test_memory_above_the_floor_that_no_process_explains_is_not_ready_below_it_is():
    line = captured("idle", "gpu").strip().replace(", 0, 143771", ", 21504, 143771")
    r = node_gpu.gpu_reading([f"GPUMEM\t{line}"])
    (problem,) = node_gpu.gpu_problems(r, 1024)
    assert "21504 MiB of 143771 MiB in use that no compute process" in problem and "1024 MiB floor" in problem
    assert node_gpu.gpu_problems(r, 30000) == []
    assert node_gpu.gpu_release_line(r, 1024).startswith("GPU memory still held by 21504 MiB on GPU 0")


def test_nvidia_smi_failing_or_a_gpu_in_an_error_state_is_not_ready_quoting_it():
    lost = "Unable to determine the device handle for GPU00000000:18:00.0: Unknown Error"
    r = node_gpu.gpu_reading([f"GPUERR\tgpu\t15\t{lost}"])
    (problem,) = node_gpu.gpu_problems(r, 1024)
    assert problem.startswith("not ready: nvidia-smi --query-gpu failed (exit 15): ") and lost in problem
    line = node_gpu.gpu_release_line(r)
    assert line.startswith("GPUs not read after the stop") and lost in line
    reset = captured("idle", "gpu").strip().replace(", 0, 143771", ", [GPU requires reset], 143771")
    (problem,) = node_gpu.gpu_problems(node_gpu.gpu_reading([f"GPUMEM\t{reset}"]), 1024)
    assert "is in an error state: nvidia-smi reports memory.used '[GPU requires reset]'" in problem
    assert "nvidia-smi --gpu-reset -i 0" in problem


def test_the_gpu_problems_are_readiness_problems_only_when_the_launch_needs_gpus():
    out = "GPUS\t1\t<unset>\nGPUMEM\t" + captured("foreign", "gpu") + "GPUAPP\t" + \
        captured("foreign", "compute-apps").strip() + "\tbob\tother\tpython3 x.py\n"
    seen = ops.parse_prerequisites(out).readiness
    assert len(ops.readiness_problems(NodeNeeds(gpus=1), seen)) == 1
    assert ops.readiness_problems(NodeNeeds(), seen) == []


# ----------------------------------------------------------------------------- sh/lib_gpu.sh's gpu_state
@pytest.fixture()
def replayed_smi(tmp_path):
    """A stand-in nvidia-smi on the PATH replaying the job capture, its two pids replaced by live processes:
    one with this run's marker (own), one without (other); and a third line for a pid that does not exist."""
    own = subprocess.Popen(["sleep", "60"], env={**os.environ, "RL_VERIFY_RUN": "k-1"})
    other = subprocess.Popen(["sleep", "61"], env={k: v for k, v in os.environ.items() if k != "RL_VERIFY_RUN"})
    apps = captured("job", "compute-apps").splitlines()
    lines = [re.sub(r", \d+, ", f", {pid}, ", line, count=1) for line, pid in zip(apps, (own.pid, other.pid))]
    lines.append(re.sub(r", \d+, ", ", 4194303, ", apps[0], count=1))  # above any pid_max: gone
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "gpu.csv").write_text(captured("job", "gpu"))
    (tmp_path / "apps.csv").write_text("\n".join(lines) + "\n")
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/bash\ncase \"$1\" in --query-gpu=*) cat {tmp_path}/gpu.csv;; "
                   f"--query-compute-apps=*) cat {tmp_path}/apps.csv;; esac\n")
    smi.chmod(0o755)
    try:
        yield {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, own.pid, other.pid
    finally:
        own.kill()
        other.kill()
        own.wait()
        other.wait()


def test_gpu_state_marks_the_runs_own_processes_by_their_marker(replayed_smi):
    env, own, other = replayed_smi
    script = remote.prerequisites_script([], "/nonexistent/runs", "k-1", needs=NodeNeeds(gpus=1))
    out = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, env={**os.environ, **env},
                         timeout=60).stdout
    r = ops.parse_prerequisites(out).readiness["gpu"]
    whose = {a["pid"]: a["whose"] for a in r.apps}
    assert whose == {own: "own", other: "other", 4194303: "gone"}
    (gpu,) = r.gpus
    assert gpu["used_mib"] == int(captured("job", "gpu").split(", ")[4])
    problems = node_gpu.gpu_problems(r, 1024)
    assert len(problems) == 2 and f"pid {other} of user" in problems[0] and "pid 4194303 (" in problems[1]


def test_a_zombie_the_driver_still_lists_is_gone_not_another_users_process(replayed_smi, tmp_path):
    """An exited job not yet reaped by its parent (state Z: no environment, no command line) is the run's memory
    the driver keeps, not another user's live process (CI saw cleanup call such a pid 'in use by others')."""
    env, own, _ = replayed_smi
    zombie = subprocess.Popen(["true"], env={**os.environ, "RL_VERIFY_RUN": "k-1"})
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":  # exited, not reaped
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        apps = tmp_path / "apps.csv"
        apps.write_text(re.sub(r", \d+, ", f", {zombie.pid}, ", apps.read_text().splitlines()[0], count=1) + "\n")
        script = remote.prerequisites_script([], "/nonexistent/runs", "k-1", needs=NodeNeeds(gpus=1))
        out = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, env={**os.environ, **env},
                             timeout=60).stdout
        r = ops.parse_prerequisites(out).readiness["gpu"]
        assert {a["pid"]: a["whose"] for a in r.apps} == {zombie.pid: "gone"}
    finally:
        zombie.wait()


def _marked(variable: str, value: str, timeout: float = 30) -> int:
    """The pid of the one process whose environment holds ``variable=value`` (a job's child, once it has started)."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and f"{variable}={value}".encode() in \
                        (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
        if len(found) == 1:
            return found[0]
        assert time.monotonic() < deadline, f"{len(found)} processes carry {variable}={value}"
        time.sleep(0.05)


@pytest.fixture()
def two_runs(tmp_path):
    """A runs folder as rl-verify leaves it on a node, every process real, each on the GPU through a stand-in
    nvidia-smi replaying the job capture's rows: run-a's job live (submitted by the job_submit script, its markers
    exported as for a training), run-c's job ended (exit_code written) with a detached child in its own session
    left over, a process carrying the marker of run-x that has no folder here, one with a marker of another shape,
    one with no marker, and one of this run."""
    runs = tmp_path / "runs"
    started: list[subprocess.Popen] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("RL_VERIFY")}

    def submit(key: str, job: str, command: str) -> Path:
        job_dir = runs / key / "jobs" / job
        env = remote.job_environment({}, str(runs / key / "work" / job), key, job, {})
        done = subprocess.run(["bash", "-s"], input=remote.submit_job_script(str(job_dir), command, env), text=True,
                              capture_output=True, timeout=30, env=base)
        assert done.returncode == 0, done.stderr
        return job_dir

    def start(**env: str) -> int:
        started.append(subprocess.Popen(["sleep", "60"], env={**base, **env}, start_new_session=True))
        return started[-1].pid

    live_dir = submit("run-a", "grpo-r1", "exec sleep 60")
    ended_dir = submit("run-c", "opd", "( setsid sleep 60 </dev/null >/dev/null 2>&1 & )")
    pids = {"live": _marked("RL_VERIFY_JOB", "run-a/grpo-r1"), "ended": _marked("RL_VERIFY_JOB", "run-c/opd"),
            "unknown": start(RL_VERIFY_RUN="run-x", RL_VERIFY_JOB="run-x/grpo"),
            "odd": start(RL_VERIFY_JOB="../../etc/jobs/x"), "foreign": start(),
            "own": start(RL_VERIFY_RUN="this-run", RL_VERIFY_JOB="this-run/grpo")}
    deadline = time.monotonic() + 30
    while not (ended_dir / "exit_code").exists():
        assert time.monotonic() < deadline, "the ended job never wrote its exit_code"
        time.sleep(0.05)
    row = captured("job", "compute-apps").splitlines()[0]
    (tmp_path / "gpu.csv").write_text(captured("job", "gpu"))
    (tmp_path / "apps.csv").write_text("".join(re.sub(r", \d+, ", f", {pid}, ", row, count=1) + "\n"
                                               for pid in pids.values()))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/bash\ncase \"$1\" in --query-gpu=*) cat {tmp_path}/gpu.csv;; "
                                        f"--query-compute-apps=*) cat {tmp_path}/apps.csv;; -L) echo 'GPU 0: "
                                        "NVIDIA H200 (UUID: GPU-300ab8ad-fab9-d9b0-6514-688b2a591f33)';; esac\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    try:
        yield {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, runs, pids, live_dir, tmp_path / "apps.csv"
    finally:
        for pid in (pids["live"], pids["ended"]):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for proc in started:
            proc.kill()
            proc.wait()


def test_gpu_state_attributes_each_process_by_the_job_marker_it_carries_and_that_jobs_folder(two_runs):
    env, runs, pids, live_dir, _ = two_runs
    out = subprocess.run(["bash", "-s"], input=remote.prerequisites_script([], str(runs), "this-run",
                                                                            needs=NodeNeeds(gpus=1)),
                         capture_output=True, text=True, env=env, timeout=60).stdout
    result = ops.parse_prerequisites(out)
    by_pid = {a["pid"]: a for a in result.readiness["gpu"].apps}
    assert {name: (by_pid[pid]["job"], by_pid[pid]["job_state"], node_gpu.attribution(by_pid[pid]))
            for name, pid in pids.items()} == {
        "live": ("run-a/grpo-r1", "live", node_gpu.LIVE_RUN), "ended": ("run-c/opd", "ended", node_gpu.ENDED_RUN),
        "unknown": ("run-x/grpo", "unknown", node_gpu.UNKNOWN_RUN), "odd": (None, None, node_gpu.FOREIGN),
        "foreign": (None, None, node_gpu.FOREIGN), "own": (None, None, node_gpu.OWN)}
    # The busy line and the GPU line name the same run and job.
    (busy,) = result.busy
    assert busy.startswith("node busy: run run-a, suite grpo-r1, since ")
    problems = ops.readiness_problems(NodeNeeds(gpus=1), result.readiness)
    assert len(problems) == 5
    (live,) = [p for p in problems if f"pid {pids['live']} " in p]
    assert "the live training of rl-verify run run-a, suite grpo-r1" in live and "kill" not in live
    (ended,) = [p for p in problems if f"pid {pids['ended']} " in p]
    assert "a leftover of rl-verify run run-c, suite opd" in ended and f"kill {pids['ended']})" in ended
    # Once that job has ended, what it left on the GPU is a leftover too.
    (live_dir / "exit_code").write_text("0\n")
    out = subprocess.run(["bash", "-s"], input=remote.prerequisites_script([], str(runs), "this-run",
                                                                            needs=NodeNeeds(gpus=1)),
                         capture_output=True, text=True, env=env, timeout=60).stdout
    result = ops.parse_prerequisites(out)
    assert result.busy == []
    assert {a["pid"]: a["job_state"] for a in result.readiness["gpu"].apps}[pids["live"]] == "ended"


def test_cleanup_names_the_other_runs_it_leaves_on_the_gpus(two_runs):
    env, runs, pids, _, apps = two_runs
    (runs / "this-run").mkdir()
    # This run's own process gone from the GPUs, as after a stop that released its memory.
    apps.write_text("".join(line + "\n" for line in apps.read_text().splitlines() if f", {pids['own']}, " not in line))
    out = subprocess.run(["bash", "-s"], input=remote.cleanup_script(str(runs / "this-run"), "this-run", gpu_wait_s=0),
                         capture_output=True, text=True, env=env, timeout=60).stdout
    reading = node_gpu.gpu_reading(out.splitlines())
    assert {a["pid"]: node_gpu.attribution(a) for a in reading.apps}[pids["live"]] == node_gpu.LIVE_RUN
    line = node_gpu.gpu_release_line(reading)
    assert line.startswith("GPUs free of this run's processes")
    assert f"pid {pids['live']} (4614 MiB), on GPU 0: the live training of rl-verify run run-a, suite grpo-r1" in line
    assert "(a leftover of rl-verify run run-c, suite opd, whose job has ended)" in line


def test_cleanup_waits_boundedly_for_the_gpus_and_says_who_still_holds_memory(replayed_smi, tmp_path):
    env, own, other = replayed_smi
    run_dir = tmp_path / "runs" / "k-1"
    run_dir.mkdir(parents=True)
    out = subprocess.run(["bash", "-s"], input=remote.cleanup_script(str(run_dir), "k-1", gpu_wait_s=1),
                         capture_output=True, text=True, env={**os.environ, **env}, timeout=60).stdout
    lines = out.splitlines()
    (wait,) = [line for line in lines if line.startswith("GPUWAIT\t")]
    waited_ms, before = wait.split("\t")[1:]
    assert str(own) in before.split()  # the run's process on the GPU, seen before the stop
    # The own sleep was TERMed by its marker; the stand-in still lists the gone pid: the bound is waited.
    assert 1000 <= int(waited_ms) < 10000
    said = node_gpu.gpu_release_line(node_gpu.gpu_reading(lines))
    assert said.startswith(f"GPU memory still held by pid {own} (") and "pid 4194303 (" in said


# ----------------------------------------------------------------------------- the simulated node's nvidia-smi
def _shape(line: str) -> str:
    """A line's format: digits, hex runs and words made generic; separators kept."""
    line = re.sub(r"GPU-[0-9a-f-]{36}", "UUID", line)
    line = re.sub(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d", "BUS", line)
    line = re.sub(r"NVIDIA H200( \(SIMULATED\))?", "NAME", line)
    line = re.sub(r"/[^,]*|python3?", "PROC", line)
    return re.sub(r"\d+", "N", line)


def test_the_simulated_nvidia_smi_answers_in_the_captured_format(tmp_path):
    root = tmp_path / "node"
    (root / "bin").mkdir(parents=True)
    smi = root / "bin" / "nvidia-smi"
    smi.write_text(SIM_SMI.read_text())
    (root / "sim.json").write_text('{"gpus": 8}')
    gpu_q = ["--query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total", "--format=csv,noheader,nounits"]
    app_q = ["--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits"]

    def ask(args):
        done = subprocess.run([sys.executable, str(smi), *args], capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout

    rc, out = ask(gpu_q)
    assert rc == 0 and len(out.splitlines()) == 8
    assert {_shape(line) for line in out.splitlines()} == {_shape(captured("idle", "gpu").strip())}
    assert ask(app_q) == (0, "")  # idle: nothing, as the H200 printed
    (root / "faults.json").write_text('{"node": {"gpu-foreign": {"gpu": 2, "mib": 21504}}}')
    foreign = subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 60',
                                f"python3 x.py --rlsim-gpu-foreign --rlsim-node={root}"])
    try:
        deadline = __import__("time").monotonic() + 10
        while b"--rlsim-gpu-foreign" not in Path(f"/proc/{foreign.pid}/cmdline").read_bytes():
            assert __import__("time").monotonic() < deadline
        rc, out = ask(app_q)
        (line,) = out.splitlines()
        assert _shape(line) == _shape(captured("foreign", "compute-apps").strip())
        (app,), _ = node_gpu.parse_compute_apps(out)
        assert app["pid"] == foreign.pid and app["used_mib"] == 21504
        gpus, _ = node_gpu.parse_gpu_query(ask(gpu_q)[1])
        assert gpus[2]["used_mib"] == 21504 and app["uuid"] == gpus[2]["uuid"]
    finally:
        foreign.kill()
        foreign.wait()
    (root / "faults.json").write_text('{"node": {"gpu-error": {"gpu": 0}}}')
    rc, out = ask(gpu_q)
    assert rc == 15 and out.splitlines()[0] == "Unable to determine the device handle for GPU00000000:18:00.0: " \
                                               "Unknown Error"
    assert len(node_gpu.parse_gpu_query(out)[0]) == 7


# ----------------------------------------------------------------------------- what people are told
def test_the_verdict_and_the_infrastructure_messages_state_the_gpus_after_cleanup():
    from rl_verify.orchestration import notify

    held = node_gpu.gpu_release_line(reading("foreign", "gone"))
    summary = {"verdict": "PASS", "suites": [{"suite": "grpo", "verdict": "PASS"}], "gpus": [held]}
    _, body = notify.verdict(summary, "main (abc)", "manual__1", None)
    assert f"Node after cleanup: {held}" in body
    _, body = notify.infrastructure(["run_grpo"], "main", "manual__1", ["TERM group 5", held], True)
    assert f"GPUs: {held}" in body
