"""Node readiness traps of the simulated node (written from xtuner-contract.md, "More of the GRPO
script's behaviour"): the SSH user's hard open-files limit, the visible GPUs, the node's "fixed" Ray
ports and its shared ``/tmp/ray_log``, ``python`` on the PATH, and another user's Ray on the ports.

Node settings (``ROOT/sim.json``, chosen once when the node is built, reported in node.json):
  ``gpus``               GPUs of the node (default 8; the fake ``nvidia-smi -L`` and ``ray`` use it)
  ``ray_port``           the node's "6379": GCS port of ``ray start --head --port=...``
  ``ray_dashboard_port`` the node's "8265": ``--dashboard-port=...``
  ``nofile_hard``        hard RLIMIT_NOFILE of every SSH session (default 1048576 when the control
                         user may raise it, else the control process's own hard limit)
Two simulated nodes share this machine, so each node's "fixed" ports are its own free ports below
the ephemeral range; ``ROOT/tmp`` is the node's ``/tmp`` (``ROOT/tmp/ray_log``). The simulated
launch script reads the ports and that folder from ``ROOT/etc/rlsim-node.env``.

Node faults (``faults.json["node"]``: kind -> parameters, several at once, node-wide, for every
suite) switch each trap on; ``clear_node_faults`` switches them off again.
Standard library only.
"""
from __future__ import annotations

import os
import pwd
import random
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from simulator.common import _node_python, _read_json, _root, _write_json, _pid_alive

NODE_FAULT_KINDS = ("low-nofile", "hidden-gpu", "gpu-lost", "foreign-ray", "no-python", "gpu-foreign", "gpu-held",
                    "gpu-error")
DEFAULT_FOREIGN_GPU_MIB = 21504   # the foreign process held 21 GiB of the H200
FOREIGN_GPU_ARGV0 = "python3 /home/other/finetune/train.py --config sft.py"  # another user's job in `ps`
DEFAULT_NOFILE = 1048576          # a typical generous node setting (capped at fs.nr_open)
DEFAULT_LOW_NOFILE = 20000        # the value seen on the node
SCRIPT_NOFILE = 65536             # what run_rl.sh's `ulimit -n` asks for
FOREIGN_ARGV0 = "/opt/ray/python/ray/core/src/ray/gcs/gcs_server"  # looks like Ray's GCS in `ps`


# ----------------------------------------------------------------------------------------------------
# Settings
def _nr_open() -> int:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text().strip())
    except (OSError, ValueError):
        return DEFAULT_NOFILE


def _default_nofile() -> int:
    """A generous node's hard open-files limit: 1048576 (at most fs.nr_open)."""
    return min(DEFAULT_NOFILE, _nr_open())


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_free(port: int, reuse: bool = False) -> bool:
    """Nothing bound to 127.0.0.1:port (``reuse``: nothing LISTENs there; TIME_WAIT leftovers are fine)."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports(n: int) -> list[int]:
    """``n`` distinct free ports below the ephemeral range (no outgoing connection takes them)."""
    hi = max(_ephemeral_low() - 1, 12000)
    lo = 10000 if hi > 11000 else 1025
    rng = random.SystemRandom()
    out: list[int] = []
    for _ in range(2000):
        p = rng.randint(lo, hi)
        if p not in out and _port_free(p):
            out.append(p)
            if len(out) == n:
                return out
    raise RuntimeError(f"no {n} free ports in {lo}..{hi} on 127.0.0.1")


def prepare(root: Path) -> dict[str, Any]:
    """Fill in the node's trap settings (kept once chosen), write ``ROOT/etc/rlsim-node.env``,
    create the node's ``/tmp`` and sync the ``python`` shim with the faults. Returns the settings."""
    sim = _read_json(root / "sim.json", {})
    changed = False
    if not (sim.get("ray_port") and sim.get("ray_dashboard_port")):
        sim["ray_port"], sim["ray_dashboard_port"] = _pick_ports(2)
        changed = True
    if not sim.get("nofile_hard"):
        sim["nofile_hard"] = _default_nofile()
        changed = True
    if changed:
        _write_json(root / "sim.json", sim)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    (root / "etc").mkdir(parents=True, exist_ok=True)
    env = (f"# The SIMULATED node's constants (simulator.traps; do not edit): the real run_rl.sh uses the\n"
           f"# literal ports 6379/8265 and /tmp, but simulated nodes share one machine.\n"
           f"RLSIM_RAY_PORT={int(sim['ray_port'])}\n"
           f"RLSIM_RAY_DASHBOARD_PORT={int(sim['ray_dashboard_port'])}\n"
           f"RLSIM_TMP={root / 'tmp'}\n")
    target = root / "etc" / "rlsim-node.env"
    if not target.exists() or target.read_text() != env:
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(env)
        os.replace(tmp, target)
    session_wrapper(root)
    write_nofile(root)
    _sync_python(root)
    return settings(root)


