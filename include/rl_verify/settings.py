"""Constants and deployment settings of rl-verify, in one place: the bottom layer of the package.

Everything here is read from the process environment only (never from an Airflow connection, a
Variable or a file), so importing it at DAG parse time touches no network and no metadata database,
and importing it never raises: a malformed setting keeps its default here and is listed in
``PROBLEMS`` (name, value, fix), which the DAG files raise at parse time (``raise_problems``) so the
deployment sees every bad setting as one DAG import error.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

#: Malformed settings found at import: (variable, value, fix), raised by :func:`raise_problems`.
PROBLEMS: list[tuple[str, str, str]] = []


def _number(name: str, default: float, kind: type = int, minimum: float | None = None) -> float:
    """``kind(os.environ[name])``, or ``default`` when unset or empty; a malformed value is kept in
    ``PROBLEMS`` and the default used, so that importing this module never raises."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        PROBLEMS.append((name, raw, f"give {'an integer' if kind is int else 'a number'}, or unset it for the "
                                    f"default {default}"))
        return default
    if minimum is not None and value < minimum:
        PROBLEMS.append((name, raw, f"give a value >= {minimum:g}, or unset it for the default {default}"))
        return default
    return value


def raise_problems() -> None:
    """Raise one ValueError naming every malformed ``RL_VERIFY_*`` setting and its fix (none: nothing)."""
    if PROBLEMS:
        raise ValueError(f"{len(PROBLEMS)} malformed rl-verify setting(s) in the environment: "
                         + "; ".join(f"{name}={value!r}: {fix}" for name, value, fix in PROBLEMS))


DAG_ID = "rl_accuracy_verification"
TAGS = ["rl-verify", "xtuner", "accuracy", "gpu"]

#: Where the suite specs (``<name>.json``) and their data files (``data/<file>``) are read from: the
#: package's own ``rl_verify/suites`` unless RL_VERIFY_SUITES_DIR names another folder (a deployment's
#: own copy with an added suite; ``rl_verify.suites.spec`` reads it).
SUITES_DIR: str | None = os.environ.get("RL_VERIFY_SUITES_DIR", "").strip() or None
#: Suites a run tests unless its ``suites`` param says otherwise (RL_VERIFY_DEFAULT_SUITES="grpo,opd"):
#: what the nightly runs; empty = every suite (checked against the specs by ``rl_verify.engines``).
DEFAULT_SUITES_SETTING: tuple[str, ...] = tuple(
    s.strip() for s in os.environ.get("RL_VERIFY_DEFAULT_SUITES", "").split(",") if s.strip())


#: Airflow connection of the GPU node (SSH, pinned host key).
DEFAULT_NODE_CONN_ID = os.environ.get("RL_VERIFY_NODE_CONN_ID", "rl_gpu_node")

#: Variable holding the standing approval that lets scheduled runs skip the human wait.
STANDING_APPROVAL_VARIABLE = "rl_verify_standing_approval"
#: Connection to Airflow's own REST API (base URL + a user allowed to read DAG runs): standing
#: approvals are verified through it against the recorded human response that granted them.
AIRFLOW_API_CONN_ID = os.environ.get("RL_VERIFY_AIRFLOW_API_CONN_ID", "rl_verify_airflow_api")
#: Apprise connection (type ``apprise``, extra ``{"config": {"path": "<apprise URL>"}}``) that receives
#: the card-waiting, verdict and infrastructure-failure messages; absent = nothing is sent.
NOTIFY_CONN_ID = os.environ.get("RL_VERIFY_NOTIFY_CONN_ID", "rl_verify_notify")

#: Default ref tested by nightly runs (the tip of the node checkout's default branch).
DEFAULT_COMMIT = os.environ.get("RL_VERIFY_DEFAULT_COMMIT", "main")

