"""Validation of every value that reaches a remote shell, and the remote scripts built from them.

Rules: a value from a user (``commit``, ``suites``) is validated against a strict pattern before
anything runs; every value placed in a script is shell-quoted (``shlex.quote``), and remote paths
are assembled only from validated parts. The scripts themselves are bash files under ``sh/``
(checked by shellcheck in ``make lint``); :func:`render` puts the quoted values in front of them.
Scripts are sent on the SSH channel's stdin to ``bash -s`` so no script text is ever interpolated
into a command line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from rl_verify.engines import known_suites
from rl_verify.suites.spec import NodeNeeds
from rl_verify import settings
from rl_verify.settings import JOB_MARKER_ENV, RUN_MARKER_ENV, SEED_ENV

COMMIT_MAX_LEN = 200
# A git branch, tag or SHA: starts with an alphanumeric, then a conservative subset of what git
# allows in ref names. No spaces, no shell metacharacters, no leading '-' (option injection).
_COMMIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")
_PATH_RE = re.compile(r"(~/)?[A-Za-z0-9._/+@=,-]+")
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,120}")
_REL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*")
GLOB_RE = re.compile(r"[A-Za-z0-9_*][A-Za-z0-9._*/-]*")
#: A suite's job folder: the suite, ``<suite>-r<k>`` for its k-th repeat (``settings.attempt_name``), or one of
#: its bitwise lane's deterministic jobs (``settings.lane_job``: ``-lane``, ``-ref1``, ``-ref2``).
_JOB_NAME = r"[a-z0-9_]{1,40}(?:(?:-r[0-9]{1,2})?(?:-t[0-9]{1,2})?|-lane|-ref[12])"
_MARKER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,120}/" + _JOB_NAME)
#: The same shape as a POSIX extended regular expression, whole value (bash's ``[[ =~ ]]`` in sh/lib_gpu.sh reads
#: another process's job marker with it).
_MARKER_ERE = "^" + _MARKER_RE.pattern.replace("(?:", "(") + "$"


class BadInput(ValueError):
    """A user-supplied value broke a rule; the message names the field, the rule and the fix."""


def validate_commit(value: object, field: str = "commit") -> str:
    """Return ``value`` if it is a safe git ref or SHA, else raise BadInput naming the rule (and the param
    ``field``)."""
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"param {field!r} is empty: give a branch, tag or SHA (e.g. main)")
    if len(value) > COMMIT_MAX_LEN:
        raise BadInput(f"param {field!r} is {len(value)} characters long; the limit is "
                       f"{COMMIT_MAX_LEN}: give a branch, tag or SHA")
    if value.startswith("-"):
        raise BadInput(f"param {field!r} must not start with '-' (it would be read as an option): "
                       f"{value!r}")
    if not _COMMIT_RE.fullmatch(value):
        bad = sorted({c for c in value if not re.fullmatch(r"[A-Za-z0-9._/+-]", c)})
        raise BadInput(f"param {field!r} may only contain letters, digits and . _ / + - "
                       f"(found {', '.join(repr(c) for c in bad)}): {value!r}; "
                       f"give a branch, tag or SHA")
    if ".." in value or "//" in value or value.endswith((".lock", "/", ".")):
        raise BadInput(f"param {field!r} is not a valid git ref name ('..', '//', or a trailing "
                       f"'/', '.', '.lock'): {value!r}")
    return value


def validate_suites(value: object, known: Sequence[str] | None = None) -> list[str]:
    """Return the selected suites (deduplicated, in the order of ``known``, default every suite spec) or
    raise BadInput."""
    known = known_suites() if known is None else known
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise BadInput(f"param 'suites' is empty: select one or more of {', '.join(known)}")
    unknown = [v for v in value if v not in known]
    if unknown:
        raise BadInput(f"param 'suites' has unknown suite(s) {', '.join(map(repr, unknown))}; "
                       f"known suites: {', '.join(known)}")
    return [s for s in known if s in value]


def validate_suite_name(value: str) -> str:
    """A suite's name, or the job name of one of its repeats (``<suite>-r<k>``) or retries (``<job>-t<n>``)."""
    if not isinstance(value, str) or not re.fullmatch(_JOB_NAME, value):
        raise BadInput(f"suite name {value!r} must be lower-case letters, digits or _ (a repeat: <suite>-r<k>; "
                       "a retry: <job>-t<n>)")
    return value


