"""The node's GPUs as nvidia-smi shows them (``sh/lib_gpu.sh``'s gpu_state lines): readings, what keeps a GPU
from being free for this run, and the one line cleanup ends with. Pure parsing; nothing here opens a connection."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from rl_verify import settings

#: Lines of sh/lib_gpu.sh's gpu_state.
GPU_TAGS = ("GPUMEM\t", "GPUAPP\t", "GPUERR\t", "GPUWAIT\t")
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
    GPU's index, ``user``, ``whose``: own|other|gone, ``cmd``, ``job``: the job marker ``<run key>/<job>`` of
    another rl-verify run it carries or None, ``job_state``: live|ended|unknown or None; ``attribution`` says what
    they make of it), and why nvidia-smi could not say (errors)."""

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
                user, whose, cmd, job, job_state = (extra + ["-", "other", "-", "-", "-"][len(extra):])[:5]
                rows.append({**apps[0], "user": user, "whose": whose, "cmd": cmd,
                             "job": None if job == "-" else job,
                             "job_state": None if job == "-" or job_state == "-" else job_state})
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


#: Whose a GPU process is (``attribution``): this run's; another rl-verify run's live job (waited for, never
#: stopped); a leftover of another rl-verify run whose job has ended; a process with another rl-verify run's job
#: marker whose job folder this node's runs root does not hold (live or not, the node cannot say); anything else
#: on the node (another user's, a process without a marker); no process of the node.
OWN, LIVE_RUN, ENDED_RUN, UNKNOWN_RUN, FOREIGN, GONE = "own", "live run", "ended run", "unknown run", "foreign", "gone"


def attribution(app: Mapping[str, Any]) -> str:
    """Whose the GPU process ``app`` is (one of ``OWN`` .. ``GONE``): the node script's ``whose``, and for another's
    process the job marker of another rl-verify run it carries with that job's state."""
    if app["whose"] in ("own", "gone"):
        return OWN if app["whose"] == "own" else GONE
    if not app.get("job"):
        return FOREIGN
    return {"live": LIVE_RUN, "ended": ENDED_RUN}.get(app.get("job_state") or "", UNKNOWN_RUN)


def run_of(app: Mapping[str, Any]) -> str:
    """"run K, suite S" of the rl-verify job marker ``K/S`` a GPU process carries, in the busy line's words."""
    key, _, job = app["job"].rpartition("/")
    return f"run {key}, suite {job}"


def _fix_for(app: Mapping[str, Any], gpu: Mapping[str, Any]) -> str:
    """The fix for a GPU process that is not this run's: a live training of another run is waited for, never
    stopped (that would end a verification); a leftover or another user's process is stopped."""
    kind, pid = attribution(app), app["pid"]
    if kind == LIVE_RUN:
        return ("wait until that run's training ends (the node busy line names it, with since when), or train on "
                "another node. It is a live verification: leave it running")
    if kind == ENDED_RUN:
        return f"stop it (kill {pid}): its job is over and nothing of that run trains; or train on another node"
    if kind == UNKNOWN_RUN:
        return ("ask whoever runs rl-verify against this node whether that run still trains (its job is not in this "
                "deployment's runs folder: another deployment's run, or a leftover of a run whose folder was "
                f"reaped); only once it has ended, stop it (kill {pid}); or train on another node")
    if kind == GONE:
        return ("find it with nvidia-smi on the host; if no process holds the memory, reset the GPU as root once "
                f"nothing runs on it (nvidia-smi --gpu-reset -i {gpu['index']}) or reboot the node")
    who = app["user"] if app.get("user") not in (None, "", "-") else "its owner"
    return f"ask {who} to stop it (a leftover of a crashed run: kill {pid}), or train on another node"


def _in_use_by(app: Mapping[str, Any]) -> str:
    """Whose a GPU process that is not this run's is, as its readiness line says it."""
    kind = attribution(app)
    if kind == LIVE_RUN:
        return f"the live training of rl-verify {run_of(app)}"
    if kind == ENDED_RUN:
        return f"a leftover of rl-verify {run_of(app)}, whose job has ended"
    if kind == UNKNOWN_RUN:
        return f"a process of rl-verify {run_of(app)}, not a job of this deployment's runs folder"
    return "a process that is not this run's"


def gpu_problems(reading: GpuReading, floor_mib: int) -> list[str]:
    """Why the node's GPUs are not free for a training, each with its fix: nvidia-smi failed or shows a GPU in an
    error state; a compute process that is not this run's (another rl-verify run's live training named as that run,
    to be waited for and never stopped; a leftover of an ended run, another user's or a foreign process, to be
    stopped); memory in use above ``floor_mib`` no process explains."""
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
            if attribution(app) == OWN:
                continue
            held = f"{app['used_mib']} MiB" if app["used_mib"] is not None else "memory nvidia-smi cannot measure"
            out.append(f"not ready: {_gpu_name(gpu)} is in use by {_in_use_by(app)}: {_holder(app)}, holding "
                       f"{held}{total}. The training would run out of GPU memory or run slow. "
                       f"Fix: {_fix_for(app, gpu)}")
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
        elif attribution(h) == LIVE_RUN:
            others.append(f"{words}: {_in_use_by(h)}")
        else:
            command = f"{h.get('user') or '?'}'s {(h.get('cmd') or h['name'])[:100]}"
            others.append(f"{words}: {command}" + (f" ({_in_use_by(h)})" if attribution(h) != FOREIGN else ""))
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


def gpu_line(lines: Iterable[str]) -> str | None:
    """Cleanup's GPU line among its ``lines`` (None: it did not read the GPUs)."""
    return next((line for line in lines if line.startswith((GPUS_FREE, GPUS_HELD, GPUS_UNREAD))), None)
