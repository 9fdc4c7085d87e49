"""How a training job reaches the GPUs: the launcher seam (issue 45).

One interface, the verbs of XTuner's own CI client (clusterx): **run** a job, its **status**, its **log**, **stop**
it; plus the run's **cleanup** and the **check** the cluster answers before the card. Each verb returns the bash
script that does it on the machine the node's SSH connection reaches (``node.ops.run_script`` runs it there), so
the operator, the trigger and the cleanup stay launcher-blind: they hold a launcher's config (a plain dict, what a
trigger serialises) and call :func:`launcher_for`.

- ``ssh`` (:class:`SshLauncher`): a detached job on the named node; rl-verify keeps the node exclusive (its pool of
  one slot, the busy check), stops the job by its process group and marker, and cleans up (``sh/job_*.sh``,
  ``sh/stop.sh``): today's behaviour, unchanged.
- ``slurm`` (:class:`SlurmLauncher`): the connection reaches a login node; the job is ``sbatch --parsable`` with the
  suite's GPUs as GRES, named ``rlv.<run key>.<job>``, in the connection's partition, account and QOS, its output in
  the run's folder on the shared filesystem. Slurm owns placement, exclusivity, queueing and the stop (``scancel``);
  the tracker and logs are read through the login node as before (``sh/slurm_*.sh``, ``sh/lib_slurm.sh``).

A third launcher (Kubernetes, clusterx) is one more class with these verbs and one more ``kind``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from rl_verify import settings
from rl_verify.node import remote, slurm_states
from rl_verify.node.remote import BadInput

SSH, SLURM = "ssh", "slurm"
KINDS = (SSH, SLURM)
#: The connection extras the Slurm launcher reads (lower-case keys), each with what it is.
SLURM_FIELDS = {
    "slurm_partition": "the partition the jobs run in (required)",
    "slurm_account": "the account the jobs are charged to (--account)",
    "slurm_qos": "the quality of service (--qos)",
    "slurm_time": "the jobs' time limit (--time, e.g. 02:00:00); default: the partition's",
    "slurm_pending_limit_s": "seconds a job may wait in the queue before the run gives up, naming Slurm's reason",
    "slurm_unreachable_s": "seconds Slurm may not answer (slurmctld restarting, failing over) before a watched job "
                           "is given up as unknown",
    "slurm_gpu_type": "the GPU type of a mixed partition's GRES (--gres=gpu:<type>:<n>, e.g. h200)",
    "slurm_constraint": "node features the jobs need (--constraint, e.g. h200&ib)",
    "slurm_exclusive": "whole nodes for each job (--exclusive; default true: a training wants its node's CPUs, "
                       "memory and GPUs, and Ray would otherwise get what cgroups leave it)",
    "slurm_cpus_per_task": "CPUs of each job (--cpus-per-task) where the node is shared",
    "slurm_mem": "memory of each job (--mem, e.g. 512G; 0: all of the node's)",
}
_SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_SLURM_TIME = re.compile(r"(\d+-)?\d{1,3}(:\d{2}){0,2}")
_SLURM_FEATURES = re.compile(r"[A-Za-z0-9_.&|:*\[\]()!-]{1,200}")
_SLURM_MEM = re.compile(r"\d{1,9}[KMGT]?")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _placement(extra: Mapping[str, Any], config: dict[str, Any], problems: list[str]) -> None:
    """The placement extras of a Slurm connection into ``config``; each bad one named in ``problems``."""
    gpu_type = extra.get("slurm_gpu_type")
    if gpu_type not in (None, "") and not (isinstance(gpu_type, str) and _SLURM_NAME.fullmatch(gpu_type)
                                           and ":" not in gpu_type):
        problems.append(f"extra 'slurm_gpu_type' is {gpu_type!r}: a GRES type is letters, digits, _ . - (sinfo -o "
                        "%G shows them: gpu:<type>:<count>)")
    config["gpu_type"] = gpu_type or None
    constraint = extra.get("slurm_constraint")
    if constraint not in (None, "") and not (isinstance(constraint, str) and _SLURM_FEATURES.fullmatch(constraint)):
        problems.append(f"extra 'slurm_constraint' is {constraint!r}: node features joined by & | (letters, digits, "
                        "_ . - [ ] * ! ( ) :), e.g. h200&ib")
    config["constraint"] = constraint or None
    exclusive = extra.get("slurm_exclusive", True)
    word = str(exclusive).strip().lower()
    if word not in _TRUE + _FALSE:
        problems.append(f"extra 'slurm_exclusive' is {exclusive!r}: give true or false")
    config["exclusive"] = word not in _FALSE
    cpus = extra.get("slurm_cpus_per_task")
    config["cpus_per_task"] = None
    if cpus not in (None, ""):
        if isinstance(cpus, bool) or not str(cpus).isdigit() or int(cpus) < 1:
            problems.append(f"extra 'slurm_cpus_per_task' is {cpus!r}: give a whole number of CPUs (at least 1)")
        else:
            config["cpus_per_task"] = int(cpus)
    mem = extra.get("slurm_mem")
    if mem not in (None, "") and not (isinstance(mem, (str, int)) and not isinstance(mem, bool)
                                      and _SLURM_MEM.fullmatch(str(mem))):
        problems.append(f"extra 'slurm_mem' is {mem!r}: give a size as sbatch --mem takes it (512G, 400000M; 0: "
                        "all of the node's)")
    config["mem"] = str(mem) if mem not in (None, "") else None
def launcher_config(extra: Mapping[str, Any], conn_id: str = "the node") -> dict[str, Any]:
    """The launcher of a node connection, from its extras: ``{"kind": "ssh"}`` (no ``launcher`` key, the default)
    or ``{"kind": "slurm", "partition", "account", "qos", "time", "pending_limit_s", "unreachable_s"}``. Raises
    BadInput naming every bad field and its fix."""
    kind = str(extra.get("launcher") or SSH).strip().lower()
    if kind not in KINDS:
        raise BadInput(f"connection {conn_id!r}: extra 'launcher' is {extra.get('launcher')!r}; use one of "
                       f"{', '.join(KINDS)} (none: ssh)")
    if kind == SSH:
        return {"kind": SSH}
    problems = []
    config: dict[str, Any] = {"kind": SLURM}
    for field in ("slurm_partition", "slurm_account", "slurm_qos"):
        value = extra.get(field)
        if value in (None, ""):
            if field == "slurm_partition":
                problems.append("extra 'slurm_partition' is missing: name the partition the jobs run in "
                                "(sinfo -s lists them)")
            config[field.removeprefix("slurm_")] = None
        elif not isinstance(value, str) or not _SLURM_NAME.fullmatch(value):
            problems.append(f"extra {field!r} is {value!r}: a Slurm name is letters, digits, _ . - (at most 64)")
        else:
            config[field.removeprefix("slurm_")] = value
    time_limit = extra.get("slurm_time")
    if time_limit not in (None, "") and not (isinstance(time_limit, str) and _SLURM_TIME.fullmatch(time_limit)):
        problems.append(f"extra 'slurm_time' is {time_limit!r}: give [days-]hours:minutes:seconds, e.g. 02:00:00")
    config["time"] = time_limit or None
    limits = (("slurm_pending_limit_s", settings.SLURM_PENDING_LIMIT_S, "0: wait without a limit"),
              ("slurm_unreachable_s", settings.SLURM_UNREACHABLE_S, "0: give up at once"))
    for field, default, zero in limits:
        given = extra.get(field, default)
        try:
            config[field.removeprefix("slurm_")] = int(given)
            if config[field.removeprefix("slurm_")] < 0 or isinstance(given, bool):
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"extra {field!r} is {given!r}: give whole seconds ({zero})")
    _placement(extra, config, problems)
    if problems:
        raise BadInput(f"connection {conn_id!r} (launcher slurm): " + "; ".join(problems))
    return config


def slurm_job_name(key: str, job: str) -> str:
    """The Slurm job name of one job of one run: ``rlv.<run key>.<job>`` (how a retry and the cleanup find it)."""
    return f"rlv.{remote.validate_key(key)}.{remote.validate_suite_name(job)}"


def render(template: str, **values: Any) -> str:
    """``remote.render`` for the launchers' scripts (the same quoting rules)."""
    return remote.render(template, **values)