def validate_path(value: str, what: str) -> str:
    """Return ``value`` if it is a plain absolute or ``~/`` path made of safe characters."""
    if not isinstance(value, str) or not _PATH_RE.fullmatch(value) or ".." in value.split("/"):
        raise BadInput(f"{what} {value!r} is not a plain path (allowed: letters, digits, "
                       f". _ / + @ = , - and a leading ~/); fix the setting")
    if not (value.startswith("/") or value.startswith("~/")):
        raise BadInput(f"{what} {value!r} must be absolute or start with ~/; fix the setting")
    return value


def validate_key(value: str, what: str = "run key") -> str:
    """A folder name made by :func:`run_key` (letters, digits, . _ -; not '.' or '..')."""
    if not isinstance(value, str) or not _KEY_RE.fullmatch(value) or value in (".", ".."):
        raise BadInput(f"{what} {value!r} is not a plain folder name (letters, digits, . _ -)")
    return value


def validate_relative(value: str, what: str, pattern: re.Pattern[str] = _REL_RE) -> str:
    """A path relative to the worktree: safe characters, no '..', no leading '-' or '/'."""
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value.split("/"):
        raise BadInput(f"{what} {value!r} must be a relative path of letters, digits and . _ / - "
                       f"(no '..', no leading '-' or '/'); fix the suite spec")
    return value


def validate_marker(value: str) -> str:
    if not isinstance(value, str) or not _MARKER_RE.fullmatch(value):
        raise BadInput(f"job marker {value!r} must be <run key>/<suite> or <run key>/<suite>-r<k>")
    return value


def q(path: str) -> str:
    """Shell-quote a path, keeping a leading ``~/`` expandable as ``"$HOME"/...``."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def render(template: str, **values: str | int | Sequence[str]) -> str:
    """The script ``sh/<template>.sh`` preceded by one shell assignment per value.

    A ``str`` value is quoted with :func:`q` (a leading ``~/`` stays expandable), an ``int`` is
    written as digits, a list or tuple of ``str`` becomes a bash array whose elements are quoted
    with ``shlex.quote`` (arguments, so a ``~`` stays literal); callers validate values first.
    Templates are plain bash files checked by shellcheck (``make lint``); they name their inputs
    in a header comment.
    """
    from importlib.resources import files

    body = files("rl_verify.node").joinpath("sh", f"{template}.sh").read_text()
    prelude = []
    for name, value in values.items():
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"template variable {name!r} must be a lower-case shell name")
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            prelude.append(f"{name}=(" + " ".join(shlex.quote(v) for v in value) + ")")
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"template variable {name!r} must be str, int or a list of str, "
                            f"not {type(value).__name__}")
        prelude.append(f"{name}={int(value)}" if isinstance(value, int) else f"{name}={q(value)}")
    return "\n".join(prelude) + "\n" + body


@dataclass(frozen=True)
class RunLayout:
    """Absolute remote paths of one DAG run on the node (resolved by resolve_commit)."""

    run_dir: str

    @property
    def worktree(self) -> str:
        return f"{self.run_dir}/xtuner"

    @property
    def jobs_dir(self) -> str:
        return f"{self.run_dir}/jobs"

    def work_dir(self, suite: str) -> str:
        return f"{self.run_dir}/work/{suite}"

    def job_dir(self, suite: str) -> str:
        return f"{self.jobs_dir}/{suite}"

    def evidence_dir(self, job: str) -> str:
        """One job's executed-code evidence (issue 44): its coverage config, sitecustomize and data files."""
        return f"{self.run_dir}/evidence/{job}"


def resolve_commit_script(checkout: str, runs_root: str, key: str, commit: str) -> str:
    """Script: resolve ``commit`` in the node checkout and add a clean per-run worktree at it.

    Prints ``KEY=value`` lines (SHA, RUN_DIR, WORKTREE, SUBJECT, DIRTY_STAT_B64). Exit 3 means
    the ref does not exist, exit 4 that the checkout is missing; stderr says which.
    """
    return render("resolve_commit", checkout=validate_path(checkout, "node checkout"),
                  runs=validate_path(runs_root, "remote runs dir"), key=validate_key(key),
                  ref=validate_commit(commit))


