"""Validation of every value that reaches a remote shell, and the remote scripts built from them.

Rules: a value from a user (``commit``, ``suites``) is validated against a strict pattern before
anything runs; every value placed in a script is shell-quoted (``shlex.quote``), and remote paths
are assembled only from validated parts. Scripts are sent on the SSH channel's stdin to ``bash -s``
so no script text is ever interpolated into a command line.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from rl_verify.settings import JOB_MARKER_ENV, KNOWN_SUITES, RUN_MARKER_ENV

COMMIT_MAX_LEN = 200
# A git branch, tag or SHA: starts with an alphanumeric, then a conservative subset of what git
# allows in ref names. No spaces, no shell metacharacters, no leading '-' (option injection).
_COMMIT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")
_PATH_RE = re.compile(r"(~/)?[A-Za-z0-9._/+@=,-]+")
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,120}")
_REL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*")
_GLOB_RE = re.compile(r"[A-Za-z0-9_*][A-Za-z0-9._*/-]*")
_MARKER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,120}/[a-z0-9_]{1,40}")


class BadInput(ValueError):
    """A user-supplied value broke a rule; the message names the field, the rule and the fix."""


def validate_commit(value: object) -> str:
    """Return ``value`` if it is a safe git ref or SHA, else raise BadInput naming the rule."""
    field = "commit"
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


def validate_suites(value: object, known: Sequence[str] = KNOWN_SUITES) -> list[str]:
    """Return the selected suites (deduplicated, in ``known`` order) or raise BadInput."""
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
    if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9_]{1,40}", value):
        raise BadInput(f"suite name {value!r} must be lower-case letters, digits or _")
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
        raise BadInput(f"job marker {value!r} must be <run key>/<suite>")
    return value


def q(path: str) -> str:
    """Shell-quote a path, keeping a leading ``~/`` expandable as ``"$HOME"/...``."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def render(template: str, **values: str | int) -> str:
    """The script ``sh/<template>.sh`` preceded by one shell assignment per value.

    A ``str`` value is quoted with :func:`q` (a leading ``~/`` stays expandable), an ``int`` is
    written as digits; callers validate values first. Templates are plain bash files checked by
    shellcheck (``make lint``); they name their inputs in a header comment.
    """
    from importlib.resources import files

    body = files("rl_verify").joinpath("sh", f"{template}.sh").read_text()
    prelude = []
    for name, value in values.items():
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"template variable {name!r} must be a lower-case shell name")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"template variable {name!r} must be str or int, not {type(value).__name__}")
        prelude.append(f"{name}={int(value)}" if isinstance(value, int) else f"{name}={q(value)}")
    return "\n".join(prelude) + "\n" + body


