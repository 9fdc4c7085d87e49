"""The SIMULATED node's readiness traps (xtuner-contract.md, "More of the GRPO script's behaviour"),
each pinned over real SSH: the hard open-files limit against `ulimit -n 65536` under `set -e`, the
endless GPU-count wait (a hidden GPU, a GPU lost at launch), the fixed Ray ports and the shared
/tmp/ray_log, another user's Ray on those ports, and `python` missing from the PATH.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sim_ssh import REPO, Node, pinned_client, simnode

from rl_verify.settings import RUN_MARKER_ENV
from rl_verify.engines import load_suite

pytestmark = pytest.mark.integration

WAIT_LINE = re.compile(r"^Waiting for GPU count to be 8, current: (\d+)$", re.M)
ULIMIT_ERROR = "ulimit: open files: cannot modify limit: Operation not permitted"
EXP_RE = re.compile(r"^\d{14}$")


# ------------------------------------------------------------------------------------------------
# helpers
def grpo_launch(node: Node, name: str) -> tuple[str, dict[str, str], Path]:
    """The GRPO launch as its spec declares it, in a fresh worktree, output in WORK_DIR/launch.out.

    Marked with the run marker like every rl-verify launch (the node's checks tell it from a launch by hand).
    """
    name = f"{name}-{uuid.uuid4().hex[:6]}"
    wt = node.worktree("main", name)
    work_dir = node.state / "runs" / name
    node.run(f"mkdir -p {shlex.quote(str(work_dir))}")
    spec = load_suite("grpo").expanded({**node.share_env(), "CHECKOUT": wt})
    cmd = (f"cd {shlex.quote(wt)} && bash -x {shlex.quote(spec.script)} "
           f"{' '.join(shlex.quote(a) for a in spec.args)} > {shlex.quote(str(work_dir))}/launch.out 2>&1")
    env = {**node.share_env(), **spec.env, "WORK_DIR": str(work_dir), RUN_MARKER_ENV: f"it-{name}"}
    return cmd, env, work_dir


def run_grpo(node: Node, name: str) -> tuple[int, Path]:
    cmd, env, work_dir = grpo_launch(node, name)
    rc, _, _ = node.run(cmd, env=env, timeout=600)
    return rc, work_dir


def start_grpo_detached(node: Node, name: str) -> tuple[int, Path]:
    """Start the launch in its own process group; return (pgid, WORK_DIR)."""
    cmd, env, work_dir = grpo_launch(node, name)
    rc, out, err = node.run(f"setsid bash -c {shlex.quote(cmd)} < /dev/null > /dev/null 2>&1 & echo $!", env=env)
    assert rc == 0, err
    return int(out.strip()), work_dir


def wait_for(what: str, check, timeout: float = 120):
    """Poll ``check`` until it returns a truthy value (state-based; the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def launch_text(work_dir: Path) -> str:
    p = work_dir / "launch.out"
    return p.read_text(errors="replace") if p.is_file() else ""


def exp_dirs(work_dir: Path) -> list[Path]:
    return sorted(p for p in work_dir.iterdir() if p.is_dir() and EXP_RE.match(p.name))


def stop_launch(node: Node, pgid: int) -> None:
    node.run(f"kill -KILL -- -{pgid}")
    assert node.wait_no_processes("run_rl.sh") == []
    node.run("ray stop --force > /dev/null")


def bash_s(node: Node, script: str) -> tuple[int, str]:
    """``script`` through ``bash -s`` on the channel's stdin, as rl-verify runs its node scripts."""
    stdin, stdout, stderr = node.client.exec_command("bash -s", timeout=60)
    stdin.write(script)
    stdin.close()
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


def listeners(node: Node, ports: list[int]) -> dict[int, int]:
    """port -> pid of the process holding its LISTEN socket, as `ss -ltnp` on the node shows it."""
    flt = " or ".join(f"sport = :{p}" for p in ports)
    _, out, _ = node.run(f"ss -ltnpH '( {flt} )'")
    found = {}
    for line in out.splitlines():
        m = re.search(r":(\d+)\s.*pid=(\d+)", line)
        if m:
            found[int(m.group(1))] = int(m.group(2))
    return found


def ray_stop(node: Node) -> None:
    rc, _, err = node.run("ray stop --force")
    assert rc == 0, err
    assert listeners(node, node.info["ray_ports"]) == {}


# ------------------------------------------------------------------------------------------------
def test_healthy_node_settings_and_launch(faults: Node) -> None:
    node = faults
    info = node.info
    port, dash = info["ray_ports"]
    assert port != dash and info["gpus"] == 8 and info["nofile_hard"] >= 65536
    assert info["ray_log"] == f"{info['root']}/tmp/ray_log"
    sim = json.loads((node.root / "sim.json").read_text())
    assert (sim["ray_port"], sim["ray_dashboard_port"], sim["nofile_hard"]) == (port, dash, info["nofile_hard"])
    # what a readiness check sees on a ready node, in the session's shell and in a `bash -s` script
    probe = "ulimit -Hn; nvidia-smi -L | wc -l; printenv CUDA_VISIBLE_DEVICES || echo unset; command -v python\n"
    rc, out, _ = node.run(probe)
    assert rc == 0 and out.split()[:3] == [str(info["nofile_hard"]), "8", "unset"], out
    assert bash_s(node, probe) == (0, out)
    ray_stop(node)

    rc, work_dir = run_grpo(node, "healthy")
    log = launch_text(work_dir)
    assert rc == 0, log[-3000:]
    assert "+ ulimit -n 65536" in log and not WAIT_LINE.search(log)
    [exp] = exp_dirs(work_dir)
    assert (exp / "logs" / "exp_tracking" / "tracker.jsonl").is_file()
    assert (work_dir / "run_rl.sh").is_file() and (work_dir / "config.py").is_file()
    # the node-wide ray_log (under the node root) is a link to this run's Ray folder
    [ray_dir] = work_dir.glob("ray_*")
    rc, out, _ = node.run(f"readlink {shlex.quote(info['ray_log'])}")
    assert out.strip() == str(ray_dir)
    assert (ray_dir / "session_latest" / "logs").is_dir()
    # run_rl.sh leaves its Ray head running: it holds the node's fixed ports, and is the node's own
    held = listeners(node, [port, dash])
    assert set(held) == {port, dash} and len(set(held.values())) == 1
    [(pid, cmd)] = [p for p in node.processes("rlsim-ray-head")]
    assert held[port] == pid
    ray_stop(node)  # frees them


def test_low_nofile_ends_the_script_at_ulimit(faults: Node) -> None:
    node = faults
    fault = simnode.set_fault(node.state, "grpo", "low-nofile")
    assert fault["limit"] == 20000
    fresh = pinned_client(node.info)  # a new connection and a new session of an open one agree
    try:
        for client in (node.client, fresh):
            _, out, _ = client.exec_command("ulimit -Hn; grep 'Max open files' /proc/self/limits")
            lines = out.read().decode().splitlines()
            assert lines[0] == "20000"
            assert int(lines[1].split()[4]) <= 20000  # the real limit, not only what bash says
    finally:
        fresh.close()
    assert bash_s(node, "ulimit -Hn\n") == (0, "20000\n")
    rc, out, err = node.run("ulimit -n 65536")
    assert rc == 1 and ULIMIT_ERROR in err

    rc, work_dir = run_grpo(node, "low-nofile")
    log = launch_text(work_dir)
    assert rc == 1, log[-2000:]
    assert "+ ulimit -n 65536" in log and ULIMIT_ERROR in log
    assert re.search(r"run_rl\.sh: line \d+: " + re.escape(ULIMIT_ERROR), log)
    assert exp_dirs(work_dir) == [] and not list(work_dir.glob("training_log_*"))
    assert not simnode.ray_running(node.state)  # `ray stop --force` ran first, no `ray start`

    simnode.clear_faults(node.state, "grpo")
    _, out, _ = node.run("ulimit -Hn")
    assert out.strip() == str(node.info["nofile_hard"])


@pytest.mark.parametrize("kind", ["hidden-gpu", "gpu-lost"])
def test_gpu_count_wait_never_ends(faults: Node, kind: str) -> None:
    node = faults
    simnode.set_fault(node.state, "node", kind, gpus=7)
    _, out, _ = node.run("nvidia-smi -L")
    # hidden: the node shows 7 GPUs; lost: all 8 are there when the prerequisites look
    assert len(out.splitlines()) == (7 if kind == "hidden-gpu" else 8)
    pgid, work_dir = start_grpo_detached(node, kind)
    try:
        def three_waits() -> list[str] | None:
            found = WAIT_LINE.findall(launch_text(work_dir))
            return found if len(found) >= 3 else None

        waits = wait_for("three GPU-count waiting lines", three_waits)
        assert set(waits) == {"7"}
        assert "+ sleep 2" in launch_text(work_dir)
        # still waiting: no trainer, no experiment folder, no training log
        assert node.processes("--rlsim-train") == [] and node.processes("run_rl.sh")
        assert exp_dirs(work_dir) == [] and not list(work_dir.glob("training_log_*"))
        _, out, _ = node.run("nvidia-smi -L | wc -l; ray status | grep GPU")
        assert out.split()[0] == "7" and "/7.0 GPU" in out
    finally:
        stop_launch(node, pgid)
    simnode.clear_faults(node.state)
    _, out, _ = node.run("nvidia-smi -L | wc -l")
    assert out.strip() == "8"
    assert not (node.root / "state" / "gpus_lost.json").exists()


def test_foreign_ray_holds_the_ports(faults: Node) -> None:
    node = faults
    port, dash = node.info["ray_ports"]
    node.run("ray stop --force")
    fault = simnode.set_fault(node.state, "node", "foreign-ray")
    other = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name
    assert fault["user"] == other
    held = listeners(node, [port, dash])
    assert held == {port: fault["pid"], dash: fault["pid"]}
    _, out, _ = node.run(f"ps -o user=,args= -p {fault['pid']}")
    user, args = out.split(None, 1)
    assert user == other and "ray" in args and "gcs_server" in args and f"--gcs_server_port={port}" in args
    # outside the node's marker env: not one of the node's processes
    rc, out, _ = node.run(f"tr '\\0' '\\n' < /proc/{fault['pid']}/environ | grep -c '^RLSIM_NODE=' || true")
    assert out.strip() == "0"
    assert fault["pid"] not in [p for p, _ in simnode.node_processes(node.state)]
    # the sockets are that user's (/proc/net/tcp uid column)
    uid = pwd.getpwnam(other).pw_uid
    _, tcp, _ = node.run("cat /proc/net/tcp")
    owners = {int(f[1].split(":")[1], 16): int(f[7]) for f in (ln.split() for ln in tcp.splitlines()[1:])
              if f[3] == "0A"}
    assert owners[port] == uid and owners[dash] == uid

    # the contract's trap: the script's `ray stop --force` (run as root) kills another user's Ray
    if os.geteuid() == 0:
        rc, out, _ = node.run("ray stop --force")
        assert rc == 0 and listeners(node, [port, dash]) == {}
        assert simnode.node_status(node.state)["traps"]["foreign_ray_pid"] is None

    # one it cannot kill (an unprivileged SSH user's case): `ray start` finds the port in use
    fault = simnode.set_fault(node.state, "node", "foreign-ray", survives_stop=True)
    rc, work_dir = run_grpo(node, "foreign-ray")
    log = launch_text(work_dir)
    assert rc == 1, log[-2000:]
    assert f"127.0.0.1:{port}: [Errno 98] Address already in use" in log
    assert "Could not terminate `gcs_server`" in log
    assert exp_dirs(work_dir) == []
    assert listeners(node, [port]) == {port: fault["pid"]}
    simnode.clear_faults(node.state)
    assert listeners(node, [port, dash]) == {}


def test_no_python_on_the_path(faults: Node) -> None:
    node = faults
    simnode.set_fault(node.state, "node", "no-python")
    rc, out, _ = node.run("command -v python")
    assert rc == 1 and out == ""
    assert bash_s(node, "command -v python || echo none\n") == (0, "none\n")
    rc, out, _ = node.run("command -v ray nvidia-smi")
    assert rc == 0 and len(out.split()) == 2  # the rest of the PATH is there

    rc, work_dir = run_grpo(node, "no-python")
    assert rc == 0  # `python ... | tee -a` without pipefail: tee's status
    log = launch_text(work_dir)
    assert re.search(r"run_rl\.sh: line \d+: python: command not found", log), log[-2000:]
    assert exp_dirs(work_dir) == []
    node.run("ray stop --force")

    simnode.clear_faults(node.state)
    rc, out, _ = node.run("command -v python")
    assert rc == 0 and out.strip()


def test_cli_node_faults_and_stop_node_cleanup(fresh_node: Node, sim_node: Node) -> None:
    # two nodes on one machine: each has its own "fixed" Ray ports
    assert not set(fresh_node.info["ray_ports"]) & set(sim_node.info["ray_ports"])

    def cli(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "simulator.node", *args, "--state", str(fresh_node.state)],
                             cwd=REPO, capture_output=True, text=True, check=True)
        return res.stdout

    cli("fault", "--kind", "hidden-gpu", "--gpus", "6")
    cli("fault", "--kind", "low-nofile", "--limit", "4096")
    cli("fault", "--kind", "foreign-ray")
    status = json.loads(cli("status"))
    assert set(status["faults"]["node"]) == {"hidden-gpu", "low-nofile", "foreign-ray"}
    assert status["traps"]["nofile_hard_now"] == 4096
    pid = status["traps"]["foreign_ray_pid"]
    assert pid and Path(f"/proc/{pid}").exists()
    _, out, _ = fresh_node.run("nvidia-smi -L | wc -l; ulimit -Hn")
    assert out.split() == ["6", "4096"]
    cli("clear-faults", "--suite", "node")
    assert "node" not in json.loads(cli("status"))["faults"]
    _, out, _ = fresh_node.run("nvidia-smi -L | wc -l; ulimit -Hn")
    assert out.split() == ["8", str(fresh_node.info["nofile_hard"])]
    assert not Path(f"/proc/{pid}").exists() or b"gcs_server" not in Path(f"/proc/{pid}/cmdline").read_bytes()

    # stop_node removes another user's Ray too (it is outside the node's marker env)
    cli("fault", "--kind", "foreign-ray")
    pid = json.loads(cli("status"))["traps"]["foreign_ray_pid"]
    simnode.stop_node(fresh_node.state)
    assert wait_for("the foreign Ray to go", lambda: not Path(f"/proc/{pid}/cmdline").exists()
                    or b"gcs_server" not in Path(f"/proc/{pid}/cmdline").read_bytes(), timeout=10)
