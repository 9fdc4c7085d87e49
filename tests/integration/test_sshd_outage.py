"""sshd_down / sshd_up of the SIMULATED node: an SSH outage that leaves the node's work running."""
from __future__ import annotations

import socket
import time

import paramiko
import pytest
from sim_ssh import Node, pinned_client, simnode

pytestmark = pytest.mark.integration


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_sshd_down_drops_sessions_keeps_processes_and_sshd_up_restores_the_same_node(fresh_node: Node) -> None:
    info = fresh_node.info
    # A detached job (own session, like the remote job runner's) and a command still running in a session.
    rc, out, _ = fresh_node.run("setsid nohup sleep 300 > /dev/null 2>&1 < /dev/null & echo $!")
    assert rc == 0
    detached = int(out.strip())
    chan = fresh_node.client.get_transport().open_session()
    chan.exec_command("sleep 301")
    # Wait for the command itself: for a moment its login shell (`bash -c sleep 301`, before it execs
    # the command) matches too.
    def in_session_sleep() -> list[int]:
        return [p for p, cmd in fresh_node.processes("sleep 301") if cmd.strip() == "sleep 301"]

    deadline = time.monotonic() + 10
    while len(in_session_sleep()) != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    (in_session,) = in_session_sleep()

    stopped = simnode.sshd_down(fresh_node.state)
    assert stopped, "sshd was running"
    assert simnode.node_status(fresh_node.state)["sshd_pid"] is None
    assert _refused(info["port"])
    # the established connection is gone ...
    deadline = time.monotonic() + 10
    while fresh_node.client.get_transport().is_active() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not fresh_node.client.get_transport().is_active()
    with pytest.raises((paramiko.SSHException, OSError)):
        fresh_node.run("true")
    with pytest.raises((paramiko.SSHException, OSError)):
        pinned_client(info)
    # ... but nothing of the node's work was killed
    alive = {p for p, _ in simnode.node_processes(fresh_node.state)}
    assert {detached, in_session} <= alive
    assert simnode.sshd_down(fresh_node.state) == []  # idempotent

    assert simnode.sshd_up(fresh_node.state) == info  # same node.json: same port, keys, paths
    fresh_node.client = pinned_client(info)  # same pinned host key and client key are accepted
    rc, out, _ = fresh_node.run("echo back; kill -0 %d && echo alive" % detached)
    assert rc == 0 and out.split() == ["back", "alive"]
    simnode.sshd_up(fresh_node.state)  # idempotent while running
    assert simnode.node_status(fresh_node.state)["sshd_pid"] is not None

    simnode.stop_node(fresh_node.state)
    assert simnode.node_processes(fresh_node.state) == []


def test_stop_node_after_sshd_down_still_kills_everything(fresh_node: Node) -> None:
    rc, _, _ = fresh_node.run("setsid nohup sleep 302 > /dev/null 2>&1 < /dev/null &")
    assert rc == 0
    simnode.sshd_down(fresh_node.state)
    assert fresh_node.processes("sleep 302")
    simnode.stop_node(fresh_node.state)
    assert simnode.node_processes(fresh_node.state) == []
    assert _refused(fresh_node.info["port"])
