"""Operations on a GPU node over one SSH connection: worktree, prerequisites, fetch, cleanup.

Every function takes an open ``paramiko.SSHClient`` (from the SSH provider's ``SSHHook.get_conn()``
in the DAG, or built directly by the CLI and the tests), so the same code serves both. Scripts are
built by :mod:`rl_verify.node.remote` from validated, quoted values.
"""

from __future__ import annotations

import base64
import fnmatch
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from rl_verify import settings
from rl_verify.node import remote
from rl_verify.suites.spec import NodeNeeds, SuiteSpec

if TYPE_CHECKING:
    import paramiko

_EXP_FOLDER = re.compile(r"\d{14}")


class NodeError(RuntimeError):
    """The node could not do what was asked; the message says what and how to fix it."""


class PrerequisitesError(NodeError):
    """One or more inputs are missing or the node is busy; the message lists every item."""


def run_script(client: "paramiko.SSHClient", script: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run ``script`` with ``bash -s`` on the node (script on stdin); return (status, out, err)."""
    stdin, stdout, stderr = client.exec_command("bash -s", timeout=timeout)
    stdin.write(script)
    stdin.flush()
    stdin.channel.shutdown_write()
    out = stdout.read().decode("utf-8", errors="replace")
    err = stderr.read().decode("utf-8", errors="replace")
    return stdout.channel.recv_exit_status(), out, err


def read_file(client: "paramiko.SSHClient", path: str, max_bytes: int, timeout: float = 120) -> tuple[int, bytes]:
    """The bytes of the node's file ``path`` (at most ``max_bytes``) and the script's status (3: unreadable)."""
    stdin, stdout, _ = client.exec_command("bash -s", timeout=timeout)
    stdin.write(remote.read_file_script(path, max_bytes))
    stdin.flush()
    stdin.channel.shutdown_write()
    data = stdout.read()
    return stdout.channel.recv_exit_status(), data


def _kv(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isupper():
            values[key] = value
    return values


def resolve_commit(client: "paramiko.SSHClient", checkout: str, runs_root: str, key: str,
                   commit: str) -> dict[str, Any]:
    """Create (or re-use) the run's clean worktree at ``commit``; return SHA, paths and state."""
    script = remote.resolve_commit_script(checkout, runs_root, key, commit)
    status, out, err = run_script(client, script)
    if status != 0:
        raise NodeError(f"resolve_commit failed for commit {commit!r} (exit {status}): {err.strip()}")
    kv = _kv(out)
    dirty = base64.b64decode(kv["DIRTY_STAT_B64"]).decode() if kv.get("DIRTY_STAT_B64") else None
    return {
        "commit_ref": commit,
        "sha": kv["SHA"],
        "subject": base64.b64decode(kv.get("SUBJECT_B64", "")).decode().strip(),
        "run_dir": kv["RUN_DIR"],
        "worktree": kv["WORKTREE"],
        "dirty_stat": dirty,
        "warnings": [line for line in err.splitlines() if line.strip()],
    }


class RangeError(NodeError):
    """A bisection range the checkout refuses: ``param`` names the parameter to change (good or bad), ``fix`` how."""

    def __init__(self, message: str, param: str, fix: str) -> None:
        self.param, self.fix = param, fix
        super().__init__(message)


def commit_range(client: "paramiko.SSHClient", checkout: str, good: str, bad: str,
                 limit: int) -> tuple[int, list[dict[str, str]]]:
    """(commits after good, the range): good then each first-parent commit up to bad, oldest first, each with
    ``sha``, ``author``, ``date`` (ISO) and ``subject``; the list is empty when more than ``limit`` commits
    follow good. Raises ``RangeError`` naming the end that does not exist or is not an ancestor of bad."""
    status, out, err = run_script(client, remote.commit_range_script(checkout, good, bad, limit))
    message = err.strip().splitlines()[-1] if err.strip() else f"exit {status}"
    if status == 3:
        param, _, rest = message.partition(": ")
        raise RangeError(rest or message, param if param in ("good", "bad") else "good",
                         "give an existing branch, tag or SHA of the node's checkout")
    if status == 6:
        raise RangeError(message, "good", "give as good an older commit on bad's first-parent history (the last "
                         "verified PASS)")
    if status != 0:
        raise NodeError(f"listing the range {good}..{bad} failed (exit {status}): {err.strip()}")
    count, commits = 0, []
    for line in out.splitlines():
        fields = line.split("\t")
        if fields[0] == "COUNT":
            count = int(fields[1])
        elif len(fields) == 4:
            author, date, subject = (base64.b64decode(f).decode("utf-8", errors="replace").strip() for f in fields[1:])
            commits.append({"sha": fields[0], "author": author, "date": date, "subject": subject})
    return count, commits


@dataclass
class Prerequisites:
    ok: list[dict[str, str]] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    #: What the node showed of its readiness (NOFILE, GPUS, PYTHON, PORT, RAYLOG lines), by kind.
    readiness: dict[str, Any] = field(default_factory=dict)
    #: Why the node is not ready for the launch scripts, each with its fix (``readiness_problems``).
    unready: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "missing": self.missing, "busy": self.busy, "unready": self.unready}

    def problems(self) -> list[str]:
        """Every reason not to launch, one line each (missing inputs first)."""
        lines = [f"missing {m['kind']} for {m['suite']}: {m['path']}" for m in self.missing]
        return lines + self.busy + self.unready