#: Nightly cron (RL_VERIFY_SCHEDULE); "none" turns the schedule off (manual runs only).
_SCHEDULE = os.environ.get("RL_VERIFY_SCHEDULE", "0 2 * * *")
SCHEDULE: str | None = None if _SCHEDULE.strip().lower() in ("", "none", "@none") else _SCHEDULE
TIMEZONE = os.environ.get("RL_VERIFY_TIMEZONE", "Asia/Shanghai")
#: Every DAG's start_date (year, month, day in TIMEZONE): before the first nightly it may run.
DAGS_START_DATE = (2026, 11, 1)

#: Names of the share roots, as the runbook exports them.
SHARE_ROOT_VARS: tuple[str, ...] = ("CI_SHARE_MODEL", "CI_SHARE_DATA", "CI_SHARE_BASELINE")

#: Where the XTuner checkout lives on the node, and where per-run folders go: the settings' names (a node's
#: connection extras, Variables or environment) and their defaults.
NODE_CHECKOUT_KEY = "RL_VERIFY_NODE_CHECKOUT"
REMOTE_RUNS_DIR_KEY = "RL_VERIFY_REMOTE_RUNS_DIR"
NODE_CHECKOUT = os.environ.get(NODE_CHECKOUT_KEY, "~/xtuner")
REMOTE_RUNS_DIR = os.environ.get(REMOTE_RUNS_DIR_KEY, "~/rl-verify/runs")

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: Record store root: a local folder (default: records/ in the project) or an object storage URL
#: (``s3://<conn_id>@bucket/prefix``): what every task reads and writes the run's record through.
RECORD_ROOT = os.environ.get("RL_VERIFY_RECORD_ROOT", str(PROJECT_ROOT / "records"))
#: This worker's local folder for task workspaces (each task's copy of the record, removed when it ends).
STAGING_DIR = os.environ.get("RL_VERIFY_STAGING_DIR",
                             str(Path(os.environ.get("TMPDIR", "/tmp")) / "rl-verify-staging"))
#: Keep each task's workspace after the task (debugging only: nothing reads it).
KEEP_STAGING = os.environ.get("RL_VERIFY_KEEP_STAGING", "").strip().lower() in ("1", "true", "yes")

#: Seconds between status polls of a remote training job.
JOB_POLL_INTERVAL_S = _number("RL_VERIFY_JOB_POLL_INTERVAL_S", 5, int, 0)
#: The remote job gets this multiple of the suite's wall-time budget before it is timed out.
JOB_TIMEOUT_FACTOR = _number("RL_VERIFY_JOB_TIMEOUT_FACTOR", 1.5, float, 0)
#: Seconds the engine gives the checkout's checker before it is considered hung.
CHECKER_TIMEOUT_S = _number("RL_VERIFY_CHECKER_TIMEOUT_S", 600, float, 0)
#: Seconds a short SSH command (prerequisites, worktree, cleanup) may take.
SHORT_COMMAND_TIMEOUT_S = 120