def settings(root: Path) -> dict[str, Any]:
    """The node settings node.json reports (the healthy values; faults are in faults.json)."""
    sim = _read_json(root / "sim.json", {})
    return {
        "gpus": int(sim.get("gpus", 8)),
        "ray_ports": [int(sim["ray_port"]), int(sim["ray_dashboard_port"])],
        "nofile_hard": int(sim["nofile_hard"]),
        "tmp": str(root / "tmp"),
        "ray_log": str(root / "tmp" / "ray_log"),
    }


def node_faults(root: Path) -> dict[str, dict[str, Any]]:
    return dict(_read_json(root / "faults.json", {}).get("node") or {})


# ----------------------------------------------------------------------------------------------------
# Open-files limit of the SSH sessions
def effective_nofile(root: Path) -> int:
    """The SSH user's hard open-files limit on the node now: the low-nofile fault's, else the setting."""
    low = node_faults(root).get("low-nofile")
    if low:
        return int(low["limit"])
    return int(_read_json(root / "sim.json", {}).get("nofile_hard") or _default_nofile())


def sshd_preexec(root: Path) -> Callable[[], None]:
    """``preexec_fn`` starting sshd under the node's ``nofile_hard`` where the machine allows it
    (raising a hard limit needs CAP_SYS_RESOURCE); its sessions inherit it. Faults lower it per
    session (rlsim-session, the sshd ForceCommand), so they never need an sshd restart."""
    want = int(_read_json(root / "sim.json", {}).get("nofile_hard") or _default_nofile())

    def _set() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, want), want))
        except (ValueError, OSError):
            pass  # cannot raise: the node's session start emulates the rest (README)
    return _set


def write_nofile(root: Path) -> None:
    """``ROOT/etc/nofile``: the limit every new SSH session of the node starts with (rlsim-session)."""
    target = root / "etc" / "nofile"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name("nofile.tmp")
    tmp.write_text(f"{effective_nofile(root)}\n")
    os.replace(tmp, target)


# The emulated `ulimit` (only where the machine cannot give the node's limit, see _SESSION): exported
# to every bash of the session (export -f). Only `ulimit [-S|-H]n [N]` is emulated.
_ULIMIT_FN = r"""ulimit() {
  { local _rlsim_x=; case $- in *x*) _rlsim_x=1; set +x;; esac; } 2>/dev/null
  local _rc=0 _hard=${RLSIM_NOFILE_HARD:-0} _soft=${RLSIM_NOFILE_SOFT:-} _real
  [ -n "$_soft" ] || _soft=$(builtin ulimit -Sn)
  case "$#:${1:-}:${2:-}" in
    1:-n:|1:-Sn:|1:-nS:) echo "$_soft" ;;
    1:-Hn:|1:-nH:) echo "$_hard" ;;
    2:-n:[0-9]*|2:-Sn:[0-9]*|2:-nS:[0-9]*|2:-Hn:[0-9]*|2:-nH:[0-9]*|2:-HSn:[0-9]*|2:-SHn:[0-9]*)
      if [ "$2" -gt "$_hard" ]; then
        echo "${BASH_SOURCE[1]:-$0}: line ${BASH_LINENO[0]}: ulimit: open files: cannot modify limit:" \
          "Operation not permitted" >&2
        _rc=1
      else
        case $1 in
          -Sn|-nS) _soft=$2 ;;
          -Hn|-nH) _hard=$2; [ "$_soft" = unlimited ] || [ "$_soft" -le "$2" ] || _soft=$2 ;;
          *) _hard=$2; _soft=$2 ;;
        esac
        export RLSIM_NOFILE_HARD=$_hard RLSIM_NOFILE_SOFT=$_soft
        _real=$(builtin ulimit -Hn)
        if [ "$_real" = unlimited ] || [ "$_soft" -le "$_real" ]; then _real=$_soft; fi
        builtin ulimit -Sn "$_real" 2>/dev/null || :
      fi ;;
    *) builtin ulimit "$@"; _rc=$? ;;
  esac
  if [ -n "$_rlsim_x" ]; then set -x; fi
  return $_rc
}"""