def merged_needs(specs: Iterable[SuiteSpec], ray_ports: tuple[int, ...] | None = None,
                 ray_log: str | None = None) -> NodeNeeds:
    """What every one of ``specs``' launch scripts needs of one node (the largest limit and GPU count,
    every port); ``ray_ports``/``ray_log``: the node's own, when its launch script was adapted to others."""
    specs = list(specs)
    nofile = max((s.node.nofile for s in specs if s.node.nofile), default=None)
    gpus = max((s.node.gpus for s in specs if s.node.gpus), default=None)
    ports = tuple(dict.fromkeys(p for s in specs for p in s.node.ray_ports))
    python = next((s.node.python for s in specs if s.node.python), None)
    log_dir = next((s.node.ray_log for s in specs if s.node.ray_log), None)
    return NodeNeeds(nofile=nofile, gpus=gpus, ray_ports=(ray_ports or ports) if ports else (),
                     python=python, ray_log=(ray_log or log_dir) if log_dir else None)


def readiness_problems(needs: NodeNeeds, seen: Mapping[str, Any], user: str = "the SSH user",
                       floor_mib: int | None = None) -> list[str]:
    """Why the node is not ready for what ``needs`` says its launch scripts do, each with its fix (``floor_mib``:
    GPU memory no process explains that still leaves a GPU free, default ``settings.GPU_MEMORY_FLOOR_MIB``)."""
    out = []
    hard = seen.get("nofile")
    if needs.nofile and hard is not None and hard != "unlimited" and int(hard) < needs.nofile:
        out.append(f"not ready: {user}'s hard open-files limit is {hard}, below the {needs.nofile} the launch script "
                   f"sets (its `ulimit -n {needs.nofile}` under `set -e` would end it at once, before any tracker). "
                   f"Fix: raise it for {user} ({user} hard nofile {needs.nofile} in /etc/security/limits.conf, or "
                   "LimitNOFILE= of its session or service), then reconnect")
    gpus = seen.get("gpus")
    if needs.gpus and gpus is not None:
        count, visible = gpus
        if count != needs.gpus:
            out.append(f"not ready: the node shows {count} GPU(s) (nvidia-smi -L), the launch script waits "
                       f"(forever) for {needs.gpus}. Fix: bring back the missing GPU (driver, a failed device) or "
                       "train on another node")
        if visible != "<unset>":
            out.append(f"not ready: CUDA_VISIBLE_DEVICES={visible!r} is set in {user}'s SSH environment: the "
                       "launch scripts count and split the GPUs themselves. Fix: unset it (~/.bashrc, "
                       "~/.ssh/environment, /etc/environment or sshd's SetEnv)")
    if needs.python and "python" in seen and not seen["python"]:
        out.append(f"not ready: `{needs.python}` does not resolve on {user}'s PATH (the launch script calls "
                   f"`{needs.python}`, not python3). Fix: provide it for non-interactive SSH sessions (Debian: apt-get "
                   "install python-is-python3)")
    for port in seen.get("ports", []):
        if port["whose"] == "other":
            holder = f"process {port['pid']} of {port['user']}" if port["pid"] != "-" else \
                f"a process of {port['user']} (pid not visible to {user})"
            out.append(f"not ready: Ray port {port['port']} is held by {holder}"
                       + (f" ({port['cmd']})" if port["cmd"] != "-" else "")
                       + ": another user's Ray. The launch script's `ray stop --force` would kill it, and its `ray "
                         "start` needs the port. Fix: ask that user to stop it, or train on another node")
    ray_log = seen.get("ray_log")
    if ray_log and ray_log[1] != "-":
        out.append(f"not ready: {needs.ray_log} links to {ray_log[0]}, inside the folder of a live training "
                   f"({ray_log[1]}): the launch script's `rm -rf {needs.ray_log}` and re-link would take that run's "
                   "Ray logs. Fix: wait for it to end")
    if needs.gpus and seen.get("gpu") is not None:
        out += gpu_problems(seen["gpu"], settings.GPU_MEMORY_FLOOR_MIB if floor_mib is None else floor_mib)
    return out