def commit_range_script(checkout: str, good: str, bad: str, limit: int) -> str:
    """Script: the first-parent range good..bad of the node checkout (``sh/commit_range.sh``): a COUNT line,
    then, when at most ``limit`` commits follow good, one line per commit from good on. Exit 3: an end does
    not exist; 4: no checkout; 6: good is not an ancestor of bad."""
    return render("commit_range", checkout=validate_path(checkout, "node checkout"),
                  good=validate_commit(good), bad=validate_commit(bad), limit=int(limit))


def validate_sha(value: object, field: str) -> str:
    """A full 40-hex SHA (the record's commits), else BadInput naming ``field``."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{40}", value):
        raise BadInput(f"{field} {value!r} is not a full SHA (40 lower-case hex digits)")
    return value


def validate_package(value: str) -> str:
    """A Python distribution name (letters, digits, _ . -), else BadInput."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,59}", value):
        raise BadInput(f"package name {value!r} must be letters, digits and _ . - (e.g. torch, flash_attn)")
    return value


def changed_files_script(checkout: str, base: str, head: str) -> str:
    """Script: the paths that differ between two commits of the node checkout (``sh/changed_files.sh``), one
    per line, both names of a rename. Exit 3: a commit is not in the checkout; 4: no checkout."""
    return render("changed_files", checkout=validate_path(checkout, "node checkout"),
                  base=validate_sha(base, "base commit"), head=validate_sha(head, "head commit"))


def tree_files_script(checkout: str, sha: str) -> str:
    """Script: the tracked files of one commit of the node checkout (``sh/tree_files.sh``), one per line. Exit 3:
    the commit is not in the checkout; 4: no checkout."""
    return render("tree_files", checkout=validate_path(checkout, "node checkout"), sha=validate_sha(sha, "commit"))


def _check_field(value: str, what: str) -> str:
    """A suite or input kind placed in a tab-separated line: non-empty, no tab or line break."""
    if not isinstance(value, str) or not value or re.search(r"[\t\r\n]", value):
        raise BadInput(f"{what} {value!r} must be non-empty text without tabs or line breaks")
    return value


def prerequisites_script(checks: Iterable[tuple[str, str, str]], runs_root: str, key: str,
                         own_suite: str | None = None, needs: NodeNeeds | None = None,
                         env_packages: Sequence[str] | None = None) -> str:
    """Script: check every (suite, kind, path), whether the node is busy and, with ``needs``, whether it
    is ready for the launch scripts (their open-files limit, GPUs, Ray ports, python, /tmp/ray_log), in
    one round trip.

    Prints ``OK|MISSING\\tsuite\\tkind\\tpath`` per input, ``BUSY\\tjob_dir\\tpid\\tsince`` for a live
    job of another run, ``PROC\\tpid\\tcmdline`` for a launch script running outside rl-verify, and the
    readiness lines of ``sh/prerequisites.sh``; with ``env_packages`` (None: not read) the environment too (GPU,
    driver, CUDA, and the version of each of ``env_packages`` in the launch interpreter: ``needs.python``, else
    python3).
    """
    lines = [f"{_check_field(suite, 'suite')}\t{_check_field(kind, 'input kind')}\t"
             f"{validate_path(path, kind + ' path')}" for suite, kind, path in checks]
    needs = needs or NodeNeeds()
    return _alive_fn() + _gpu_fn(RUN_MARKER_ENV) + render(
                                "prerequisites", runs=validate_path(runs_root, "remote runs dir"),
                                key=validate_key(key),
                                own_suite=validate_suite_name(own_suite) if own_suite else "",
                                checks="\n".join(lines), marker_env=RUN_MARKER_ENV,
                                need_nofile=int(needs.nofile or 0), need_gpus=int(needs.gpus or 0),
                                ray_ports=" ".join(str(int(p)) for p in needs.ray_ports),
                                python_cmd=needs.python or "",
                                ray_log=validate_path(needs.ray_log, "ray_log") if needs.ray_log else "",
                                gpu_check=1 if needs.gpus else 0,
                                env_check=0 if env_packages is None else 1, env_python=needs.python or "python3",
                                env_packages=[validate_package(p) for p in env_packages or ()])