# sshd ForceCommand of the node: every SSH session (command, sftp, login) starts here, after the
# user's login shell read its startup files - the place where pam_limits would apply limits.conf.
_SESSION = r"""#!/bin/bash
# Session start of the SIMULATED node's SSH sessions (sshd ForceCommand, generated by
# simulator/traps.py; do not edit). Like pam_limits at login, it applies the SSH user's hard
# open-files limit (ROOT/etc/nofile: sim.json nofile_hard, or the low-nofile fault's limit) to the
# session; below the real limit that is real (`ulimit -Hn`, inherited by every process of the
# session); above it - the machine cannot raise a hard limit (no CAP_SYS_RESOURCE) - an exported
# bash `ulimit` function reports and grants it for open files (emulated; /proc/<pid>/limits shows
# the real value). Under the no-python fault (ROOT/etc/no-python) every PATH folder holding a
# `python` is dropped. Then it runs what the client asked for: its command, the sftp server or a
# login shell.
limit=
read -r limit 2>/dev/null < "ROOT/etc/nofile" || :
case $limit in
  ''|*[!0-9]*) ;;
  *)
    hard=$(ulimit -Hn)
    soft=$(ulimit -Sn)
    if [ "$hard" = unlimited ] || [ "$limit" -lt "$hard" ]; then
      if [ "$soft" = unlimited ] || [ "$soft" -gt "$limit" ]; then ulimit -n "$limit"; else ulimit -Hn "$limit"; fi
    elif [ "$limit" -gt "$hard" ]; then
      export RLSIM_NOFILE_HARD=$limit
      ULIMIT_FN
      export -f ulimit
    fi ;;
esac
if [ -e "ROOT/etc/no-python" ]; then
  kept=
  IFS=: read -r -a dirs <<< "$PATH"
  for d in "${dirs[@]}"; do
    [ -x "$d/python" ] || kept=${kept:+$kept:}$d
  done
  PATH=$kept
fi
unset limit hard soft kept dirs d
# A command of an sshd-run top-level bash (SHLVL < 2) would read ~/.bashrc again: start at level 2.
export SHLVL=2
if [ "${SSH_ORIGINAL_COMMAND:-}" = internal-sftp ]; then
  exec env -u RLSIM_NODE SFTP_SERVER  # like internal-sftp: not a process of the node
elif [ -n "${SSH_ORIGINAL_COMMAND:-}" ]; then
  exec "${SHELL:-/bin/bash}" -c "$SSH_ORIGINAL_COMMAND"
else
  exec -a "-${SHELL##*/}" "${SHELL:-/bin/bash}"
fi
"""

SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")


def session_wrapper(root: Path) -> Path | None:
    """Write ``ROOT/etc/rlsim-session`` (the sshd ForceCommand); None when no external sftp server
    exists to serve SFTP through it (then sessions run without it: no limit, no PATH trap)."""
    if not SFTP_SERVER.is_file():
        return None
    target = root / "etc" / "rlsim-session"
    text = (_SESSION.replace("ULIMIT_FN", _ULIMIT_FN.replace("\n", "\n      "))
            .replace("ROOT/etc/", f"{root}/etc/").replace("SFTP_SERVER", str(SFTP_SERVER)))
    if not target.exists() or target.read_text() != text:
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, target)
    return target