#: Environment variable every process of a run inherits, so cleanup can find them all.
RUN_MARKER_ENV = "RL_VERIFY_RUN"
#: Environment variable every process of one (run, suite) training inherits (kill, stall watchdog).
JOB_MARKER_ENV = "RL_VERIFY_JOB"
#: The seed of a calibration run, in its job's environment (each of the N runs gets its own).
SEED_ENV = "RL_VERIFY_SEED"
#: GPU memory in use (MiB, per GPU) that no process of the run explains and still leaves the node ready for a
#: training: a display server or a monitoring daemon may hold a little. Above it the node is not ready. (A compute
#: process that is not the run's own makes it not ready whatever it holds.)
GPU_MEMORY_FLOOR_MIB = _number("RL_VERIFY_GPU_MEMORY_FLOOR_MIB", 1024, int, 0)
#: How long cleanup waits, after stopping a run, until no compute process of the run holds GPU memory (seconds;
#: on an H200 the driver released 11 GiB within about a second).
GPU_RELEASE_WAIT_S = _number("RL_VERIFY_GPU_RELEASE_WAIT_S", 60, int, 0)
#: A training whose tracker does not grow for this long is killed as stalled (0 disables).
STALL_TIMEOUT_S = _number("RL_VERIFY_STALL_TIMEOUT_S", 900, int, 0)
#: The Slurm launcher (issue 45): how long a job may wait in the queue before the run gives up naming Slurm's reason
#: (a connection's extra ``slurm_pending_limit_s`` overrides it; 0: no limit), and how long a stop or the cleanup
#: waits until Slurm shows none of its jobs running.
SLURM_PENDING_LIMIT_S = _number("RL_VERIFY_SLURM_PENDING_LIMIT_S", 3600, int, 0)
SLURM_STOP_WAIT_S = _number("RL_VERIFY_SLURM_STOP_WAIT_S", 60, int, 0)
#: Seconds Slurm may stay silent (squeue/sacct failing: slurmctld restarting, failing over, frozen) before a
#: watched job is given up as unknown (issue 54): a restart takes seconds, a failover a minute or two. A connection's
#: extra ``slurm_unreachable_s`` overrides it.
SLURM_UNREACHABLE_S = _number("RL_VERIFY_SLURM_UNREACHABLE_S", 300, int, 0)
#: Seconds the exit code of a job Slurm shows ended is awaited before its end is recorded without it (the shared
#: filesystem may show the batch step's file late).
SLURM_SETTLE_S = _number("RL_VERIFY_SLURM_SETTLE_S", 30, int, 0)
#: Seconds one squeue/sacct call may take on the login node (a frozen slurmctld answers after MessageTimeout, 10 s
#: by default, then fails: 20 s measured).
SLURM_ASK_TIMEOUT_S = 30
#: Consecutive SSH failures the job monitor tolerates (backoff 1, 2, 4, 8, then 10 s) before
#: failing: 36 attempts is about 6 minutes of node outage.
SSH_RECONNECT_ATTEMPTS = _number("RL_VERIFY_SSH_RECONNECT_ATTEMPTS", 36, int, 0)
#: Cleanup is retried (exponential backoff) until the node is reachable again.
CLEANUP_RETRIES = _number("RL_VERIFY_CLEANUP_RETRIES", 6, int, 0)
CLEANUP_RETRY_DELAY_S = _number("RL_VERIFY_CLEANUP_RETRY_DELAY_S", 30, int, 0)
#: Run folders on the node older than this (and with no live job) are removed by the reaper.
REAP_AFTER_DAYS = _number("RL_VERIFY_REAP_AFTER_DAYS", 7, int, 0)

#: default_args per kind of task.
SHORT_SSH_TASK_ARGS = {"retries": 2, "retry_delay": timedelta(seconds=10),
                       "execution_timeout": timedelta(minutes=10)}
#: The infrastructure retry policy (issue 55): ``suites/data/infra_retry.json`` (the kinds of causes, the wait),
#: its number of retries replaced by RL_VERIFY_INFRA_RETRIES (0: a training that failed as infrastructure is final).
INFRA_RETRY_FILE = Path(__file__).parent / "suites" / "data" / "infra_retry.json"
INFRA_RETRIES: int | None = None if not os.environ.get("RL_VERIFY_INFRA_RETRIES", "").strip() else \
    int(_number("RL_VERIFY_INFRA_RETRIES", 1, int, 0))
#: The most retries a deployment may set (job names ``<job>-t<n>`` are reserved up to it).
MAX_INFRA_RETRIES = 3
#: No Airflow retry: the retry policy trains the next attempt inside the same task (its node's pool slot kept, a new
#: job folder: ``retry_job``) once the failed attempt's processes are proven gone; an Airflow retry would also re-run
#: a training that hit its job timeout. A cleared task (or a restarted worker/triggerer) re-attaches to the live job
#: of its run's current attempt.
TRAINING_TASK_ARGS = {"retries": 0}
if INFRA_RETRIES is not None and INFRA_RETRIES > MAX_INFRA_RETRIES:
    PROBLEMS.append(("RL_VERIFY_INFRA_RETRIES", str(INFRA_RETRIES), f"give 0..{MAX_INFRA_RETRIES}"))
    INFRA_RETRIES = MAX_INFRA_RETRIES