def _alive_fn() -> str:
    """Bash functions ``group_alive PGID [LEADER_START]``, ``job_alive JOB_DIR`` and ``job_leader JOB_DIR``
    (``sh/lib_alive.sh``): a non-zombie process of the job's group lives, and the group is still the job's
    (not a later one given the same number); rendered in front of the scripts that decide whether a job runs."""
    return render("lib_alive")


def marked_fn(marker: str) -> str:
    """Bash function ``marked VALUE`` (``sh/lib_marked.sh``): pids whose environment holds
    ``marker=VALUE`` exactly; rendered in front of the scripts that call it."""
    return render("lib_marked", marker_env=marker)


def _gpu_fn(marker: str) -> str:
    """Bash functions ``gpu_state VALUE [PIDS [RUNS]]`` and ``gpu_pids WHOSE VALUE [PIDS]`` (``sh/lib_gpu.sh``):
    what nvidia-smi shows of the GPUs' memory and compute processes, each process marked own when it carries
    ``marker=VALUE``, another's with the job marker of another rl-verify run it carries and whether that job is
    live under RUNS; rendered (after :func:`_alive_fn`) in front of the scripts that read the GPUs."""
    return render("lib_gpu", marker_env=marker, job_env=JOB_MARKER_ENV, job_re=_MARKER_ERE)


def job_command(worktree: str, work_dir: str, script: str, args: Sequence[str], job_marker: str,
                stall_timeout_s: int, tracker_glob: str = "*/logs/exp_tracking/tracker.jsonl") -> str:
    """The command of one training job (run detached by :func:`submit_job_script`) from the worktree.

    The launch script's exit status is reported but never trusted (it can be 0 after a crash).
    A node-side watchdog kills the job when its tracker has not grown for ``stall_timeout_s``
    (0 disables it) and makes the job exit 124 with a ``STALLED at step N`` line; it runs on the
    node, so it works even while the node is unreachable from Airflow. Ray is stopped when the
    script returns so the node is free for the next suite.
    """
    body = render("job", worktree=validate_path(worktree, "worktree"), work_dir=validate_path(work_dir, "WORK_DIR"),
                  script=validate_relative(script, "launch script"), args=[str(a) for a in args],
                  job=validate_marker(job_marker), stall=int(stall_timeout_s),
                  glob=validate_relative(tracker_glob, "tracker glob", GLOB_RE))
    # One subshell: the job's exit status is that of the command as a whole (sh/job_submit.sh
    # records it), and the job's exports stay outside it.
    return f"( {marked_fn(JOB_MARKER_ENV)}{body}\n)"


def job_environment(spec_env: Mapping[str, str], work_dir: str, key: str, suite: str,
                    shares: Mapping[str, str], seed: int | None = None) -> dict[str, str]:
    """Environment of a training job: suite env, WORK_DIR, share roots, the run and job markers, and
    the run's seed when one is set (calibration runs: one per run, for launch configs that read it)."""
    env = {**shares, **spec_env, "WORK_DIR": work_dir, RUN_MARKER_ENV: key,
           JOB_MARKER_ENV: job_marker(key, suite)}
    if seed is not None:
        env[SEED_ENV] = int(seed)
    return {k: str(v) for k, v in env.items()}


def job_marker(key: str, suite: str) -> str:
    """Value of the job marker every process of one (run, suite) training inherits."""
    return f"{key}/{suite}"


def kill_job_script(job_dir: str, marker_value: str) -> str:
    """Script: stop one job (its process group, every process carrying its marker) and Ray (the GPUs are not
    read: the run's cleanup does that)."""
    return _stop_script(JOB_MARKER_ENV, validate_marker(marker_value), job_dir=validate_path(job_dir, "job dir"))


