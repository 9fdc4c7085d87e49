"""check_prerequisites against the real sshd of the simulated node: the launch scripts' traps
(xtuner-contract.md) refused in the one round trip, before any card, every problem with its fix, the node
untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sim_ssh import Node, simnode

from rl_verify.core.names import run_key
from rl_verify.engines import load_suite
from rl_verify.node import ops as node
from simulator import traps as simtraps

pytestmark = pytest.mark.integration


def _specs(sim_node: Node, suites=("grpo", "opd")):
    return [load_suite(s).expanded({**sim_node.info["env"], "CHECKOUT": sim_node.checkout}) for s in suites]


def _needs(sim_node: Node, specs):
    # The simulated node's "fixed" Ray ports and /tmp/ray_log are its own (the connection's extras in the DAG).
    return node.merged_needs(specs, ray_ports=tuple(sim_node.info["ray_ports"]), ray_log=sim_node.info["ray_log"])



def _check(sim_node: Node, specs=None):
    specs = specs or _specs(sim_node)
    return node.check_prerequisites(sim_node.client, specs, f"{sim_node.info['root']}/runs", run_key("it-ready"),
                                    needs=_needs(sim_node, specs), user="the SSH user")


def _node_state(sim_node: Node) -> tuple:
    """What a check must leave as it found it: processes, Ray, the node's own ports (its Ray ports and its
    sshd; other ports of this machine belong to tests running beside this one), the run folders."""
    _, listening, _ = sim_node.run("ss -ltnH | awk '{print $4}' | sort")
    own = set(simtraps.settings(sim_node.root)["ray_ports"]) | {int(sim_node.info["port"])}
    ports = [a for a in listening.split() if a.rsplit(":", 1)[-1].isdigit() and int(a.rsplit(":", 1)[-1]) in own]
    runs = sim_node.root / "runs"
    return (sorted(cmd for _, cmd in simnode.node_processes(sim_node.state)), simnode.ray_running(sim_node.state),
            ports, sorted(p.name for p in runs.iterdir()) if runs.is_dir() else [])


def test_a_ready_node_passes_and_reports_what_it_saw(sim_node):
    result = _check(sim_node)
    assert result.unready == [] and not result.missing
    assert int(result.readiness["nofile"]) >= 65536
    assert result.readiness["gpus"] == (8, "<unset>")
    assert result.readiness["python"]
    assert all(p["whose"] != "other" for p in result.readiness.get("ports", []))


@pytest.mark.parametrize("trap, expected", [
    ("low-nofile", ["hard open-files limit is 20000, below the 65536", "limits.conf"]),
    ("hidden-gpu", ["shows 7 GPU(s)", "waits (forever) for 8", "Fix:"]),
    ("foreign-ray", ["another user's Ray", "`ray stop --force` would kill it", "Fix: ask that user"]),
    ("no-python", ["`python` does not resolve", "python-is-python3"]),
    ("gpu-foreign", ["GPU 0 (00000000:18:00.0) is in use by a process that is not this run's",
                     "holding 21504 MiB of 143771 MiB", "/home/other/finetune/train.py", "Fix: ask"]),
    ("gpu-error", ["nvidia-smi --query-gpu failed (exit 15): 'Unable to determine the device handle for "
                   "GPU00000000:18:00.0: Unknown Error'", "shows 7 GPU(s)", "dmesg for Xid errors"]),
])
def test_each_trap_is_refused_before_the_card_with_its_fix_and_the_node_untouched(faults, trap, expected):
    sim_node = faults
    sim_node.run("ray stop --force")
    fault = simnode.set_fault(sim_node.state, "node", trap)
    before = _node_state(sim_node)
    with pytest.raises(node.PrerequisitesError) as err:
        _check(sim_node)
    text = str(err.value)
    assert "nothing was launched" in text
    for words in expected:
        assert words in text, text
    if trap == "gpu-foreign":
        assert f"pid {fault['pid']} of user {fault['user']} (" in text
    if trap == "foreign-ray":
        assert f"process {fault['pid']} of {fault['user']}" in text
        assert str(sim_node.info["ray_ports"][0]) in text
    assert _node_state(sim_node) == before
    if trap == "foreign-ray":
        assert simnode.node_status(sim_node.state)["traps"]["foreign_ray_pid"] == fault["pid"]  # still alive


def test_every_trap_at_once_is_one_error_listing_each_with_its_fix(faults):
    sim_node = faults
    sim_node.run("ray stop --force")
    for trap in ("low-nofile", "hidden-gpu", "foreign-ray", "no-python"):
        simnode.set_fault(sim_node.state, "node", trap)
    simnode.set_fault(sim_node.state, "opd", "missing-input")
    before = _node_state(sim_node)
    with pytest.raises(node.PrerequisitesError) as err:
        _check(sim_node)
    text = str(err.value)
    lines = [line for line in text.splitlines() if line.startswith("  - ")]
    unready = [line for line in lines if "not ready:" in line]
    # open files, GPUs, two Ray ports, python; each its own line with its own fix
    assert len(unready) == 5, text
    assert all("Fix:" in line for line in unready), text
    assert any("missing model for opd" in line or "missing " in line for line in lines), text
    assert text.splitlines()[0].startswith(f"{len(lines)} prerequisite problem(s)")
    assert _node_state(sim_node) == before


def test_cuda_visible_devices_in_the_ssh_environment_is_named(sim_node):
    specs = _specs(sim_node, ("grpo",))
    needs = _needs(sim_node, specs)
    result = node.parse_prerequisites("GPUS\t8\t0,1,2,3\n")
    problems = node.readiness_problems(needs, result.readiness)
    assert len(problems) == 1 and "CUDA_VISIBLE_DEVICES='0,1,2,3'" in problems[0] and "Fix: unset it" in problems[0]


def test_the_node_own_stale_ray_on_the_ports_is_not_a_problem(sim_node):
    rc, _, err = sim_node.run("ray start --head --port=%d --dashboard-port=%d >/dev/null" %
                              tuple(sim_node.info["ray_ports"]))
    assert rc == 0, err
    try:
        result = _check(sim_node)
        ports = result.readiness.get("ports", [])
        assert ports and all(p["whose"] == "ours" for p in ports), ports
        assert result.unready == []
    finally:
        sim_node.run("ray stop --force")


def test_a_launch_script_running_on_another_simulated_node_of_this_machine_does_not_make_this_one_busy(
        sim_node, tmp_path):
    # The simulated nodes share one machine, a real node is a machine of its own: the node's pgrep (bin/pgrep)
    # leaves out processes of another node (its RLSIM_NODE). Without it, an unmarked launch script a test runs
    # on node B makes node A refuse a DAG run as "busy".
    script = tmp_path / "run_rl.sh"
    script.write_text("sleep 60\n")
    roots = {"another node": str(tmp_path / "another-node"), "this node": sim_node.info["root"]}
    procs = {where: subprocess.Popen(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "RLSIM_NODE": root},
                                     start_new_session=True)
             for where, root in roots.items()}
    try:
        for p in procs.values():  # bash has exec'd the script once its command line is there
            while "run_rl.sh" not in Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace"):
                assert p.poll() is None
                time.sleep(0.01)
        with pytest.raises(node.PrerequisitesError) as refused:
            _check(sim_node)
        busy = [line for line in str(refused.value).splitlines() if "node busy" in line]
        assert len(busy) == 1 and f"(pid {procs['this node'].pid}: bash {script})" in busy[0], busy
    finally:
        for p in procs.values():  # the whole group: the script's `sleep` too (it carries the node's RLSIM_NODE)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
