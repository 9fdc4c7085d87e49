"""Operations on a GPU node over one SSH connection: worktree, prerequisites, fetch, cleanup (fetching in
``node.fetch``, GPU readings in ``node.gpu``).

Every function takes an open ``paramiko.SSHClient`` (from the SSH provider's ``SSHHook.get_conn()``
in the DAG, or built directly by the CLI and the tests), so the same code serves both. Scripts are
built by :mod:`rl_verify.node.remote` from validated, quoted values.
"""

from __future__ import annotations

import base64
import gzip
import json
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from rl_verify import settings
from rl_verify.core.names import short_sha
from rl_verify.node import launcher as launchers
from rl_verify.node import evidence_scripts, remote
# fetch_suite and gpu_line: through ops, the node layer's one face for orchestration, like every operation here.
from rl_verify.node.fetch import fetch_suite  # noqa: F401
from rl_verify.node.gpu import GPU_TAGS, gpu_line, gpu_problems, gpu_reading, gpu_release_line  # noqa: F401
from rl_verify.suites.spec import LANE_PACKAGES, NodeNeeds, SuiteSpec

if TYPE_CHECKING:
    import paramiko


class NodeError(RuntimeError):
    """The node could not do what was asked; the message says what and how to fix it."""


class PrerequisitesError(NodeError):
    """One or more inputs are missing or the node is busy; the message lists every item. ``result``: what the
    check saw (None where it could not run)."""

    def __init__(self, message: str, result: "Prerequisites | None" = None) -> None:
        super().__init__(message)
        self.result = result


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
    """Create (or re-use) the run's clean worktree at ``commit``; return SHA, paths and state, and ``tree``: the
    commit's tracked files (what the suites' path rules are checked against; too large for an XCom: the caller
    keeps what it concludes, not the list)."""
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
        "tree": gzip.decompress(base64.b64decode(kv["TREE_GZ_B64"])).decode("utf-8", errors="replace").splitlines(),
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


def changed_files(client: "paramiko.SSHClient", checkout: str, base: str, head: str) -> list[str] | None:
    """The paths that differ between commits ``base`` and ``head`` of the node checkout (both names of a
    rename), or None when ``base`` is not in the checkout (a verified PASS the node no longer has: nothing can be
    said, so nothing is skipped). Raises NodeError when git fails otherwise."""
    status, out, err = run_script(client, remote.changed_files_script(checkout, base, head))
    if status == 3 and err.strip().startswith("base:"):
        return None
    if status != 0:
        raise NodeError(f"listing the files changed since {short_sha(base)} failed (exit {status}): {err.strip()}")
    return [line for line in out.splitlines() if line]


def evidence_setup(client: "paramiko.SSHClient", evidence_dir: str, worktree: str,
                   python: str = "python3") -> dict[str, str]:
    """Prepare one job's executed-code evidence (issue 44); return what the job's environment adds: PYTHONPATH (the
    folder of the sitecustomize.py that starts coverage.py), COVERAGE_PROCESS_START and COVERAGE_CORE (sysmon
    where the interpreter has it: coverage.py falls back to its C tracer elsewhere). ``python``: the launch
    interpreter (its coverage.py's version decides the config, ``sh/evidence_setup.sh``)."""
    status, out, err = run_script(client, evidence_scripts.evidence_setup_script(evidence_dir, worktree, python))
    if status != 0:
        raise NodeError(f"could not prepare the executed-code evidence (exit {status}): {err.strip()}")
    kv = _kv(out)
    return {"PYTHONPATH": kv["SITE"], "COVERAGE_PROCESS_START": kv["CONFIG"], "COVERAGE_CORE": "sysmon"}