def cleanup_script(run_dir: str, key: str, gpu_wait_s: int | None = None) -> str:
    """Script: stop every process of the run (job groups, teachers, Ray) and keep the logs.

    TERM first so the launch scripts' EXIT traps can stop their teacher servers, then KILL
    whatever still carries the run marker, then ``ray stop --force``. Prints KILLED/LEFT lines.
    Ray is stopped only when this run launched a job and no other run's job is alive on the node: a run
    that failed its prerequisites because another run is training, or that ends while another run's
    training (queued behind it on the node's pool) has started, must not stop that run's Ray.
    Then it waits, at most ``gpu_wait_s`` (default ``settings.GPU_RELEASE_WAIT_S``), until no compute process
    of the run holds GPU memory, and prints a GPUWAIT line and what nvidia-smi shows (``sh/lib_gpu.sh``).
    """
    wait = settings.GPU_RELEASE_WAIT_S if gpu_wait_s is None else max(0, int(gpu_wait_s))
    return _stop_script(RUN_MARKER_ENV, validate_key(key), run_dir=validate_path(run_dir, "run dir"), gpu_wait=wait)


def _stop_script(marker: str, value: str, job_dir: str = "", run_dir: str = "", gpu_wait: int = -1) -> str:
    return _alive_fn() + marked_fn(marker) + _gpu_fn(marker) + render("stop", job_dir=job_dir, run_dir=run_dir,
                                                                       value=value, gpu_wait=int(gpu_wait))


def job_state_script(job_dir: str) -> str:
    """Script: print exactly one of ``absent``, ``running``, ``finished`` or ``dead`` for a job.

    ``finished``: it wrote an exit code; ``running``: its pid is alive; ``dead``: its folder exists
    but it has no exit code and no live process (killed, or the node restarted); else ``absent``.
    """
    return _alive_fn() + render("job_state", job_dir=validate_path(job_dir, "job dir"))


def reap_script(runs_root: str, checkout: str, keep_key: str, max_age_days: int) -> str:
    """Script: remove run folders older than ``max_age_days`` that have no live job.

    Their records were archived by the runs that made them; the worktrees are unregistered from
    the checkout so git does not keep stale entries. Prints one REAPED line per folder.
    """
    return _alive_fn() + render("reap", runs=validate_path(runs_root, "remote runs dir"),
                  checkout=validate_path(checkout, "node checkout"), keep=validate_key(keep_key),
                  max_age_days=int(max_age_days))


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def submit_job_script(job_dir: str, command: str, environment: Mapping[str, str]) -> str:
    """Script: start ``command`` detached as the job in ``job_dir`` with ``environment`` exported.

    Returns once the job has recorded its pid (see ``sh/job_submit.sh`` for the files it writes).
    """
    bad = [name for name in environment if not _ENV_NAME_RE.fullmatch(name)]
    if bad:
        raise BadInput(f"environment variable name(s) {', '.join(map(repr, bad))} are not shell names "
                       "(letters, digits, _; not starting with a digit): fix the suite spec's env")
    exports = "\n".join(f"export {name}={shlex.quote(str(value))}" for name, value in environment.items())
    return _alive_fn() + render("job_submit", job_dir=validate_path(job_dir, "job dir"), job_exports=exports,
                                job_command=command)


def job_poll_script(job_dir: str, offset: int, max_bytes: int) -> str:
    """Script: the job's exit code (or ``-``), the log offset it starts at, the log size, the next bytes."""
    return render("job_poll", job_dir=validate_path(job_dir, "job dir"), offset=max(0, int(offset)),
                  max_bytes=max(1, int(max_bytes)))


def tracker_poll_script(work_dir: str, tracker_glob: str, known: str, offset: int, max_bytes: int) -> str:
    """Script: the newest tracker under ``work_dir`` and its bytes after ``offset`` (0 if it is a new file)."""
    if known:
        validate_path(known, "tracker path")
    return render("tracker_poll", work_dir=validate_path(work_dir, "WORK_DIR"),
                  glob=validate_relative(tracker_glob, "tracker glob", GLOB_RE), known=known,
                  offset=max(0, int(offset)), max_bytes=max(1, int(max_bytes)))


def read_file_script(path: str, max_bytes: int) -> str:
    """Script: print the file ``path`` (at most ``max_bytes``); exit 3 when it cannot be read."""
    return render("read_file", path=validate_path(path, "file path"), max_bytes=max(1, int(max_bytes)))