LOCAL_TASK_ARGS = {"retries": 0, "execution_timeout": timedelta(minutes=30)}
CLEANUP_TASK_ARGS = {"retries": CLEANUP_RETRIES, "retry_delay": timedelta(seconds=CLEANUP_RETRY_DELAY_S),
                     "retry_exponential_backoff": True, "execution_timeout": timedelta(minutes=10)}
DEFAULT_ARGS = {"owner": "ml-infra", "retries": 0}


def approvers() -> list[dict[str, str]]:
    """Users allowed to answer the approval (RL_VERIFY_APPROVERS="alice,bob"); empty = any user."""
    names = [n.strip() for n in os.environ.get("RL_VERIFY_APPROVERS", "").split(",") if n.strip()]
    return [{"id": n, "name": n} for n in names]


def standing_approval_max_age() -> timedelta:
    """How long a standing approval lasts (RL_VERIFY_STANDING_APPROVAL_DAYS, default 14)."""
    return timedelta(days=_number("RL_VERIFY_STANDING_APPROVAL_DAYS", 14.0, float, 0))


def approval_timeout(now: datetime | None = None, schedule: str | None = SCHEDULE) -> timedelta | None:
    """How long a card waits for a person before the run ends NOT APPROVED (timed out).

    RL_VERIFY_APPROVAL_TIMEOUT_S when set (0 = no limit); otherwise until one minute before the
    next scheduled tick (at least one minute), so an unanswered card never blocks the next nightly;
    no limit when there is no schedule.
    """
    if os.environ.get("RL_VERIFY_APPROVAL_TIMEOUT_S", "").strip():
        seconds = _number("RL_VERIFY_APPROVAL_TIMEOUT_S", 0.0, float, 0)
        return timedelta(seconds=seconds) if seconds > 0 else None
    if schedule is None:
        return None
    import pendulum
    from croniter import croniter

    now = (now or pendulum.now("UTC")).astimezone(pendulum.timezone(TIMEZONE))
    tick = croniter(schedule, now).get_next(datetime)
    return max(timedelta(minutes=1), tick - now - timedelta(minutes=1))


def missed_ticks(previous: datetime, current: datetime, schedule: str | None = SCHEDULE) -> list[datetime]:
    """Schedule ticks strictly between two scheduled runs' logical dates: runs that never started."""
    if schedule is None:
        return []
    import pendulum
    from croniter import croniter

    it = croniter(schedule, previous.astimezone(pendulum.timezone(TIMEZONE)))
    out: list[datetime] = []
    while len(out) < 1000:  # a bound: a year of hourly ticks is listed as its first 1000
        tick = it.get_next(datetime)
        if tick >= current:
            break
        out.append(tick)
    return out

#: The run param ``baseline_versions``: empty (each suite's current baseline version) or ``suite=N``
#: pairs, e.g. ``opd=2`` (rl_verify.store.baselines.parse_pins validates it).
BASELINE_PIN_PATTERN = (r"^$|^[a-z][a-z0-9_]{0,39}=[vV]?[1-9][0-9]{0,5}"
                        r"(,[a-z][a-z0-9_]{0,39}=[vV]?[1-9][0-9]{0,5})*$")

#: How long a run waits for a baseline version another run is writing (version.json comes last) before it
#: calls the folder an interrupted write.
BASELINE_WRITE_WAIT_S = 60.0

#: The baseline calibration DAG (``dags/rl_baseline_calibration.py``).
CALIBRATION_DAG_ID = "rl_baseline_calibration"
CALIBRATION_TAGS = ["rl-verify", "xtuner", "baselines", "gpu"]
#: Where a calibration keeps its files in its run's record (``<suite>/proposal/runs.png``: the plot).
CALIBRATION_RECORD_FOLDER = "calibration"
#: What compare keeps of each run for the confirmation rule (its points and breached metrics), in its folder.
POINTS_FILE = "points.json"
#: A baseline tracker's file name: in a baseline version, and in a suite's fetched folder.
BASELINE_TRACKER_FILE = "baseline.jsonl"
#: What stops a repeat before its end (``core.confirm.stop_early``), written by its gate in its folder.
STOP_EARLY_FILE = "stop_early.json"