def evidence_config(client: "paramiko.SSHClient", evidence_dir: str, worktree: str, config: str, attribute: str,
                    value: int) -> str:
    """Write the lane's evidence run's config into its evidence folder (issue 53, the spec's ``evidence.stop_config``:
    the suite's ``config``, relative to the ``worktree``, run as it is, then ``attribute`` set to ``value``); return
    its path, the launch argument in place of ``config``. After :func:`evidence_setup` (which empties the folder)."""
    status, out, err = run_script(client, evidence_scripts.evidence_config_script(evidence_dir, worktree, config,
                                                                                  attribute, value))
    if status != 0:
        raise NodeError(f"could not write the evidence run's config (exit {status}): {err.strip()}")
    return _kv(out)["CONFIG"]


def evidence_read(client: "paramiko.SSHClient", evidence_dir: str, worktree: str, python: str,
                  compiled_re: str, work_dir: str, tracker_glob: str,
                  processes: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """The lines of the checkout every process of one job ran (``sh/evidence_read.sh``'s JSON), and ``last_step``: the
    last step-summary row the job's tracker (``work_dir``/``tracker_glob``) holds; a reading that cannot be had comes
    back with its problem named (no evidence, never a failure). ``processes``: the suite's expected kinds of process
    ((kind, ``path.py:qualname``) each, issue 53): the reading's ``kinds`` names the pids that proved each."""
    status, out, err = run_script(client, evidence_scripts.evidence_read_script(
        evidence_dir, worktree, python, compiled_re, work_dir, tracker_glob, processes))
    try:
        return json.loads(out.strip().splitlines()[-1]) if status == 0 and out.strip() else \
            {"files": {}, "processes": 0, "problems": [f"the evidence could not be read (exit {status}): "
                                                       f"{err.strip()[-300:]}"]}
    except ValueError as exc:
        return {"files": {}, "processes": 0, "problems": [f"the evidence reading is not JSON: {exc}"]}


def changed_lines(client: "paramiko.SSHClient", checkout: str, base: str, head: str) -> str | None:
    """The diff ``base``..``head`` as ``sh/changed_lines.sh`` prints it (``core.evidence.read_changes`` reads it),
    or None when ``base`` is not in the checkout. Raises NodeError when git fails otherwise."""
    status, out, err = run_script(client, evidence_scripts.changed_lines_script(checkout, base, head))
    if status == 3 and err.strip().startswith("base:"):
        return None
    if status != 0:
        raise NodeError(f"reading the diff since {short_sha(base)} failed (exit {status}): {err.strip()}")
    return out


def tree_files(client: "paramiko.SSHClient", checkout: str, sha: str) -> list[str] | None:
    """The tracked files of commit ``sha`` of the node checkout (what the suites' path rules are checked against),
    or None when the commit is not in it. Raises NodeError when git fails otherwise."""
    status, out, err = run_script(client, remote.tree_files_script(checkout, sha))
    if status == 3:
        return None
    if status != 0:
        raise NodeError(f"listing the files of {short_sha(sha)} failed (exit {status}): {err.strip()}")
    return [line for line in out.splitlines() if line]


@dataclass
class Prerequisites:
    ok: list[dict[str, str]] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    #: The live jobs of other runs behind ``busy``: ``run_dir``, ``run`` (its key, the marker), ``suite``, ``pid``.
    busy_jobs: list[dict[str, str]] = field(default_factory=list)
    #: What the node showed of its readiness (NOFILE, GPUS, PYTHON, PORT, RAYLOG lines), by kind.
    readiness: dict[str, Any] = field(default_factory=dict)
    #: Why the node is not ready for the launch scripts, each with its fix (``readiness_problems``).
    unready: list[str] = field(default_factory=list)
    #: The node's environment (issue 33): gpu, gpu_count, driver, cuda and ``packages`` (name -> version or
    #: None), what a deterministic run's bits depend on beyond the checkout.
    environment: dict[str, Any] = field(default_factory=dict)
    #: A Slurm target's: how many jobs of the suites' GPU count its partition runs at once (None: not Slurm).
    slots: int | None = None

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


#: What the ENV lines of ``sh/prerequisites.sh`` say of the node.
ENVIRONMENT_FACTS = ("gpu", "gpu_count", "driver", "cuda")


def environment_packages(specs: Iterable[SuiteSpec]) -> list[str]:
    """The packages whose versions make the environment's fingerprint: every suite's lane's list (its
    ``bitwise.packages``), else the default list (``suites.spec.LANE_PACKAGES``), each once."""
    out: list[str] = []
    for spec in specs:
        out += list(spec.bitwise.packages if spec.bitwise else LANE_PACKAGES)
    return list(dict.fromkeys(out))


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
            result.busy_jobs.append({"run_dir": run_dir, "run": posixpath.basename(run_dir), "suite": suite,
                                     "pid": pid})
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
        elif parts[0] == "ENV" and len(parts) == 3 and parts[1] in ENVIRONMENT_FACTS:
            value = parts[2].strip()
            result.environment[parts[1]] = (int(value) if value.isdigit() else None) if parts[1] == "gpu_count" \
                else (value or None)
        elif parts[0] == "PKG" and len(parts) == 3:
            version = parts[2].strip()
            result.environment.setdefault("packages", {})[parts[1]] = None if version in ("", "-") else version
    if any(line.startswith(GPU_TAGS) for line in out.splitlines()):
        result.readiness["gpu"] = gpu_reading(out.splitlines())
    return result


def _iso(epoch: str) -> str:
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return epoch


def input_checks(specs: Iterable[SuiteSpec]) -> list[tuple[str, str, str]]:
    """(suite, kind, path) of every input of every suite, in spec order."""
    return [(spec.name, item.kind, item.path) for spec in specs for item in spec.inputs]


def read_environment(client: "paramiko.SSHClient", specs: list[SuiteSpec], runs_root: str, key: str,
                     needs: NodeNeeds | None = None) -> dict[str, Any] | None:
    """The node's environment as :func:`check_prerequisites` reads it, alone, for a decision that cannot wait for
    that check (issue 53: PASS (unchanged) by evidence rests on its own environment's); None: cannot be read."""
    script = remote.prerequisites_script([], runs_root, key, needs=needs or merged_needs(specs),
                                         env_packages=environment_packages(specs))
    status, out, _ = run_script(client, script)
    return parse_prerequisites(out).environment or None if status == 0 else None


def check_prerequisites(client: "paramiko.SSHClient", specs: list[SuiteSpec], runs_root: str,
                        key: str, needs: NodeNeeds | None = None, user: str = "the SSH user",
                        launcher: Mapping[str, Any] | None = None, conn_id: str = "the node") -> Prerequisites:
    """Check all inputs of all ``specs``, node business and the node's readiness for their launch
    scripts (``needs``, default ``merged_needs(specs)``) in ONE round trip.

    Raises PrerequisitesError listing every missing item, every busy reason and every readiness
    problem (each with its fix) at once. ``launcher`` (``launcher.launcher_config``'s dict): on a Slurm target the
    same round trip asks Slurm whether the partition is up and would take this run's job (``sbatch --test-only``:
    account, QOS, GRES), instead of the node's GPUs and whether it is busy.
    """
    needs = merged_needs(specs) if needs is None else needs
    slurm = launcher if launcher and launcher.get("kind") == launchers.SLURM else None
    # On a Slurm target the connection reaches a login node: the GPUs, Ray ports and open-files limit are the
    # compute node's, and whether one is free is Slurm's to say (its check below, in the same round trip).
    checked = NodeNeeds() if slurm else needs
    script = remote.prerequisites_script(input_checks(specs), runs_root, key, needs=checked,
                                         env_packages=None if slurm else environment_packages(specs))
    if slurm:  # each in its own subshell: the inputs' script ends with its own exit
        script = f"(\n{script}\n)\n(\n{launchers.launcher_for(slurm).check(needs.gpus or 0)}\n)\n"  # type: ignore[union-attr]
    status, out, err = run_script(client, script)
    if status != 0:
        raise NodeError(f"prerequisite check could not run on the node (exit {status}): {err.strip()}")
    result = parse_prerequisites(out)
    result.unready = readiness_problems(checked, result.readiness, user)
    if slurm:
        result.busy = []  # placement is Slurm's: a job of another run only queues this one
        result.unready, result.slots = launchers.parse_check(out, slurm, needs.gpus or 0, conn_id)
    if result.problems():
        fixes = []
        if result.missing:
            fixes.append("provide the missing inputs (check CI_SHARE_MODEL/CI_SHARE_DATA/CI_SHARE_BASELINE)")
        if result.busy:
            fixes.append("wait for the running training to finish")
        if result.unready:
            fixes.append("make the node ready as each line says" if not slurm else "fix the Slurm fields as each "
                         "line says")
        raise PrerequisitesError(
            f"{len(result.problems())} prerequisite problem(s) on the node; nothing was launched:\n"
            + "\n".join(f"  - {p}" for p in result.problems())
            + f"\nFix: {'; '.join(fixes)}.", result)
    return result


def slurm_slots(client: "paramiko.SSHClient", launcher: Mapping[str, Any], gpus: int, conn_id: str) -> int:
    """How many jobs of ``gpus`` GPUs a Slurm target's partition runs at once (its ``sbatch --test-only`` and state
    checked in the same round trip); raises PrerequisitesError naming every field Slurm refuses."""
    status, out, err = run_script(client, launchers.launcher_for(launcher).check(gpus))  # type: ignore[union-attr]
    problems, slots = launchers.parse_check(out, launcher, gpus, conn_id)
    if status != 0 or problems:
        raise PrerequisitesError("\n".join(problems) or f"the Slurm check could not run (exit {status}): {err}")
    return max(1, slots or 1)


def reap(client: "paramiko.SSHClient", runs_root: str, checkout: str, keep_key: str,
         max_age_days: int) -> list[str]:
    """Remove run folders older than ``max_age_days`` with no live job; return what was removed."""
    status, out, err = run_script(client, remote.reap_script(runs_root, checkout, keep_key, max_age_days))
    if status != 0:
        raise NodeError(f"reaping old run folders failed (exit {status}): {err.strip()}")
    return [line[len("REAPED "):] for line in out.splitlines() if line.startswith("REAPED ")]


def cleanup(client: "paramiko.SSHClient", run_dir: str, key: str, launcher: Mapping[str, Any] | None = None,
            jobs: Iterable[str] = ()) -> list[str]:
    """Stop every process of the run and Ray, wait (bounded) until no process of the run holds GPU memory;
    return what was done (one line per action), the last line the GPUs' (``gpu_release_line``). On a Slurm target
    (``launcher``): every job of the run (``jobs``, and any Slurm holds under the run's name) cancelled, waited for
    until Slurm shows none running; a ``LEFT`` line for each still there."""
    chosen = launchers.launcher_for(launcher)
    status, out, err = run_script(client, chosen.cleanup(run_dir, key, list(jobs)),
                                  timeout=180 + max(settings.GPU_RELEASE_WAIT_S, settings.SLURM_STOP_WAIT_S))
    lines = [line for line in (out + err).splitlines() if line.strip()]
    if status != 0:
        raise NodeError(f"cleanup failed (exit {status}): {err.strip()}")
    gpu = [line for line in lines if line.startswith(GPU_TAGS)]
    rest = [line for line in lines if not line.startswith(GPU_TAGS)]
    return rest + ([gpu_release_line(gpu_reading(gpu))] if gpu else [])


def hardware(client: "paramiko.SSHClient") -> str | None:
    """The node's GPUs in one line (``8x NVIDIA H200``) from ``nvidia-smi -L``; None when it cannot say."""
    from collections import Counter

    status, out, _ = run_script(client, "nvidia-smi -L 2>/dev/null\n", timeout=60)
    names = [line.split(": ", 1)[1].split(" (UUID")[0] for line in out.splitlines()
             if line.startswith("GPU ") and ": " in line]
    if status != 0 or not names:
        return None
    return ", ".join(f"{n}x {name}" for name, n in Counter(names).items())