def slurm_library() -> str:
    """``lib_slurm.sh`` rendered with the one table of Slurm's states (``slurm_states``) and its time bounds."""
    return render("lib_slurm", **slurm_states.shell_lists(), slurm_settle_s=settings.SLURM_SETTLE_S,
                  slurm_ask_s=settings.SLURM_ASK_TIMEOUT_S)


class Launcher(Protocol):
    """The verbs of a launcher; each returns the script that does it on the node connection's machine."""

    kind: str

    def run(self, job_dir: str, command: str, environment: Mapping[str, str], key: str, job: str,
            gpus: int) -> str:
        """Start ``command`` as job ``job`` of run ``key`` in ``job_dir`` (a job this run already holds is kept)."""

    def status(self, job_dir: str) -> str:
        """One line: ``absent``, ``pending <reason>``, ``running``, ``finished``, ``ended <how>`` or ``dead``."""

    def log(self, job_dir: str, offset: int, max_bytes: int) -> str:
        """The ``job_poll`` look: exit code, log offset and size, seconds running, [scheduler state], bytes."""

    def stop(self, job_dir: str, marker: str, ended_as: str = "") -> str:
        """Stop one job and everything it started (``ended_as``: the end a scheduler's job is recorded with)."""

    def cleanup(self, run_dir: str, key: str, jobs: Sequence[str]) -> str:
        """Stop every job of the run; wait (bounded) until none runs; LEFT lines for what is left."""