# --- task processes forked from a preloaded component (rl_verify.orchestration.preload) ---
#: Set (to 1) on the components that fork every task from their own process: the scheduler with the
#: LocalExecutor, Celery workers. ``plugins/airflow_local_settings.py`` then imports
#: ``TASK_PRELOAD_MODULES`` there once, and each task inherits them instead of importing them again.
PRELOAD_ENV = "RL_VERIFY_PRELOAD_TASK_MODULES"
PRELOAD = os.environ.get(PRELOAD_ENV, "").strip().lower() in ("1", "true", "yes")
#: What the tasks import: the task graphs and their bodies, the REST client (pools, run notes), the SSH
#: provider (paramiko), pandas and matplotlib (plots): each is imported by tasks of the verification, probe,
#: bisection or calibration DAG (the calibration module only by the calibration DAG's tasks).
TASK_PRELOAD_MODULES: tuple[str, ...] = (
    "rl_verify.orchestration.verification_dag",
    "rl_verify.orchestration.bisection",
    "rl_verify.orchestration.calibration",
    "airflow_client.client",
    "airflow.providers.ssh.hooks.ssh",
    "pandas",
    "matplotlib",
    "matplotlib.pyplot",
)

# --- task ids: the DAG files name their tasks with these; no package module knows any other task id ---
#: The verification DAG's task that writes the report (the UI plugin links its report from it).
REPORT_TASK = "report"
#: The verification DAG's task that fails the run on a FAIL.
VERDICT_TASK = "verdict"
#: The verification DAG's last teardown: a run ended by hand before its verdict stays failed (issue 54).
FINAL_STATE_TASK = "final_state"
#: The verification DAG's trainings are ``run_<suite>`` (the cluster policy gives each its node's pool).
TRAINING_TASK_PREFIX = "run_"
#: The calibration DAG's mapped training task: its i-th instance trains on the i-th node of the plan.
CALIBRATION_TRAINING_TASK = "train"



# --- confirming a FAIL that noise could have produced (rl_verify.core.confirm) ---
#: Repeat slots per suite in the verification DAG: the most extra runs a verification may launch.
MAX_REPEATS = 3
#: Extra runs a manual run may launch to confirm a doubtful FAIL (its param ``repeats``' default).
DEFAULT_REPEATS = 2
#: The same for scheduled runs (RL_VERIFY_SCHEDULED_REPEATS, 0 turns the confirmation off).
SCHEDULED_REPEATS = int(_number("RL_VERIFY_SCHEDULED_REPEATS", DEFAULT_REPEATS, int, 0))
if SCHEDULED_REPEATS > MAX_REPEATS:
    PROBLEMS.append(("RL_VERIFY_SCHEDULED_REPEATS", str(SCHEDULED_REPEATS), f"give 0..{MAX_REPEATS}"))
    SCHEDULED_REPEATS = DEFAULT_REPEATS
#: Separates a suite from its repeat number in task ids and folders (suite names cannot contain it).
REPEAT_MARK = "-r"

# --- the path-aware skip (rl_verify.orchestration.unchanged, issue 33) ---
#: The values of a verification's param ``lane``: ``auto`` lets a suite whose diff since its verified PASS touches
#: no path that can affect it end PASS (unchanged) without training, and runs the bitwise lane first where it
#: applies; ``skip``: the path-aware skip only (a bisection whose regression shows after the lane's steps);
#: ``full`` trains every suite in full.
LANES = ("auto", "skip", "full")
#: The param's default, so also what scheduled runs do (RL_VERIFY_LANE).
DEFAULT_LANE = os.environ.get("RL_VERIFY_LANE", "auto")
if DEFAULT_LANE not in LANES:
    PROBLEMS.append(("RL_VERIFY_LANE", DEFAULT_LANE, f"give one of {', '.join(LANES)}, or unset it for auto"))
    DEFAULT_LANE = "auto"
