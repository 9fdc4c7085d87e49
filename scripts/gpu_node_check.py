"""The package's rendered node scripts against real GPUs and a real CUDA process (run by gpu_node_check.sh).

On a machine with NVIDIA GPUs, nvidia-smi and PyTorch: no Airflow, no SSH. The scripts are rendered by
``rl_verify.node.remote`` and run with ``bash -s`` on their stdin, as the DAG sends them over SSH, and their output
is read by ``rl_verify.node.ops``. The checks, one line each (PASS or FAIL):

1. readiness while idle: ready; and the environment the same script reads (GPU, count, driver, CUDA, the
   interpreter's torch) equal to what nvidia-smi and torch say (issue 33's fingerprint);
2. readiness with a foreign CUDA process (no run marker): not ready, naming its pid and memory;
3. a job submitted (a CUDA process, and a detached grandchild in its own session holding GPU memory too, as Ray
   workers do): seen running, its processes on the GPUs carry the run marker, the run's own check does not count
   its own processes;
4. another run's check while that job trains, beside a leftover of a third run whose job has ended (its detached
   CUDA process still holding memory) and a foreign CUDA process: the node busy with the training run, each of its
   GPU processes named as that run's live training with no advice to kill it, the leftover named as the ended
   run's with its kill, the foreign process as before; the ended run's own cleanup then stops its leftover;
5. cleanup: the job's processes stopped, no GPU memory of the run held ("GPUs free"), how long it took;
6. readiness again: ready.

``--capture DIR`` writes the raw outputs of the nvidia-smi queries the checks parse at each stage (idle, foreign,
job, another-run, after-cleanup) into DIR, and the readiness script's whole output at another-run (the other
run's point of view: ``another-run.prerequisites.out``), with a SOURCE file (GPU, driver, date):
tests/data/nvidia_smi/ holds the H200's, and an another-run stage constructed on a CPU machine under a stand-in
nvidia-smi (its SOURCE says how; no GPU was lent for it).
Only the pure modules of the package are imported (PYTHONPATH=include).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from rl_verify.core import bitwise
from rl_verify.node import gpu as node_gpu
from rl_verify.node import ops, remote
from rl_verify.suites.spec import LANE_PACKAGES, NodeNeeds

GPU_QUERY = ("gpu", "index,uuid,name,pci.bus_id,memory.used,memory.total")
APP_QUERY = ("compute-apps", "gpu_uuid,pid,used_memory,process_name")

# A CUDA process holding GiB of GPU memory until it is killed: prints "held" once the memory is taken.
HOLD = ("import sys, time, torch\n"
        "x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n")


def bash(script: str, timeout: float = 300) -> tuple[int, str, str]:
    done = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def smi(kind: str, fields: str) -> tuple[int, str]:
    done = subprocess.run(["nvidia-smi", f"--query-{kind}={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def apps() -> list[dict[str, Any]]:
    return node_gpu.parse_compute_apps(smi(*APP_QUERY)[1])[0]


def running(pid: int) -> bool:
    """A process numbered ``pid`` that is not a zombie (an exited child nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


class Checker:
    def __init__(self, capture: Path | None) -> None:
        self.capture = capture
        self.failed = 0
        self.tmp = Path(tempfile.mkdtemp(prefix="rl-verify-gpucheck-"))
        self.runs = str(self.tmp / "runs")
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
        self.gpus = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
        self.needs = NodeNeeds(gpus=self.gpus)
        self.started: list[subprocess.Popen] = []

    def line(self, ok: bool, check: str, detail: str) -> None:
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {check}: {detail}", flush=True)

    def save(self, stage: str) -> None:
        if not self.capture:
            return
        for kind, fields in (GPU_QUERY, APP_QUERY):
            status, out = smi(kind, fields)
            (self.capture / f"{stage}.query-{kind}.csv").write_text(out)
            if status:
                (self.capture / f"{stage}.query-{kind}.exit").write_text(f"{status}\n")

    def prerequisites(self, key: str, keep: str | None = None) -> ops.Prerequisites:
        """The readiness of run ``key`` as check_prerequisites reads it; ``keep``: a stage whose capture includes
        the script's whole output (``<stage>.prerequisites.out``)."""
        status, out, err = bash(remote.prerequisites_script([], self.runs, key, needs=self.needs))
        if status:
            raise RuntimeError(f"prerequisites exit {status}: {err}")
        if keep and self.capture:
            (self.capture / f"{keep}.prerequisites.out").write_text(out)
        result = ops.parse_prerequisites(out)
        result.unready = ops.readiness_problems(self.needs, result.readiness, "this user")
        return result

    def environment(self, key: str) -> dict[str, Any]:
        """The environment as the node script reads it, with this interpreter as the launch interpreter."""
        script = remote.prerequisites_script([], self.runs, key, needs=NodeNeeds(python=Path(sys.executable).name),
                                             env_packages=list(LANE_PACKAGES))
        status, out, err = bash(f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH\n" + script)
        if status:
            raise RuntimeError(f"prerequisites exit {status}: {err}")
        return ops.parse_prerequisites(out).environment

    def hold(self, gib: float, env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(gib)], stdout=subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def summary(reading: node_gpu.GpuReading | None) -> str:
    if reading is None:
        return "no GPU reading"
    used = ", ".join(f"GPU {g['index']} {g['used_mib']}/{g['total_mib']} MiB" for g in reading.gpus)
    return f"{len(reading.apps)} compute process(es); memory.used {used}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capture", type=Path, help="write the raw nvidia-smi outputs of each stage here")
    parser.add_argument("--job-gib", type=float, default=7.0, help="GPU memory of the job's CUDA process")
    parser.add_argument("--foreign-gib", type=float, default=4.0, help="GPU memory of the foreign process")
    parser.add_argument("--leftover-gib", type=float, default=2.0,
                        help="GPU memory of the ended run's leftover and of the foreign process beside the job")
    args = parser.parse_args(argv)
    if args.capture:
        args.capture.mkdir(parents=True, exist_ok=True)
    c = Checker(args.capture)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    key = f"gpucheck-{stamp}"
    driver = smi("gpu", "driver_version")[1].splitlines()[0].strip()
    names = smi("gpu", "name")[1].splitlines()
    print(f"# {c.gpus} GPU(s): {', '.join(sorted(set(n.strip() for n in names)))}; driver {driver}; "
          f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}", flush=True)
    if c.capture:
        (c.capture / "SOURCE").write_text(
            f"GPU: {c.gpus}x {', '.join(sorted(set(n.strip() for n in names)))}\ndriver: {driver}\n"
            f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n"
            f"kernel: {os.uname().release}\n"
            f"queries: nvidia-smi --query-{GPU_QUERY[0]}={GPU_QUERY[1]} --format=csv,noheader,nounits; "
            f"nvidia-smi --query-{APP_QUERY[0]}={APP_QUERY[1]} --format=csv,noheader,nounits\n"
            "written by: scripts/gpu_node_check.sh --capture\n")
    try:
        # 1. idle
        r = c.prerequisites(key)
        c.save("idle")
        c.line(not r.problems() and not r.busy, "readiness idle",
               "ready; " + summary(r.readiness.get("gpu")) if not r.problems() else "; ".join(r.problems()))

        # 1b. the environment (issue 33's fingerprint), read by the same script from this machine's nvidia-smi
        # and this interpreter's packages, against what nvidia-smi and torch themselves say.
        env = c.environment(key)
        import torch

        cuda_header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
        expected = {"gpu": names[0].strip(), "gpu_count": c.gpus, "driver": driver,
                    "cuda": (cuda_header.split("CUDA Version:")[1].split()[0] if "CUDA Version:" in cuda_header
                             else None)}
        wrong = {k: (env.get(k), v) for k, v in expected.items() if env.get(k) != v}
        torch_ok = (env.get("packages") or {}).get("torch") == torch.__version__
        c.line(not wrong and torch_ok, "environment",
               f"{json.dumps(env, sort_keys=True)} (fingerprint {bitwise.fingerprint(env)})"
               + (f"; differs from nvidia-smi: {wrong}" if wrong else "")
               + ("" if torch_ok else f"; torch {torch.__version__} not seen"))
        if c.capture:
            (c.capture / "environment.json").write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")

        # 2. a foreign CUDA process
        foreign = c.hold(args.foreign_gib, env={k: v for k, v in os.environ.items() if not k.startswith("RL_VERIFY")})
        wait_for("the foreign process holding its memory", lambda: any(
            a["pid"] == foreign.pid and (a["used_mib"] or 0) >= args.foreign_gib * 1024 for a in apps()))
        r = c.prerequisites(key)
        c.save("foreign")
        named = [p for p in r.unready if f"pid {foreign.pid}" in p and " MiB" in p and "Fix:" in p]
        c.line(bool(named) and len(r.unready) == 1, "readiness with a foreign CUDA process",
               "not ready: " + (named[0].removeprefix("not ready: ") if named else "; ".join(r.problems()) or "ready"))
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait()
        t0 = time.monotonic()
        wait_for("the foreign process's memory released", lambda: not apps())
        c.line(True, "foreign process killed", f"its GPU memory released after {time.monotonic() - t0:.1f} s")

        # 3. a job of the run, with a detached grandchild in its own session (as Ray workers are)
        layout = remote.RunLayout(f"{c.runs}/{key}")
        job_dir = layout.job_dir("gpu")
        env = remote.job_environment({}, layout.work_dir("gpu"), key, "gpu", {})
        q = remote.shlex.quote
        hold = f"{q(sys.executable)} -c {q(HOLD)}"
        command = f"( setsid {hold} {args.foreign_gib:g} </dev/null >/dev/null 2>&1 & {hold} {args.job_gib:g} )"
        status, out, err = bash(remote.submit_job_script(job_dir, command, env))
        if status:
            raise RuntimeError(f"job_submit exit {status}: {err}")
        state = bash(remote.job_state_script(job_dir))[1].strip()
        want = (args.job_gib + args.foreign_gib) * 1024
        on_gpu = wait_for("the job's two CUDA processes holding their memory",
                          lambda: (lambda a: len(a) >= 2 and sum(x["used_mib"] or 0 for x in a) >= want and a)(apps()))
        c.save("job")
        pids = sorted({a["pid"] for a in on_gpu})
        held = sum(a["used_mib"] or 0 for a in on_gpu)
        c.line(state == "running", "job submitted", f"job_state {state}; CUDA processes {pids} hold {held} MiB")
        mine = c.prerequisites(key)
        c.line(not mine.unready, "the run's own readiness during the job",
               "its own GPU processes not counted" if not mine.unready else "; ".join(mine.unready))

        # 4. another run's readiness while the job trains; beside it a leftover of a third run (its job ended, its
        # detached CUDA process lives on with the job's markers) and a foreign CUDA process (no marker)
        ended_key = f"{key}-ended"
        ended = remote.RunLayout(f"{c.runs}/{ended_key}")
        ended_env = remote.job_environment({}, ended.work_dir("gpu"), ended_key, "gpu", {})
        status, out, err = bash(remote.submit_job_script(
            ended.job_dir("gpu"), f"( setsid {hold} {args.leftover_gib:g} </dev/null >/dev/null 2>&1 & )", ended_env))
        if status:
            raise RuntimeError(f"job_submit exit {status}: {err}")
        foreign = c.hold(args.leftover_gib, env={k: v for k, v in os.environ.items() if not k.startswith("RL_VERIFY")})
        extra = wait_for("the leftover and the foreign process holding their memory", lambda: (
            lambda a: len(a) == 2 and all((x["used_mib"] or 0) >= args.leftover_gib * 1024 for x in a) and a)(
            [x for x in apps() if x["pid"] not in pids]))
        wait_for("the ended job's exit_code", lambda: Path(ended.job_dir("gpu"), "exit_code").exists(), 30)
        leftover = next(x["pid"] for x in extra if x["pid"] != foreign.pid)
        other_key = f"{key}-other"
        theirs = c.prerequisites(other_key, keep="another-run")
        c.save("another-run")
        live = [p for p in theirs.unready if f"the live training of rl-verify run {key}, suite gpu:" in p]
        left = [p for p in theirs.unready if f"a leftover of rl-verify run {ended_key}, suite gpu" in p]
        alien = [p for p in theirs.unready if "a process that is not this run's" in p]
        c.line(bool(theirs.busy) and f"run {key}, suite gpu" in theirs.busy[0] and len(theirs.busy) == 1
               and len(live) == len(pids) and all(any(f"pid {p} " in line for line in live) for p in pids)
               and not any("kill" in line for line in live)
               and len(left) == 1 and f"kill {leftover}" in left[0]
               and len(alien) == 1 and f"pid {foreign.pid} " in alien[0] and f"kill {foreign.pid}" in alien[0]
               and len(theirs.unready) == len(pids) + 2,
               "another run's readiness during the job",
               " | ".join(theirs.busy + theirs.unready))
        status, out, err = bash(remote.cleanup_script(ended.run_dir, ended_key, gpu_wait_s=30), timeout=120)
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait()
        wait_for("the leftover's and the foreign process's memory released",
                 lambda: not [x for x in apps() if x["pid"] not in pids], 60)
        said = [line for line in out.splitlines() if not line.startswith(node_gpu.GPU_TAGS)]
        c.line(status == 0 and not running(leftover), "the ended run's cleanup stops its leftover",
               "; ".join(said + [node_gpu.gpu_release_line(node_gpu.gpu_reading(out.splitlines()))]))

        # 5. cleanup
        t0 = time.monotonic()
        status, out, err = bash(remote.cleanup_script(layout.run_dir, key, gpu_wait_s=60), timeout=300)
        took = time.monotonic() - t0
        lines = [line for line in (out + err).splitlines() if line.strip()]
        gpu = [line for line in lines if line.startswith(node_gpu.GPU_TAGS)]
        reading = node_gpu.gpu_reading(gpu)
        said = node_gpu.gpu_release_line(reading)
        c.save("after-cleanup")
        alive = [p for p in pids if running(p)]
        actions = "; ".join(line for line in lines if not line.startswith(node_gpu.GPU_TAGS))
        c.line(status == 0 and said.startswith(node_gpu.GPUS_FREE) and not alive, "cleanup",
               f"{said}; cleanup took {took:.1f} s ({actions})")

        # 6. idle again
        r = c.prerequisites(f"{key}-after")
        c.line(not r.problems(), "readiness after cleanup",
               "ready; " + summary(r.readiness.get("gpu")) if not r.problems() else "; ".join(r.problems()))
    except Exception as err:  # one line, like the checks
        c.line(False, "check aborted", f"{type(err).__name__}: {err}")
        bash(remote.cleanup_script(f"{c.runs}/{key}", key, gpu_wait_s=0))  # a submitted job is stopped
    finally:
        c.stop_all()
    print(f"# {'all checks passed' if not c.failed else f'{c.failed} check(s) FAILED'}", flush=True)
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