# ----------------------------------------------------------------------------------------------------
# python on the PATH
def _sync_python(root: Path) -> None:
    """``ROOT/bin/python`` -> the node's python3 (like Debian's python-is-python3), absent under no-python."""
    shim, flag = root / "bin" / "python", root / "etc" / "no-python"
    if "no-python" in node_faults(root):
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text("the no-python fault: sessions drop every PATH folder holding a `python`\n")
        if shim.is_symlink() or shim.exists():
            shim.unlink()
        return
    flag.unlink(missing_ok=True)
    target = _node_python()
    if shim.is_symlink() and os.readlink(shim) == target:
        return
    if shim.is_symlink() or shim.exists():
        shim.unlink()
    shim.symlink_to(target)


def _system_python(root: Path) -> str | None:
    """A ``python`` the SSH PATH would find outside the node's bin/ (then no-python cannot hide it)."""
    import shutil
    return shutil.which("python", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


# ----------------------------------------------------------------------------------------------------
# Another user's Ray on the node's ports
def _foreign_file(root: Path) -> Path:
    return root / "state" / "foreign_ray.json"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _recorded_pid(record: Path, root: Path, mark: bytes) -> int | None:
    """The pid a trap recorded in ``record`` while that process lives and is the node's (its command line names
    the node and ``mark``); None otherwise."""
    info = _read_json(record, None)
    if not info:
        return None
    pid = int(info["pid"])
    line = _cmdline(pid)
    return pid if _pid_alive(pid) and f"--rlsim-node={root}".encode() in line and mark in line else None


def foreign_ray_pid(root: Path) -> int | None:
    """The live foreign Ray of this node, if any."""
    return _recorded_pid(_foreign_file(root), root, b"gcs_server")


# Runs as the other user: bind the ports (sockets owned by that user), then become a long-lived
# `sleep` whose command line looks like Ray's GCS server (exec -a style argv[0]).
_FOREIGN_CODE = """\
import os, socket, sys
argv0, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
held = []
for p in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", p))
    s.listen(16)
    s.set_inheritable(True)
    held.append(s)
os.execv("/bin/sleep", [argv0, "infinity"])
"""


def _as_user(user: str) -> tuple[dict[str, Any], str]:
    """``subprocess.Popen`` arguments that run a process as ``user`` (root only; else as the control user), and
    the name of the user it then runs as."""
    if os.geteuid() != 0:
        return {}, pwd.getpwuid(os.getuid()).pw_name
    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}, user


def start_foreign_ray(root: Path, user: str = "nobody") -> dict[str, Any]:
    """Start a process of ``user`` (root only; else the control user, see README) listening on the
    node's Ray ports, outside the node's marker env, looking like a Ray GCS in ``ps``."""
    stop_foreign_ray(root)
    s = settings(root)
    port, dash = s["ray_ports"]
    for p in (port, dash):
        if not _port_free(p, reuse=True):
            raise RuntimeError(f"port {p} of the node is in use (is the node's own Ray running? "
                               f"`ray stop --force` on the node first)")
    argv0 = (f"{FOREIGN_ARGV0} --gcs_server_port={port} --dashboard_port={dash} "
             f"--node-ip-address=127.0.0.1 --session-name=session_foreign --rlsim-node={root}")
    kwargs, run_as = _as_user(user)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else _node_python()
    log = root / "state" / "foreign_ray.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([python, "-I", "-c", _FOREIGN_CODE, argv0, str(port), str(dash)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/",
                                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                start_new_session=True, close_fds=True, **kwargs)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"foreign Ray exited {proc.returncode}: {log.read_text(errors='replace')[-500:]}")
        if b"gcs_server" in _cmdline(proc.pid) and not _port_free(port, True) and not _port_free(dash, True):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("foreign Ray did not listen on the node's ports within 15 s")
    info = {"pid": proc.pid, "user": run_as, "ports": [port, dash]}
    _write_json(_foreign_file(root), info)
    return info