#: A scheduled run trains a suite whose last trained PASS is older than this many days even when its diff could
#: not move a number (RL_VERIFY_FULL_EVERY_DAYS): what the skip cannot see (the node's driver and packages, the
#: data on its share) is verified at least that often.
FULL_EVERY_DAYS = float(_number("RL_VERIFY_FULL_EVERY_DAYS", 7.0, float, 0))

# --- the spread the confirmation learns from the runs we make (rl_verify.core.spread, issue 34) ---
#: Where the record store keeps, per suite, one entry per finished verification: its spread key, outcome and
#: every run's judged points (``<root>/spread-history/<suite>/<finished>__<run key>.json``).
SPREAD_HISTORY_FOLDER = "spread-history"
#: History older than this is not evidence of today's node (RL_VERIFY_SPREAD_HISTORY_DAYS).
SPREAD_HISTORY_DAYS = _number("RL_VERIFY_SPREAD_HISTORY_DAYS", 30, float, 0)
#: The newest this many healthy verifications at most (about two months of nightlies and their repeats).
SPREAD_HISTORY_MAX = int(_number("RL_VERIFY_SPREAD_HISTORY_MAX", 60, int, 0))
#: Family-wise p of the drift alarm over a suite's metrics (two-sided F test of learned against prior spread).
SPREAD_DRIFT_P = 0.01


def attempt_name(suite: str, attempt: int = 0) -> str:
    """``suite`` for a suite's first run, ``suite-r<k>`` for its k-th repeat: its record folder, job
    folder and WORK_DIR on the node."""
    return suite if attempt == 0 else f"{suite}{REPEAT_MARK}{attempt}"


def retry_job(name: str, attempt: int) -> str:
    """The job of a training's ``attempt``-th try after infrastructure failures (issue 55): ``name`` for the first,
    ``<name>-t<n>`` after: its own job folder, WORK_DIR and marker on the node."""
    return name if attempt <= 1 else f"{name}-t{attempt}"


def attempt_jobs(name: str) -> list[str]:
    """Every job a training ``name`` may start: its first attempt and each retry's."""
    return [retry_job(name, n) for n in range(1, MAX_INFRA_RETRIES + 2)]


#: The bitwise lane's deterministic jobs of a suite (issue 33): the lane itself and a reference's two self-check runs.
LANE_JOBS = ("lane", "ref1", "ref2")
#: Seconds a lane job that records the lane's executed lines and stops itself after the lane's steps (the spec's
#: ``evidence.stop_env`` / ``stop_config``) is given to end on its own once its k steps are read, before it is stopped:
#: a process stopped while coverage.py saves its data leaves a file no reading can trust (no evidence).
LANE_EVIDENCE_END_S = 120


def lane_job(suite: str, which: str) -> str:
    """The job name (folder, WORK_DIR, record folder) of one of ``suite``'s deterministic jobs (``LANE_JOBS``)."""
    if which not in LANE_JOBS:
        raise ValueError(f"lane job {which!r} is not one of {LANE_JOBS}")
    return f"{suite}-{which}"


def training_task(suite: str, attempt: int = 0) -> str:
    """The verification DAG's training task of ``suite`` (``attempt`` > 0: of its repeat)."""
    return TRAINING_TASK_PREFIX + attempt_name(suite, attempt)


def fetch_task(suite: str, attempt: int = 0) -> str:
    return "fetch_" + attempt_name(suite, attempt)


def compare_task(suite: str, attempt: int = 0) -> str:
    return "compare_" + attempt_name(suite, attempt)


def repeat_gate_task(suite: str, attempt: int) -> str:
    """The task that decides whether repeat ``attempt`` of ``suite`` runs (skipped downstream if not)."""
    return "repeat_" + attempt_name(suite, attempt)


def attempt_tasks(suite: str, first: int = 0) -> set[str]:
    """The task ids of ``suite``'s runs from attempt ``first`` on: training, fetch, compare and each repeat's gate."""
    return {name for k in range(first, MAX_REPEATS + 1)
            for name in (training_task(suite, k), fetch_task(suite, k), compare_task(suite, k),
                         *([repeat_gate_task(suite, k)] if k else []))}


