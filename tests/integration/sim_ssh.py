"""SSH helpers for the integration tests of the SIMULATED GPU node (paramiko, host key pinned)."""
from __future__ import annotations

import base64
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from simulator import node as simnode


REPO = Path(__file__).resolve().parents[2]


STEP_SECONDS = 0.05


def pinned_client(info: dict[str, Any], host_key: str | None = None) -> "paramiko.SSHClient":
    """A connected SSHClient that accepts only ``host_key`` (default: the node's) for the node."""
    key_type, b64 = (host_key or info["host_key"]).split()[:2]
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.get_host_keys().add(f"[{info['host']}]:{info['port']}", key_type,
                               paramiko.PKey.from_type_string(key_type, base64.b64decode(b64)))
    client.connect(info["host"], port=info["port"], username=info["user"], key_filename=info["client_key"],
                   look_for_keys=False, allow_agent=False, timeout=10, banner_timeout=10, auth_timeout=10)
    return client


@dataclass
class Node:
    """A running simulated node and an SSH connection to it."""

    state: Path
    info: dict[str, Any]
    client: Any

    @property
    def root(self) -> Path:
        return Path(self.info["root"])

    @property
    def checkout(self) -> str:
        return self.info["checkout"]

    def run(self, command: str, timeout: float = 120, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """Run ``command`` through bash on the node; return (exit status, stdout, stderr)."""
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        stdin, stdout, stderr = self.client.exec_command(exports + command, timeout=timeout)
        stdin.close()
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err

    def share_env(self) -> dict[str, str]:
        return dict(self.info["env"])

    def worktree(self, ref: str, name: str) -> str:
        """A fresh detached worktree of the simulated checkout at ``ref``."""
        wt = str(self.state / "worktrees" / name)
        rc, out, err = self.run(f"git -C {shlex.quote(self.checkout)} worktree add -q --detach "
                                f"{shlex.quote(wt)} {shlex.quote(ref)}")
        assert rc == 0, err
        return wt

    def processes(self, needle: str = "") -> list[tuple[int, str]]:
        return [p for p in simnode.node_processes(self.state) if needle in p[1]]

    def wait_no_processes(self, needle: str = "", timeout: float = 10) -> list[tuple[int, str]]:
        deadline = time.monotonic() + timeout
        left = self.processes(needle)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.processes(needle)
        return left