def _kill_and_wait(pid: int | None) -> None:
    """SIGKILL ``pid`` (None: nothing) and wait up to 5 s for it to be gone."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def stop_foreign_ray(root: Path) -> None:
    _kill_and_wait(foreign_ray_pid(root))
    _foreign_file(root).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------
# Another user's CUDA process on the node's GPUs (gpu-foreign)
def _gpu_foreign_file(root: Path) -> Path:
    return root / "state" / "gpu_foreign.json"


def gpu_foreign_pid(root: Path) -> int | None:
    """The live foreign GPU process of this node, if any."""
    return _recorded_pid(_gpu_foreign_file(root), root, b"--rlsim-gpu-foreign")


def start_gpu_foreign(root: Path, user: str = "nobody") -> dict[str, Any]:
    """Start a process of ``user`` (root only; else the control user) outside the node's marker env, looking like
    another team's training in ``ps``; the fake nvidia-smi lists it as a compute process (its fault record gives
    the GPU and the memory)."""
    stop_gpu_foreign(root)
    argv0 = f"{FOREIGN_GPU_ARGV0} --rlsim-gpu-foreign --rlsim-node={root}"
    kwargs, run_as = _as_user(user)
    proc = subprocess.Popen(["/bin/bash", "-c", 'exec -a "$0" sleep infinity', argv0], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True,
                            close_fds=True, **kwargs)
    deadline = time.monotonic() + 15
    while b"--rlsim-gpu-foreign" not in _cmdline(proc.pid):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the foreign GPU process did not start (exit {proc.poll()})")
        time.sleep(0.02)
    info = {"pid": proc.pid, "user": run_as}
    _write_json(_gpu_foreign_file(root), info)
    return info


def stop_gpu_foreign(root: Path) -> None:
    _kill_and_wait(gpu_foreign_pid(root))
    _gpu_foreign_file(root).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------
# Switching the traps on and off
def set_node_fault(state: Path, kind: str, via: str = "node", **params: Any) -> dict[str, Any]:
    """Switch node fault ``kind`` on (replacing the same kind); return its record in faults.json.

    low-nofile ``limit`` (default 20000): hard open-files limit of the SSH sessions.
    hidden-gpu ``gpus`` (default gpus - 1): GPUs ``nvidia-smi -L`` and Ray see.
    gpu-lost ``gpus`` (default gpus - 1): GPUs left once the next ``ray start --head`` runs (the loss
      happens at launch, after any prerequisite check), until cleared.
    foreign-ray ``user`` (default nobody), ``survives_stop`` (default False: the script's
      ``ray stop --force``, run by root, kills it, as the contract says; True: it cannot, as for an
      unprivileged SSH user, and ``ray start`` then fails with "Address already in use").
    no-python: ``python`` does not resolve on the SSH user's PATH.
    gpu-foreign ``user`` (default nobody), ``gpu`` (0), ``mib`` (21504): a process of another user, outside the
      node's marker env, that nvidia-smi lists as a compute process holding ``mib`` on GPU ``gpu``.
    gpu-held ``gpu`` (0), ``mib`` (the training's): the driver never releases the GPU memory of a training job
      started from now on: once the job's processes are gone, nvidia-smi lists its memory under the job's pid
      (``ROOT/runs/*/jobs/*/pid``) until cleared.
    gpu-error ``gpu`` (0): nvidia-smi cannot reach GPU ``gpu`` (fallen off the bus): the GPU queries print
      ``Unable to determine the device handle for GPU<bus id>: Unknown Error`` in its place and exit 15.
    """
    if kind not in NODE_FAULT_KINDS:
        raise ValueError(f"unknown node fault {kind!r} ({'|'.join(NODE_FAULT_KINDS)})")
    state = Path(state).resolve()
    root = _root(state)
    gpus = int(_read_json(root / "sim.json", {}).get("gpus", 8))
    rec: dict[str, Any] = {"kind": kind, "via": via}
    if kind == "low-nofile":
        limit = int(params.get("limit") or DEFAULT_LOW_NOFILE)
        if limit < 1024:
            raise ValueError("low-nofile: limit below 1024 would starve sshd itself")
        rec["limit"] = limit
    elif kind in ("hidden-gpu", "gpu-lost"):
        n = int(params["gpus"]) if params.get("gpus") is not None else gpus - 1
        if not 0 <= n <= gpus:
            raise ValueError(f"{kind}: gpus must be in 0..{gpus}")
        rec["gpus"] = n
    elif kind == "foreign-ray":
        rec["user"] = str(params.get("user") or "nobody")
        rec["survives_stop"] = bool(params.get("survives_stop", False))
    elif kind in ("gpu-foreign", "gpu-held", "gpu-error"):
        rec["gpu"] = int(params.get("gpu") or 0)
        if not 0 <= rec["gpu"] < gpus:
            raise ValueError(f"{kind}: gpu must be in 0..{gpus - 1}")
        if kind == "gpu-foreign":
            rec["user"] = str(params.get("user") or "nobody")
            rec["mib"] = int(params.get("mib") or DEFAULT_FOREIGN_GPU_MIB)
        elif kind == "gpu-held":
            rec["since"] = time.time()
            if params.get("mib"):
                rec["mib"] = int(params["mib"])
    elif kind == "no-python":
        other = _system_python(root)
        if other:
            raise RuntimeError(f"no-python cannot hide {other}: it is on the SSH PATH outside the node's bin/")
    _clear_kind(state, kind)
    if kind == "foreign-ray":
        rec.update(start_foreign_ray(root, rec["user"]))
    elif kind == "gpu-foreign":
        rec.update(start_gpu_foreign(root, rec["user"]))
    faults = _read_json(root / "faults.json", {})
    faults.setdefault("node", {})[kind] = rec
    _write_json(root / "faults.json", faults)
    if kind == "low-nofile":
        write_nofile(root)
    elif kind == "no-python":
        _sync_python(root)
    return rec


def _clear_kind(state: Path, kind: str) -> None:
    root = _root(state)
    faults = _read_json(root / "faults.json", {})
    node = faults.get("node") or {}
    had = node.pop(kind, None)
    if node:
        faults["node"] = node
    else:
        faults.pop("node", None)
    _write_json(root / "faults.json", faults)
    if kind == "low-nofile" and had:
        write_nofile(root)
    elif kind == "gpu-lost":
        (root / "state" / "gpus_lost.json").unlink(missing_ok=True)
    elif kind == "foreign-ray":
        stop_foreign_ray(root)
    elif kind == "gpu-foreign":
        stop_gpu_foreign(root)
    elif kind == "no-python":
        _sync_python(root)


def clear_node_faults(state: Path, via: str | None = None) -> None:
    """Switch node faults off: all of them, or those set through suite ``via``."""
    root = _root(Path(state).resolve())
    for kind, rec in node_faults(root).items():
        if via is None or via == "node" or rec.get("via") == via:
            _clear_kind(state, kind)
    # leftovers of a fault record lost by hand edits: never leave a foreign process or a lost GPU
    if via is None or via == "node":
        stop_foreign_ray(root)
        stop_gpu_foreign(root)
        (root / "state" / "gpus_lost.json").unlink(missing_ok=True)


def status(root: Path) -> dict[str, Any]:
    try:
        current: dict[str, Any] | None = settings(root)
    except (KeyError, TypeError, ValueError):
        current = None  # not built yet
    return {"settings": current,
            "nofile_hard_now": effective_nofile(root) if (root / "sim.json").exists() else None,
            "foreign_ray_pid": foreign_ray_pid(root),
            "gpu_foreign_pid": gpu_foreign_pid(root),
            "faults": node_faults(root)}