def confirm_task(suite: str) -> str:
    """The task that gives ``suite``'s outcome over its runs."""
    return "confirm_" + suite


def suite_of_training_task(task_id: str) -> str | None:
    """The suite a training task (first run or repeat) trains, or None for any other task."""
    if not task_id.startswith(TRAINING_TASK_PREFIX):
        return None
    name = task_id[len(TRAINING_TASK_PREFIX):]
    suite, mark, attempt = name.partition(REPEAT_MARK)
    return suite if not mark or attempt.isdigit() else None


# --- bisection of a reproduced FAIL (dags/rl_regression_bisect.py, rl_verify.orchestration.bisection) ---
BISECT_DAG_ID = "rl_regression_bisect"
BISECT_TAGS = ["rl-verify", "xtuner", "bisection", "gpu"]
#: The most commits after good a bisection accepts (the param ``max_commits``' default and ceiling).
BISECT_MAX_COMMITS = 64
#: The nodes a bisection probes on unless its run says otherwise (comma-separated SSH connection ids).
BISECT_NODES = os.environ.get("RL_VERIFY_BISECT_NODES", "").strip() or DEFAULT_NODE_CONN_ID
#: The bisection task waits (deferred) for its probes: a long range takes days at the runbook's scale.
BISECT_TASK_ARGS = {"retries": 0, "execution_timeout": timedelta(days=4)}
#: A bisection's probes: the verification's tasks under a DAG of their own (``dags/rl_accuracy_probe.py``), so
#: that they run at once, one per node (each node's one-slot pool keeps one training per node), while the
#: nightly stays one run at a time. Their run ids start with PROBE_RUN_PREFIX; their records live with the
#: verification's.
PROBE_DAG_ID = "rl_accuracy_probe"
PROBE_TAGS = ["rl-verify", "xtuner", "accuracy", "bisection", "gpu"]
PROBE_RUN_PREFIX = "bisect__"
MAX_ACTIVE_PROBES = int(_number("RL_VERIFY_MAX_ACTIVE_PROBES", 8, int, 1))


def verification_dag_of(dag_run_id: str) -> str:
    """The DAG a verification run belongs to: a bisection's probe (its id says so) or the verification."""
    return PROBE_DAG_ID if str(dag_run_id).startswith(PROBE_RUN_PREFIX) else DAG_ID
#: How often the bisection's trigger asks the API for its probes' states.
BISECT_POLL_S = _number("RL_VERIFY_BISECT_POLL_S", 10, float, 0.2)
#: A run's GPUs for the bisection card's GPU-hours when its suite spec states none (``node.gpus``); its minutes
#: at the runbook's scale are the spec's own (``runbook_minutes``).
GPUS_PER_RUN = 8
#: Task ids of the bisection DAG that the package names.
BISECT_APPROVE_TASK = "approve"
BISECT_TASK = "bisect"
#: Written into a probe's record by the bisection that stops it: its repeat gates then launch nothing.
STOPPED_BY_BISECTION_FILE = "stopped_by_bisection.json"

# --- asset events (Airflow assets; downstream DAGs schedule on them) ---
# The x- scheme is Airflow's for URIs no provider normalizes: any other scheme makes every parse of a DAG
# file (each task's too) load every provider's URI handlers first (seconds on a busy core).
#: Emitted by a verification run whose verdict is PASS: sha, suites, baseline versions, report link.
VERIFIED_COMMIT_ASSET = "x-rl-verify://verified-commit"
#: Emitted by a scheduled verification whose FAIL reproduced in the accuracy class with a known last
#: PASS: good, bad, suites, metrics; the bisection DAG is scheduled on it.
REPRODUCED_FAIL_ASSET = "x-rl-verify://reproduced-fail"
#: Emitted by a bisection that named its culprit: sha, subject, author, date, suites, report link.
CULPRIT_ASSET = "x-rl-verify://culprit"