def parse_prerequisites(out: str) -> Prerequisites:
    """Parse the output of :func:`remote.prerequisites_script`."""
    result = Prerequisites()
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] in ("OK", "MISSING") and len(parts) == 4:
            item = {"suite": parts[1], "kind": parts[2], "path": parts[3]}
            (result.ok if parts[0] == "OK" else result.missing).append(item)
        elif parts[0] == "BUSY" and len(parts) == 4:
            job_dir, pid, since = parts[1:]
            run_dir, suite = posixpath.dirname(posixpath.dirname(job_dir)), posixpath.basename(job_dir)
            result.busy.append(f"node busy: run {posixpath.basename(run_dir)}, suite {suite}, "
                               f"since {_iso(since)} (pid {pid})")
        elif parts[0] == "PROC" and len(parts) >= 3:
            result.busy.append(f"node busy: a training not started by this run is running "
                               f"(pid {parts[1]}: {parts[2][:160]})")
        elif parts[0] == "NOFILE" and len(parts) == 2:
            result.readiness["nofile"] = parts[1].strip()
        elif parts[0] == "GPUS" and len(parts) == 3:
            result.readiness["gpus"] = (int(parts[1]) if parts[1].isdigit() else 0, parts[2])
        elif parts[0] == "PYTHON" and len(parts) == 2:
            result.readiness["python"] = parts[1].strip()
        elif parts[0] == "PORT" and len(parts) == 6:
            result.readiness.setdefault("ports", []).append(dict(zip(("port", "user", "pid", "whose", "cmd"),
                                                                    parts[1:])))
        elif parts[0] == "RAYLOG" and len(parts) == 3:
            result.readiness["ray_log"] = (parts[1], parts[2])
    if any(line.startswith(_GPU_TAGS) for line in out.splitlines()):
        result.readiness["gpu"] = gpu_reading(out.splitlines())
    return result


# --- the GPUs, as nvidia-smi shows them (sh/lib_gpu.sh) -------------------------------------------------

#: Lines of sh/lib_gpu.sh's gpu_state.
_GPU_TAGS = ("GPUMEM\t", "GPUAPP\t", "GPUERR\t", "GPUWAIT\t")
#: A value nvidia-smi writes in brackets instead of a reading: [N/A] is "not available" (not an error), anything
#: else ([GPU requires reset], [Unknown Error], [Not Supported] on a field that must exist) says the GPU is not well.
_BRACKETED = re.compile(r"\[[^\]]*\]")