def run_key(dag_run_id: str) -> str:
    """A remote-safe, deterministic folder name for a DAG run (same run id -> same key)."""
    readable = _KEY_UNSAFE.sub("_", dag_run_id)[:80].strip("._-") or "run"
    digest = hashlib.sha256(dag_run_id.encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


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


def resolve_commit_script(checkout: str, runs_root: str, key: str, commit: str) -> str:
    """Script: resolve ``commit`` in the node checkout and add a clean per-run worktree at it.

    Prints ``KEY=value`` lines (SHA, RUN_DIR, WORKTREE, SUBJECT, DIRTY_STAT_B64). Exit 3 means
    the ref does not exist, exit 4 that the checkout is missing; stderr says which.
    """
    validate_commit(commit)
    validate_key(key)
    return f"""set -eu
checkout={q(validate_path(checkout, 'node checkout'))}
runs={q(validate_path(runs_root, 'remote runs dir'))}
key={shlex.quote(key)}
ref={shlex.quote(commit)}
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
  echo "node checkout $checkout is not a git repository: set RL_VERIFY_NODE_CHECKOUT" >&2; exit 4
fi
if git -C "$checkout" remote get-url origin >/dev/null 2>&1; then
  git -C "$checkout" fetch --quiet origin || echo "warning: git fetch origin failed" >&2
fi
sha=$(git -C "$checkout" rev-parse --verify --quiet "refs/remotes/origin/$ref^{{commit}}" 2>/dev/null \\
      || git -C "$checkout" rev-parse --verify --quiet "$ref^{{commit}}" 2>/dev/null) || {{
  echo "ref '$ref' does not exist in $checkout: push it or give an existing branch, tag or SHA" >&2
  exit 3
}}
mkdir -p "$runs"
runs=$(cd "$runs" && pwd -P)
run_dir="$runs/$key"
wt="$run_dir/xtuner"
mkdir -p "$run_dir/work" "$run_dir/jobs"
if [ -e "$wt/.git" ]; then
  have=$(git -C "$wt" rev-parse HEAD)
  if [ "$have" != "$sha" ]; then
    echo "worktree $wt of this run is at $have, not $sha: remove it and retry" >&2; exit 5
  fi
else
  git -C "$checkout" worktree add --detach --quiet "$wt" "$sha"
fi
echo "SHA=$sha"
echo "RUN_DIR=$run_dir"
echo "WORKTREE=$wt"
echo "SUBJECT_B64=$(git -C "$wt" log -1 --format=%s "$sha" | base64 -w0)"
if [ -n "$(git -C "$wt" status --porcelain)" ]; then
  echo "DIRTY_STAT_B64=$( (git -C "$wt" diff --stat HEAD; git -C "$wt" status --porcelain) | base64 -w0)"
fi
"""


def prerequisites_script(checks: Iterable[tuple[str, str, str]], runs_root: str, key: str,
                         own_suite: str | None = None) -> str:
    """Script: check every (suite, kind, path) and whether the node is busy, in one round trip.

    Prints ``OK|MISSING\\tsuite\\tkind\\tpath`` per input, ``BUSY\\tjob_dir\\tpid\\tsince`` for a live
    job of another run, and ``PROC\\tpid\\tcmdline`` for a launch script running outside rl-verify.
    """
    lines = ["set -u", f"runs={q(validate_path(runs_root, 'remote runs dir'))}",
             f"key={shlex.quote(validate_key(key))}",
             # Before launching suite S only S's own job is "ours": another suite of the same run
             # that is still live (e.g. a cleared task) keeps the node busy too.
             'mine="$runs/$key/"' + (f"jobs/{shlex.quote(validate_suite_name(own_suite))}/" if own_suite else ""),
             'chk() { if [ -r "$3" ]; then s=OK; else s=MISSING; fi; '
             'printf "%s\\t%s\\t%s\\t%s\\n" "$s" "$1" "$2" "$3"; }']
    for suite, kind, path in checks:
        lines.append(f"chk {shlex.quote(suite)} {shlex.quote(kind)} {q(validate_path(path, kind + ' path'))}")
    lines.append("""for pidf in "$runs"/*/jobs/*/pid; do
  [ -f "$pidf" ] || continue
  job=$(dirname "$pidf")
  case "$job/" in "$mine"*) continue;; esac
  [ -f "$job/exit_code" ] && continue
  p=$(cat "$pidf" 2>/dev/null)
  case "$p" in ''|*[!0-9]*) continue;; esac
  if kill -0 "$p" 2>/dev/null; then printf 'BUSY\\t%s\\t%s\\t%s\\n' "$job" "$p" "$(stat -c %Y "$pidf")"; fi
done
# A launch script started by hand (or by another tool) also makes the node busy. The bracket
# keeps the pattern from matching this script's own command line.
# Jobs of rl-verify runs carry the run marker and are reported above as BUSY.
pgrep -af '^([^ ]*/)?(ba)?sh( -[a-z]+)* [^ ]*(run_[r]l|run_[s]ampled_token_mopd)\\.sh' | while read -r pid cmd; do
  if ! { tr '\\0' '\\n' < /proc/$pid/environ; } 2>/dev/null | grep -q "^{marker}="; then
    printf 'PROC\\t%s\\t%s\\n' "$pid" "$cmd"
  fi
done
exit 0
""".replace("{marker}", RUN_MARKER_ENV))
    return "\n".join(lines) + "\n"


def _marked_fn(marker: str) -> str:
    """Bash function ``marked VALUE``: pids whose environment holds ``marker=VALUE`` exactly.

    Only processes exec'd by a job carry its exported marker, so the shells that run this very
    script (and the job wrapper itself) are never listed.
    """
    return f"""marked() {{
  for d in /proc/[0-9]*; do
    {{ tr '\\0' '\\n' < "$d/environ"; }} 2>/dev/null | grep -qxF "{marker}=$1" && echo "${{d#/proc/}}"
  done
}}"""


def job_command(worktree: str, work_dir: str, script: str, args: Sequence[str], job_marker: str,
                stall_timeout_s: int, tracker_glob: str = "*/logs/exp_tracking/tracker.jsonl") -> str:
    """The command of one training job, run from the worktree by SSHRemoteJobOperator.

    The launch script's exit status is reported but never trusted (it can be 0 after a crash).
    A node-side watchdog kills the job when its tracker has not grown for ``stall_timeout_s``
    (0 disables it) and makes the job exit 124 with a ``STALLED at step N`` line; it runs on the
    node, so it works even while the node is unreachable from Airflow. Ray is stopped when the
    script returns so the node is free for the next suite.
    """
    argv = " ".join(shlex.quote(a) for a in args)
    worktree, work_dir = validate_path(worktree, "worktree"), validate_path(work_dir, "WORK_DIR")
    script = validate_relative(script, "launch script")
    glob = validate_relative(tracker_glob, "tracker glob", _GLOB_RE)
    wd = shlex.quote(work_dir)
    job_marker = validate_marker(job_marker)
    # One subshell: the remote-job wrapper redirects and reads the status of the command as a
    # whole, so a multi-line body must be a single compound command.
    return f"""( cd {shlex.quote(worktree)} && mkdir -p {wd} || exit 97
job={shlex.quote(job_marker)}
stall={int(stall_timeout_s)}
{_marked_fn(JOB_MARKER_ENV)}
bash -x {shlex.quote(script)} {argv} &
launch=$!
if [ "$stall" -gt 0 ]; then
  ( last=-1; since=$(date +%s)
    while kill -0 "$launch" 2>/dev/null; do
      size=$(stat -c %s {wd}/{glob} 2>/dev/null | awk '{{s+=$1}} END {{print s+0}}')
      now=$(date +%s)
      if [ "$size" != "$last" ]; then last=$size; since=$now
      elif [ $((now - since)) -ge "$stall" ]; then
        newest=$(ls -1d {wd}/{glob} 2>/dev/null | sort | tail -n 1)
        steps=$(grep -c '"response/rewards/mean"' "$newest" 2>/dev/null || echo 0)
        echo "$steps" > {wd}/.rl-verify-stalled
        echo "[rl-verify] STALLED at step $steps: the tracker did not grow for $stall s; killing the job"
        for p in $(marked "$job"); do kill -TERM "$p" 2>/dev/null; done
        sleep 5
        for p in $(marked "$job"); do kill -KILL "$p" 2>/dev/null; done
        break
      fi
      sleep 2
    done ) &
  watch=$!
fi
wait "$launch"
rc=$?
[ -n "${{watch:-}}" ] && kill "$watch" 2>/dev/null
ray stop --force >/dev/null 2>&1 || true
echo "[rl-verify] launch script exited $rc (not trusted: the tracker decides)"
[ -f {wd}/.rl-verify-stalled ] && exit 124
exit $rc )"""


def submit_script(wrapper: str, job_dir: str) -> str:
    """The provider's detached-job wrapper, then a short wait until the job has written its pid.

    The wrapper returns before the detached job records its pid; waiting for it makes the job
    visible to every later busy check at once (no window for a second launch).
    """
    pid = q(validate_path(job_dir, "job dir")) + "/pid"
    return (wrapper.rstrip("\n") + "\n"
            f"for i in $(seq 100); do [ -s {pid} ] && break; sleep 0.05; done >/dev/null 2>&1\n")


def job_environment(spec_env: Mapping[str, str], work_dir: str, key: str, suite: str,
                    shares: Mapping[str, str]) -> dict[str, str]:
    """Environment of a training job: suite env, WORK_DIR, share roots, the run and job markers."""
    env = {**shares, **spec_env, "WORK_DIR": work_dir, RUN_MARKER_ENV: key,
           JOB_MARKER_ENV: job_marker(key, suite)}
    return {k: str(v) for k, v in env.items()}


def job_marker(key: str, suite: str) -> str:
    """Value of the job marker every process of one (run, suite) training inherits."""
    return f"{key}/{suite}"


def kill_job_script(job_dir: str, marker_value: str) -> str:
    """Script: stop one job (its process group, every process carrying its marker) and Ray."""
    job_dir = q(validate_path(job_dir, "job dir"))
    return _stop_script(job_dir + "/pid", JOB_MARKER_ENV, validate_marker(marker_value),
                        stop_ray_if=job_dir + "/pid")


def cleanup_script(run_dir: str, key: str) -> str:
    """Script: stop every process of the run (job groups, teachers, Ray) and keep the logs.

    TERM first so the launch scripts' EXIT traps can stop their teacher servers, then KILL
    whatever still carries the run marker, then ``ray stop --force``. Prints KILLED/LEFT lines.
    Ray is stopped only when this run launched a job: a run that failed its prerequisites because
    another run is training must not stop that run's Ray.
    """
    pids = q(validate_path(run_dir, "run dir")) + "/jobs/*/pid"
    return _stop_script(pids, RUN_MARKER_ENV, validate_key(key), stop_ray_if=pids)


def _stop_script(pid_glob: str, marker: str, value: str, stop_ray_if: str) -> str:
    return f"""set -u
value={shlex.quote(value)}
{_marked_fn(marker)}
for pidf in {pid_glob}; do
  [ -f "$pidf" ] || continue
  p=$(cat "$pidf" 2>/dev/null)
  case "$p" in ''|*[!0-9]*|0|1) continue;; esac
  kill -TERM -"$p" 2>/dev/null && echo "TERM group $p"
done
for p in $(marked "$value"); do kill -TERM "$p" 2>/dev/null; done
for i in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(marked "$value")" ] && break; sleep 0.5; done
for p in $(marked "$value"); do
  echo "KILLED $p $(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-200)"
  kill -KILL "$p" 2>/dev/null
done
if ls {stop_ray_if} >/dev/null 2>&1; then
  ray stop --force >/dev/null 2>&1 && echo "ray stopped" || echo "ray stop failed or ray absent"
fi
sleep 0.5
for p in $(marked "$value"); do echo "LEFT $p"; done
exit 0
"""


def reap_script(runs_root: str, checkout: str, keep_key: str, max_age_days: int) -> str:
    """Script: remove run folders older than ``max_age_days`` that have no live job.

    Their records were archived by the runs that made them; the worktrees are unregistered from
    the checkout so git does not keep stale entries. Prints one REAPED line per folder.
    """
    return f"""set -u
runs={q(validate_path(runs_root, 'remote runs dir'))}
checkout={q(validate_path(checkout, 'node checkout'))}
keep={shlex.quote(validate_key(keep_key))}
[ -d "$runs" ] || exit 0
find "$runs" -mindepth 1 -maxdepth 1 -type d -mtime +{int(max_age_days)} | while read -r dir; do
  [ "$(basename "$dir")" = "$keep" ] && continue
  live=0
  for pidf in "$dir"/jobs/*/pid; do
    [ -f "$pidf" ] || continue
    [ -f "$(dirname "$pidf")/exit_code" ] && continue
    kill -0 "$(cat "$pidf" 2>/dev/null)" 2>/dev/null && live=1
  done
  [ "$live" = 1 ] && continue
  [ -e "$dir/xtuner/.git" ] && git -C "$checkout" worktree remove --force "$dir/xtuner" 2>/dev/null
  rm -rf -- "$dir" && echo "REAPED $dir"
done
git -C "$checkout" worktree prune 2>/dev/null || true
exit 0
"""