@dataclass(frozen=True)
class SshLauncher:
    """A detached job on the named node (``sh/job_submit.sh``): rl-verify keeps the node exclusive."""

    kind: str = SSH

    def run(self, job_dir: str, command: str, environment: Mapping[str, str], key: str, job: str,
            gpus: int) -> str:
        return remote.submit_job_script(job_dir, command, environment)

    def status(self, job_dir: str) -> str:
        return remote.job_state_script(job_dir)

    def log(self, job_dir: str, offset: int, max_bytes: int) -> str:
        return remote.job_poll_script(job_dir, offset, max_bytes)

    def stop(self, job_dir: str, marker: str, ended_as: str = "") -> str:
        return remote.kill_job_script(job_dir, marker)

    def cleanup(self, run_dir: str, key: str, jobs: Sequence[str]) -> str:
        return remote.cleanup_script(run_dir, key)


@dataclass(frozen=True)
class SlurmLauncher:
    """A Slurm job submitted from the login node the connection reaches (``sh/slurm_*.sh``)."""

    partition: str
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    pending_limit_s: int = 0
    unreachable_s: int = settings.SLURM_UNREACHABLE_S
    gpu_type: str | None = None
    constraint: str | None = None
    exclusive: bool = True
    cpus_per_task: int | None = None
    mem: str | None = None
    kind: str = SLURM

    def sbatch_args(self, gpus: int) -> list[str]:
        """The options every job of this target gets (validated values: ``launcher_config``)."""
        # --no-requeue: after a node failure or a preemption Slurm would rerun the batch step, a second training.
        args = [f"--partition={self.partition}", "--nodes=1", "--ntasks=1", "--no-requeue"]
        args += [f"--account={self.account}"] if self.account else []
        args += [f"--qos={self.qos}"] if self.qos else []
        args += [f"--time={self.time}"] if self.time else []
        args += [f"--gres=gpu:{self.gpu_type + ':' if self.gpu_type else ''}{int(gpus)}"] if gpus else []
        args += [f"--constraint={self.constraint}"] if self.constraint else []
        args += ["--exclusive"] if self.exclusive else []
        args += [f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []
        args += [f"--mem={self.mem}"] if self.mem else []
        return args

    def run(self, job_dir: str, command: str, environment: Mapping[str, str], key: str, job: str,
            gpus: int) -> str:
        bad = [name for name in environment if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise BadInput(f"environment variable name(s) {', '.join(map(repr, bad))} are not shell names "
                           "(letters, digits, _; not starting with a digit): fix the suite spec's env")
        exports = "\n".join(f"export {name}={shlex.quote(str(value))}" for name, value in environment.items())
        # The job's marker rides into its batch step, which ends every process carrying it when Slurm signals.
        marker = remote.validate_marker(str(environment.get(remote.JOB_MARKER_ENV, "")))
        return slurm_library() + remote.marked_fn(remote.JOB_MARKER_ENV) + render(
            "slurm_submit", job_dir=remote.validate_path(job_dir, "job dir"), job_exports=exports, job_command=command,
            job_name=slurm_job_name(key, job), job_marker=marker, sbatch_args=self.sbatch_args(gpus))

    def status(self, job_dir: str) -> str:
        return slurm_library() + render("slurm_status", job_dir=remote.validate_path(job_dir, "job dir"))

    def log(self, job_dir: str, offset: int, max_bytes: int) -> str:
        # The scheduler's word rides on the poll's header (one token: "pending:Resources", "ended:TIMEOUT:outside").
        settle = 'read -r sched_word sched_rest <<<"$(slurm_settle "$job_dir")"\n' \
                 'scheduler=$sched_word${sched_rest:+:${sched_rest// /:}}\n'
        poll = remote.job_poll_script(job_dir, offset, max_bytes)
        head, _, body = poll.partition("\n#!/usr/bin/env bash\n")
        return slurm_library() + head + "\n" + settle + body

    def stop(self, job_dir: str, marker: str, ended_as: str = "") -> str:
        """``ended_as``: the end to record for the job (``PENDING <reason>``: the run gave up on the queue)."""
        remote.validate_marker(marker)
        if not re.fullmatch(r"[A-Za-z0-9_ ().,:-]{0,200}", ended_as):
            raise BadInput(f"ended_as {ended_as!r} must be plain words")
        return slurm_library() + render("slurm_stop", job_dirs=[remote.validate_path(job_dir, "job dir")],
                                            name_pre="", wait_s=settings.SLURM_STOP_WAIT_S, ended_as=ended_as)

    def cleanup(self, run_dir: str, key: str, jobs: Sequence[str]) -> str:
        layout = remote.RunLayout(remote.validate_path(run_dir, "run dir"))
        return slurm_library() + render(
            "slurm_stop", job_dirs=[layout.job_dir(remote.validate_suite_name(j)) for j in jobs],
            name_pre=f"rlv.{remote.validate_key(key)}.", wait_s=settings.SLURM_STOP_WAIT_S, ended_as="")

    def check(self, gpus: int) -> str:
        """Script: the partition's state, how many jobs of ``gpus`` GPUs it runs at once, ``sbatch --test-only``."""
        return render("slurm_check", partition=self.partition, gpus=int(gpus or 0), gpu_type=self.gpu_type or "",
                      exclusive=int(self.exclusive), test_args=self.sbatch_args(gpus))


def launcher_for(config: Mapping[str, Any] | None) -> SshLauncher | SlurmLauncher:
    """The launcher a config (``launcher_config``'s dict; None: ssh) names."""
    if not config or config.get("kind", SSH) == SSH:
        return SshLauncher()
    return SlurmLauncher(partition=config["partition"], account=config.get("account"), qos=config.get("qos"),
                         time=config.get("time"), pending_limit_s=int(config.get("pending_limit_s") or 0),
                         unreachable_s=int(config.get("unreachable_s", settings.SLURM_UNREACHABLE_S)),
                         gpu_type=config.get("gpu_type"), constraint=config.get("constraint"),
                         exclusive=bool(config.get("exclusive", True)), cpus_per_task=config.get("cpus_per_task"),
                         mem=config.get("mem"))


def parse_status(line: str) -> tuple[str, str]:
    """(state, Slurm's words) of a status line: ``("pending", "Resources")``, ``("ended", "TIMEOUT outside")``."""
    word, _, rest = line.strip().partition(" ")
    return (word or "absent"), rest.strip()


def scheduler_of(token: str | None) -> dict[str, str] | None:
    """The poll header's scheduler token as ``{"state", "detail"}`` (None: an SSH job's poll has none)."""
    if not token:
        return None
    word, _, rest = token.partition(":")
    return {"state": word, "detail": rest.replace(":", " ")}


def end_class(detail: str) -> str:
    """What a job Slurm ended without its exit code is called (``"TIMEOUT outside"`` -> ``time limit``; a
    cancel by rl-verify itself -> ``stopped by rl-verify``): ``slurm_states.end_words``."""
    state, _, who = detail.partition(" ")
    return slurm_states.end_words(state, who.strip())


def parse_check(out: str, config: Mapping[str, Any], gpus: int, conn_id: str) -> tuple[list[str], int | None]:
    """(problems, slots) from ``slurm_check.sh``'s lines: each problem names the connection field and its fix;
    slots: how many jobs of this size the partition runs at once (None when it could not be read)."""
    problems: list[str] = []
    slots: int | None = None
    unusable = 0
    where = f"connection {conn_id!r} (launcher slurm)"
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] == "SLURMCMD":
            problems.append(f"{where}: `{parts[2]}` is not on the SSH user's PATH on the login node. Fix: install "
                            "Slurm's client commands there (Debian: slurm-client) or reach a login node that has them")
        elif parts[0] == "PARTITION" and parts[1] == "MISSING":
            problems.append(f"{where}: partition {config['partition']!r} does not exist (slurm_partition). Fix: "
                            "set the extra 'slurm_partition' to one `sinfo -s` lists")
        elif parts[0] == "PARTITION" and parts[1] != "up":
            problems.append(f"{where}: partition {config['partition']!r} is {parts[1]} (slurm_partition): Slurm "
                            "starts no job in it. Fix: ask the cluster's admins to bring it up, or set "
                            "'slurm_partition' to one that is up")
        elif parts[0] == "SLOTS" and parts[1].isdigit():
            slots = int(parts[1])
        elif parts[0] == "UNUSABLE" and parts[1].isdigit():
            unusable = int(parts[1])
        elif parts[0] == "TESTONLY" and len(parts) >= 3 and parts[1] != "0":
            problems.append(_refusal(where, parts[2], config, gpus))
    if not any(line.startswith(("PARTITION\t", "SLURMCMD\t")) for line in out.splitlines()):
        problems.append(f"{where}: the Slurm check printed nothing (the login node's shell ended before it). Fix: "
                        "check that a non-interactive SSH session on the login node runs bash scripts")
    if slots == 0 and gpus and not any("partition" in p for p in problems):
        typed = f"{gpus} GPUs of type {config['gpu_type']!r} (GRES gpu:{config['gpu_type']})" \
            if config.get("gpu_type") else f"{gpus} GPUs (GRES gpu)"
        down = f" ({unusable} of its nodes are drained, down or not responding: they count for nothing)" \
            if unusable else ""
        problems.append(f"{where}: no usable node of partition {config['partition']!r} has {typed} for one job"
                        f"{down} (slurm_partition, slurm_gpu_type). Fix: choose a partition with such nodes, or "
                        "ask the cluster's admins to resume its nodes")
    return problems, slots


def _refusal(where: str, words: str, config: Mapping[str, Any], gpus: int) -> str:
    """``sbatch --test-only``'s refusal as the field to change and how."""
    said = words.replace("sbatch: error: ", "").strip()
    low = said.lower()
    if "account" in low:
        return (f"{where}: Slurm refuses account {config.get('account')!r} (slurm_account): {said}. Fix: set the "
                "extra 'slurm_account' to an account allowed in the partition (sacctmgr show assoc user=$USER)")
    if "qos" in low:
        return (f"{where}: Slurm refuses QOS {config.get('qos')!r} (slurm_qos): {said}. Fix: set the extra "
                "'slurm_qos' to a QOS the partition allows (scontrol show partition)")
    if "time limit" in low:
        return f"{where}: Slurm refuses the time limit {config.get('time')!r} (slurm_time): {said}. Fix: shorten it"
    if "gres" in low or "node configuration" in low or "generic resource" in low:
        return (f"{where}: Slurm cannot grant {gpus} GPUs per job in partition {config['partition']!r}: {said}. "
                "Fix: choose a partition whose nodes have them (slurm_partition)")
    return f"{where}: `sbatch --test-only` refuses this run's job: {said}. Fix: the fields slurm_partition, " \
           "slurm_account, slurm_qos, slurm_time"