def _mib(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_gpu_query(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(GPUs, other lines) of ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total
    --format=csv,noheader,nounits``. Each GPU: ``index``, ``uuid``, ``name``, ``bus_id``, ``used_mib`` and
    ``total_mib`` (None where nvidia-smi gave no number) and ``error``: the first bracketed value other than
    [N/A] (e.g. ``memory.used '[GPU requires reset]'``), or None. Other lines are what nvidia-smi printed that is
    no GPU's row (``Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error``)."""
    fields = ("index", "uuid", "name", "pci.bus_id", "memory.used", "memory.total")
    gpus, other = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6 or not (f[0].isdigit() or _BRACKETED.fullmatch(f[0])):
            other.append(line.strip())
            continue
        row = [f[0], f[1], ", ".join(f[2:-3]), f[-3], f[-2], f[-1]]
        error = next((f"{name} {value!r}" for name, value in zip(fields, row)
                      if _BRACKETED.fullmatch(value) and value != "[N/A]"), None)
        if error is None and _mib(row[4]) is None:
            error = f"memory.used {row[4]!r}"
        gpus.append({"index": row[0], "uuid": row[1], "name": row[2], "bus_id": row[3], "used_mib": _mib(row[4]),
                     "total_mib": _mib(row[5]), "error": error})
    return gpus, other


def parse_compute_apps(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(processes, other lines) of ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name
    --format=csv,noheader,nounits``: one row per process and GPU, each ``uuid``, ``pid`` (int), ``used_mib``
    (None when nvidia-smi cannot say: [N/A]) and ``name``. An idle node prints nothing."""
    apps, other = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 4 or not f[1].isdigit():
            other.append(line.strip())
            continue
        apps.append({"uuid": f[0], "pid": int(f[1]), "used_mib": _mib(f[2]), "name": ", ".join(f[3:])})
    return apps, other


@dataclass
class GpuReading:
    """What one gpu_state (sh/lib_gpu.sh) showed: the GPUs, their compute processes (each with ``gpu``: the
    GPU's index, ``user``, ``whose``: own|other|gone, ``cmd``), and why nvidia-smi could not say (errors)."""

    gpus: list[dict[str, Any]] = field(default_factory=list)
    apps: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Cleanup only: how long it waited for the run's GPU memory (ms) and the run's pids on the GPUs before.
    waited_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "apps": self.apps, "errors": self.errors, "waited_ms": self.waited_ms}


def gpu_reading(lines: Iterable[str]) -> GpuReading:
    """Parse the GPUMEM/GPUAPP/GPUERR/GPUWAIT lines of sh/lib_gpu.sh (other lines are left alone)."""
    reading, smi, rows = GpuReading(), [], []
    for line in lines:
        tag, _, rest = line.partition("\t")
        if tag == "GPUMEM":
            smi.append(rest)
        elif tag == "GPUAPP":
            csv_line, *extra = rest.split("\t")
            apps, _ = parse_compute_apps(csv_line)
            if apps:
                user, whose, cmd = (extra + ["-", "other", "-"][len(extra):])[:3]
                rows.append({**apps[0], "user": user, "whose": whose, "cmd": cmd})
        elif tag == "GPUERR":
            query, status, said = (rest.split("\t") + ["", ""])[:3]
            reading.errors.append(f"nvidia-smi --query-{query} failed (exit {status}): {said.strip()!r}")
        elif tag == "GPUWAIT":
            waited = rest.split("\t")[0]
            reading.waited_ms = int(waited) if waited.isdigit() else None
    reading.gpus, other = parse_gpu_query("\n".join(smi))
    if not any(e.startswith("nvidia-smi --query-gpu ") for e in reading.errors):  # a failure quotes them already
        reading.errors += [f"nvidia-smi reports {line!r}" for line in other]
    index = {g["uuid"]: g["index"] for g in reading.gpus}
    reading.apps = [{**a, "gpu": index.get(a["uuid"], a["uuid"])} for a in rows]
    return reading


def _gpu_name(gpu: Mapping[str, Any]) -> str:
    return f"GPU {gpu['index']} ({gpu['bus_id']})" if gpu.get("bus_id") else f"GPU {gpu['index']}"


def _holder(app: Mapping[str, Any]) -> str:
    """"pid 4242 of user bob (python3 train.py --x)" as far as the node can tell."""
    words = f"pid {app['pid']}"
    if app["whose"] == "gone":
        return (words + f" ({app['name']}, no process of the node now: it exited and its GPU memory was never "
                        "released, or it runs in another container)")
    if app.get("user") not in (None, "", "-"):
        words += f" of user {app['user']}"
    cmd = app.get("cmd") if app.get("cmd") not in (None, "", "-") else app["name"]
    return words + f" ({cmd[:160]})"


def gpu_problems(reading: GpuReading, floor_mib: int) -> list[str]:
    """Why the node's GPUs are not free for a training, each with its fix: nvidia-smi failed or shows a GPU in an
    error state; a compute process that is not this run's; memory in use above ``floor_mib`` no process explains."""
    out = [f"not ready: {e}. Fix: check the GPUs and the driver on the node (nvidia-smi; dmesg for Xid errors); "
           "reset or replace the failed GPU, or train on another node" for e in reading.errors]
    for gpu in reading.gpus:
        if gpu["error"]:
            out.append(f"not ready: {_gpu_name(gpu)} is in an error state: nvidia-smi reports {gpu['error']}. Fix: "
                       f"reset it as root once nothing runs on it (nvidia-smi --gpu-reset -i {gpu['index']}), or "
                       "reboot the node; check dmesg for Xid errors")
            continue
        on_it = [a for a in reading.apps if a["gpu"] == gpu["index"]]
        total = f" of {gpu['total_mib']} MiB" if gpu["total_mib"] else ""
        for app in on_it:
            if app["whose"] == "own":
                continue
            held = f"{app['used_mib']} MiB" if app["used_mib"] is not None else "memory nvidia-smi cannot measure"
            if app["whose"] == "gone":
                fix = ("find it with nvidia-smi on the host; if no process holds the memory, reset the GPU as root "
                       f"once nothing runs on it (nvidia-smi --gpu-reset -i {gpu['index']}) or reboot the node")
            else:
                who = app["user"] if app.get("user") not in (None, "", "-") else "its owner"
                fix = (f"ask {who} to stop it (a leftover of a crashed run: kill {app['pid']}), or train on "
                       "another node")
            out.append(f"not ready: {_gpu_name(gpu)} is in use by a process that is not this run's: "
                       f"{_holder(app)}, holding {held}{total}. The training would run out of GPU memory or run "
                       f"slow. Fix: {fix}")
        if any(a["used_mib"] is None for a in on_it) or gpu["used_mib"] is None:
            continue
        unexplained = gpu["used_mib"] - sum(a["used_mib"] for a in on_it)
        if unexplained > floor_mib:
            out.append(f"not ready: {_gpu_name(gpu)} has {unexplained} MiB{total} in use that no compute process "
                       f"on the node explains (above the {floor_mib} MiB floor, RL_VERIFY_GPU_MEMORY_FLOOR_MIB): "
                       "a process in another container, or memory the driver never released. Fix: find it with "
                       "nvidia-smi on the host; if nothing holds it, reset the GPU as root (nvidia-smi --gpu-reset "
                       f"-i {gpu['index']}) or reboot the node")
    return out


#: How cleanup's GPU line begins (``gpu_release_line``).
GPUS_FREE, GPUS_HELD, GPUS_UNREAD = "GPUs free", "GPU memory still held by", "GPUs not read after the stop"


def gpu_release_line(reading: GpuReading, floor_mib: int | None = None) -> str:
    """Cleanup's one line on the GPUs after the run's stop: "GPU memory still held by pid P (N MiB)" for a process of
    the run, a listed pid that is no process any more (memory never released) or memory above the floor no process
    explains, each named, with the fix; else "GPUs free" (other users' live processes, which the run's wait does
    not wait for, are named after it: the next run's check refuses them)."""
    floor_mib = settings.GPU_MEMORY_FLOOR_MIB if floor_mib is None else floor_mib
    waited = f" (waited {reading.waited_ms / 1000:.1f} s)" if reading.waited_ms is not None else ""
    if reading.errors:
        return f"{GPUS_UNREAD}: " + "; ".join(reading.errors)
    holders: dict[int, dict[str, Any]] = {}
    for app in reading.apps:
        h = holders.setdefault(app["pid"], {**app, "mib": 0, "on": []})
        h["mib"] += app["used_mib"] or 0
        h["on"].append(str(app["gpu"]))
    held, others = [], []
    for pid, h in holders.items():
        words = f"pid {pid} ({h['mib']} MiB), on GPU {', '.join(h['on'])}"
        if h["whose"] == "own":
            held.append(f"{words}: a process of this run")
        elif h["whose"] == "gone":
            held.append(f"{words}: no process of the node now (exited, its memory never released)")
        else:
            others.append(f"{words}: {h.get('user') or '?'}'s {(h.get('cmd') or h['name'])[:100]}")
    listed = {str(a["gpu"]) for a in reading.apps}
    held += [f"{g['used_mib']} MiB on GPU {g['index']} (no process shown)" for g in reading.gpus
             if str(g["index"]) not in listed and (g["used_mib"] or 0) > floor_mib]
    if held:
        return (f"{GPUS_HELD} " + "; ".join(held) + f"{waited}. The next run on this node is refused until it is "
                "free. Fix: stop the process; if none holds the memory, reset the GPU as root (nvidia-smi "
                "--gpu-reset -i N) or reboot the node")
    if others:
        return (f"{GPUS_FREE} of this run's processes{waited}; in use by others (the next run is refused while they "
                "run): " + "; ".join(others))
    return f"{GPUS_FREE}: no compute process on the node's {len(reading.gpus)} GPU(s){waited}"


def _iso(epoch: str) -> str:
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return epoch


def input_checks(specs: Iterable[SuiteSpec]) -> list[tuple[str, str, str]]:
    """(suite, kind, path) of every input of every suite, in spec order."""
    return [(spec.name, item.kind, item.path) for spec in specs for item in spec.inputs]


def check_prerequisites(client: "paramiko.SSHClient", specs: list[SuiteSpec], runs_root: str,
                        key: str, needs: NodeNeeds | None = None, user: str = "the SSH user") -> Prerequisites:
    """Check all inputs of all ``specs``, node business and the node's readiness for their launch
    scripts (``needs``, default ``merged_needs(specs)``) in ONE round trip.

    Raises PrerequisitesError listing every missing item, every busy reason and every readiness
    problem (each with its fix) at once.
    """
    needs = merged_needs(specs) if needs is None else needs
    status, out, err = run_script(client, remote.prerequisites_script(input_checks(specs), runs_root, key,
                                                                      needs=needs))
    if status != 0:
        raise NodeError(f"prerequisite check could not run on the node (exit {status}): {err.strip()}")
    result = parse_prerequisites(out)
    result.unready = readiness_problems(needs, result.readiness, user)
    if result.problems():
        fixes = []
        if result.missing:
            fixes.append("provide the missing inputs (check CI_SHARE_MODEL/CI_SHARE_DATA/CI_SHARE_BASELINE)")
        if result.busy:
            fixes.append("wait for the running training to finish")
        if result.unready:
            fixes.append("make the node ready as each line says")
        raise PrerequisitesError(
            f"{len(result.problems())} prerequisite problem(s) on the node; nothing was launched:\n"
            + "\n".join(f"  - {p}" for p in result.problems())
            + f"\nFix: {'; '.join(fixes)}.")
    return result


# --- fetching ------------------------------------------------------------------------------------

def _listdir(sftp: "paramiko.SFTPClient", path: str) -> list["paramiko.SFTPAttributes"]:
    """The entries of ``path`` by name ([] if it does not exist): the server's own order is the filesystem's
    hash order, which changed the report's list of logs with the hour stamped in their names."""
    try:
        return sorted(sftp.listdir_attr(path), key=lambda attr: attr.filename)
    except FileNotFoundError:
        return []


def _get(sftp: "paramiko.SFTPClient", remote_path: str, local: Path) -> dict[str, Any]:
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(local.name + ".part")
    try:
        sftp.get(remote_path, str(tmp))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(local)
    return {"remote": remote_path, "local": str(local), "bytes": local.stat().st_size}


def _get_file(sftp: "paramiko.SFTPClient", remote_path: str, local: Path, what: str,
              problems: list[str]) -> dict[str, Any] | None:
    """Copy a regular file; a missing, non-regular or unreadable one becomes a listed problem."""
    try:
        if not stat.S_ISREG(sftp.stat(remote_path).st_mode or 0):
            problems.append(f"{what} unreadable or missing (not a regular file): {remote_path}")
            return None
        return _get(sftp, remote_path, local)
    except OSError as err:
        problems.append(f"{what} unreadable or missing ({err.strerror or err}): {remote_path}")
        return None


def _mtime(sftp: "paramiko.SFTPClient", path: str) -> float | None:
    try:
        return float(sftp.stat(path).st_mtime)
    except FileNotFoundError:
        return None


def experiment_folders(sftp: "paramiko.SFTPClient", work_dir: str, tracker_glob: str) -> list[str]:
    """Remote tracker paths of every 14-digit experiment folder in ``work_dir``, oldest first
    (whether or not the tracker exists yet)."""
    first, _, rest = tracker_glob.partition("/")
    names = sorted(a.filename for a in _listdir(sftp, work_dir)
                   if stat.S_ISDIR(a.st_mode or 0) and fnmatch.fnmatch(a.filename, first)
                   and _EXP_FOLDER.fullmatch(a.filename))
    return [posixpath.join(work_dir, name, rest) for name in names]


def _get_tree(sftp: "paramiko.SFTPClient", remote_dir: str, local_dir: Path) -> list[dict[str, Any]]:
    files = []
    for attr in _listdir(sftp, remote_dir):
        if attr.filename in ("__pycache__",) or attr.filename.startswith("."):
            continue
        src = posixpath.join(remote_dir, attr.filename)
        if stat.S_ISDIR(attr.st_mode or 0):
            files += _get_tree(sftp, src, local_dir / attr.filename)
        elif stat.S_ISREG(attr.st_mode or 0):
            files.append(_get(sftp, src, local_dir / attr.filename))
    return files


def fetch_suite(client: "paramiko.SSHClient", spec: SuiteSpec, layout: remote.RunLayout,
                dest: Path, with_baseline: bool = True, job: str | None = None) -> dict[str, Any]:
    """Copy the suite's newest tracker, logs, baseline and (GRPO) checker into ``dest``.

    Never raises for a missing file: what is absent is listed under ``problems`` so the caller
    decides; everything that exists is archived (a record is never lost because a run failed).
    ``with_baseline=False`` leaves out the suite's baseline tracker (a calibration makes its own);
    ``job``: the job's name when it is not the suite's (a repeat, ``<suite>-r<k>``).
    """
    sftp = client.open_sftp()
    work_dir, job_dir = layout.work_dir(job or spec.name), layout.job_dir(job or spec.name)
    meta: dict[str, Any] = {"suite": spec.name, "work_dir": work_dir, "job_dir": job_dir,
                            "files": {}, "problems": [], "other_experiments": []}
    try:
        stalled = posixpath.join(work_dir, ".rl-verify-stalled")
        if _mtime(sftp, stalled) is not None:
            with sftp.open(stalled) as fh:
                step = fh.read().decode(errors="replace").strip() or "?"
            meta["problems"].append(f"stalled at step {step}: the tracker stopped growing and the "
                                    "node-side watchdog killed the job")
        trackers = experiment_folders(sftp, work_dir, spec.tracker)
        if not trackers:
            meta["problems"].append(f"no tracker: no experiment folder matches {work_dir}/{spec.tracker}")
        else:
            # The newest launch is the one under test: an older folder's tracker is never used
            # in its place (that would evaluate a stale training as this run's).
            meta["other_experiments"] = trackers[:-1]
            if _mtime(sftp, trackers[-1]) is None:
                meta["problems"].append(f"no tracker in the newest experiment folder: {trackers[-1]}")
            else:
                got = _get_file(sftp, trackers[-1], dest / "tracker.jsonl", "tracker", meta["problems"])
                if got:
                    meta["files"]["tracker"] = got
        logs = []
        for attr in _listdir(sftp, work_dir):
            if stat.S_ISREG(attr.st_mode or 0) and any(fnmatch.fnmatch(attr.filename, p) for p in spec.logs):
                logs.append(_get(sftp, posixpath.join(work_dir, attr.filename), dest / "logs" / attr.filename))
        for name in ("stdout.log", "trace.log", "exit_code"):
            if _mtime(sftp, posixpath.join(job_dir, name)) is not None:
                logs.append(_get(sftp, posixpath.join(job_dir, name), dest / "logs" / f"job_{name}"))
        meta["files"]["logs"] = logs
        if spec.baseline and with_baseline:
            got = _get_file(sftp, spec.baseline, dest / settings.BASELINE_TRACKER_FILE, "baseline tracker",
                            meta["problems"])
            if got:
                meta["files"]["baseline"] = got
        if spec.reference_baseline:
            if _mtime(sftp, spec.reference_baseline) is None:
                meta["reference_baseline_missing"] = spec.reference_baseline
            else:
                got = _get_file(sftp, spec.reference_baseline, dest / settings.BASELINE_TRACKER_FILE,
                                "reference baseline", meta.setdefault("notes", []))
                if got:
                    meta["files"]["baseline"] = got
        if spec.checker_dir:
            utils = posixpath.join(spec.checker_dir, "utils")
            got = _get_tree(sftp, utils, dest / "checker" / "autotest" / "utils")
            meta["files"]["checker"] = got
            if not got:
                meta["problems"].append(f"checker missing: {utils}/check_metric.py")
        started = _mtime(sftp, posixpath.join(job_dir, "pid"))
        ended = _mtime(sftp, posixpath.join(job_dir, "exit_code"))
        meta["wall_time_s"] = (ended - started) if started and ended else None
        exit_code = dest / "logs" / "job_exit_code"
        meta["exit_code"] = int(exit_code.read_text().strip() or -1) if exit_code.exists() else None
    finally:
        sftp.close()
    return meta


def reap(client: "paramiko.SSHClient", runs_root: str, checkout: str, keep_key: str,
         max_age_days: int) -> list[str]:
    """Remove run folders older than ``max_age_days`` with no live job; return what was removed."""
    status, out, err = run_script(client, remote.reap_script(runs_root, checkout, keep_key, max_age_days))
    if status != 0:
        raise NodeError(f"reaping old run folders failed (exit {status}): {err.strip()}")
    return [line[len("REAPED "):] for line in out.splitlines() if line.startswith("REAPED ")]


def cleanup(client: "paramiko.SSHClient", run_dir: str, key: str) -> list[str]:
    """Stop every process of the run and Ray, wait (bounded) until no process of the run holds GPU memory;
    return what was done (one line per action), the last line the GPUs' (``gpu_release_line``)."""
    status, out, err = run_script(client, remote.cleanup_script(run_dir, key),
                                  timeout=180 + settings.GPU_RELEASE_WAIT_S)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    if status != 0:
        raise NodeError(f"cleanup failed (exit {status}): {err.strip()}")
    gpu = [line for line in lines if line.startswith(_GPU_TAGS)]
    rest = [line for line in lines if not line.startswith(_GPU_TAGS)]
    return rest + ([gpu_release_line(gpu_reading(gpu))] if gpu else [])


def gpu_line(lines: Iterable[str]) -> str | None:
    """Cleanup's GPU line among its ``lines`` (None: it did not read the GPUs)."""
    return next((line for line in lines if line.startswith((GPUS_FREE, GPUS_HELD, GPUS_UNREAD))), None)


def hardware(client: "paramiko.SSHClient") -> str | None:
    """The node's GPUs in one line (``8x NVIDIA H200``) from ``nvidia-smi -L``; None when it cannot say."""
    from collections import Counter

    status, out, _ = run_script(client, "nvidia-smi -L 2>/dev/null\n", timeout=60)
    names = [line.split(": ", 1)[1].split(" (UUID")[0] for line in out.splitlines()
             if line.startswith("GPU ") and ": " in line]
    if status != 0 or not names:
        return None
    return ", ".join(f"{n}x {name}" for name, n in Counter(names).items())
