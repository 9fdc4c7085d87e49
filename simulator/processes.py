"""The simulated processes of a node: found by the RLSIM_NODE marker in their environment, and killed."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from simulator.common import (
    _root,
    _pid_alive,
    _is_zombie,
)


# ----------------------------------------------------------------------------------------------------
# Processes of a node
def _proc_has_env(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def node_processes(state: Path) -> list[tuple[int, str]]:
    """Every live process carrying ``RLSIM_NODE=<this node's root>`` (except the caller): (pid, cmdline).

    That is every process started through the node's SSH sessions: shells, launch scripts, trainers,
    teachers and fake Ray daemons. An empty list means nothing of the node is left running.
    """
    marker = f"RLSIM_NODE={_root(state)}".encode()
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        pid = int(d.name)
        if _proc_has_env(pid, marker) and not _is_zombie(pid):
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            out.append((pid, cmd))
    return sorted(out)


def trainers(state: Path) -> list[tuple[int, str]]:
    """The node's live trainers (pid, cmdline): processes started with ``--rlsim-train``, without the workers
    a trainer forks (its reward Pool's worker carries the trainer's command line but is not a training)."""
    found = [p for p in node_processes(state) if "--rlsim-train" in p[1]]
    pids = {pid for pid, _ in found}
    return [p for p in found if _parent(p[0]) not in pids]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def ray_running(state: Path) -> bool:
    """True when a fake Ray daemon of this node is alive."""
    return any("rlsim-ray-" in cmd for _, cmd in node_processes(state))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            ppid = _parent(int(d.name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_all(pids: list[int], grace: float = 2.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if _pid_alive(p)]
        if not pids:
            return


def kill_node_processes(state: Path) -> list[tuple[int, str]]:
    """Kill every simulated process of the node (TERM, then KILL); return what was found."""
    found = node_processes(state)
    _kill_all([p for p, _ in found])
    # A launch script may have spawned more between the scan and the kill: sweep again.
    again = node_processes(state)
    _kill_all([p for p, _ in again])
    return found + again

