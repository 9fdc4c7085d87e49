"""Process and file helpers shared by the harness's servers (the local Airflow and its private services).

A leaf: it imports only the standard library (and psutil, which ships with Airflow, inside the one
function that walks a process tree), so that every harness module may use it without an import circle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file, or "(no log)" if it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (parents created), readable by its owner only (0600) from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def descendants(pid: int) -> list[int]:
    """All descendant pids of pid (none if psutil is missing or the process is gone)."""
    try:
        import psutil  # ships with Airflow; only this function needs it

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


def alive(pid: int) -> bool:
    """Whether pid is a running process (a zombie counts as gone; another user's process as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def kill_tree(leaders: Iterable[int], others: Iterable[int], timeout: float) -> None:
    """Stop process trees: SIGTERM the leaders only (each shuts its own children down gracefully;
    signalling the whole group at once makes e.g. the triggerer wait 10 s for its runner), then
    SIGTERM and finally SIGKILL the leaders' process groups and every remaining listed descendant."""
    leaders, everyone = set(leaders), set(leaders) | set(others)

    def wait(pids: set[int], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not any(alive(p) for p in pids):
                return True
            time.sleep(0.1)
        return not any(alive(p) for p in pids)

    for pid in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    # The triggerer gives its trigger runner a 10 s escalation delay (even a second SIGTERM costs 5 s);
    # for a local stack all state is in the DB, so after `timeout` the rest is simply killed.
    wait(leaders, timeout)
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        for pg in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pg, sig)
        for pid in everyone:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        if wait(everyone, grace):
            return


def end_process(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM the process's group (it was started in its own session), SIGKILL it after ``grace``."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return
