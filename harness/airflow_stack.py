"""Start and stop a REAL local Apache Airflow 3.3 (SQLite + LocalExecutor, or Celery): the process lifecycle.

Used by the end-to-end tests and the demo. This module owns the components' configuration (all of it
environment variables), their processes and logs, and the wait until they are healthy. Talking to the
running Airflow is ``harness.airflow_api.AirflowClient`` (``stack.client()`` gives one logged in as
the demo user); ``AirflowClient`` and ``StackError`` are importable from here too, where the tests and
scripts have always imported them. Process helpers come from the leaf ``harness.processes``.

Everything lives in one state directory:

    STATE/airflow_home/        AIRFLOW_HOME (airflow.cfg is never written; config is all env vars)
    STATE/airflow.db           SQLite metadata database
    STATE/secrets.json         generated fernet key, JWT secret, API secret key (0600, never printed)
    STATE/passwords.json       simple auth manager password file {"demo": "<generated>"} (0600)
    STATE/stack.json           port, base URL, pids (for `stop` from another process)
    STATE/logs/<component>.log stdout+stderr of api-server, scheduler, triggerer, dag-processor
    STATE/airflow_home/logs/   task logs

Library use::

    from harness.airflow_stack import AirflowStack
    with AirflowStack(state_dir, dags_folder=...) as stack:      # start() on enter, stop() on exit
        api = stack.client()
        api.wait_for_dag("my_dag"); api.unpause("my_dag")
        run_id = api.trigger("my_dag", {"commit": "main"})
        hitl = api.wait_for_hitl("my_dag", run_id)
        api.respond_hitl("my_dag", run_id, hitl["task_instance"]["task_id"], ["Approve"])
        assert api.wait_for_run("my_dag", run_id) == "success"

Celery mode (a distributed Airflow; harness/services.py runs PostgreSQL, Redis and an S3 store)::

    with Postgres(state / "pg") as pg, Redis(state / "redis") as redis:
        stack = AirflowStack(state / "airflow", dags_folder=..., executor="CeleryExecutor",
                             database_url=pg.sqlalchemy_url, broker_url=redis.url,
                             celery_workers=[WorkerSpec("worker-a", env={...}), WorkerSpec("worker-b")])
        with stack: ...

    The metadata DB is the given PostgreSQL (result backend db+<database_url>), the broker the given Redis.
    Besides the four components, one ``airflow celery worker`` per WorkerSpec (component
    ``celery-<name>``, log STATE/logs/celery-<name>.log) with its own ``--celery-hostname`` (Celery node
    ``celery@<name>``), working directory (STATE/workers/<name> unless given), extra env and concurrency;
    start() returns once every worker answers a Celery ping. A worker's task instances record
    ``hostname`` = the WorkerSpec's hostname (default its name; harness.celery_hostname.worker_hostname), not the
    machine's FQDN that two workers on one machine would share. Worker logs are not served over HTTP
    (``--skip-serve-logs``): all task logs are in the one local STATE/airflow_home/logs.

Command line::

    python -m harness.airflow_stack start --state .state/airflow [--dags DIR] [--env K=V ...]
    python -m harness.airflow_stack stop --state .state/airflow
    python -m harness.airflow_stack status --state .state/airflow
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.airflow_api import AirflowClient, StackError, probe_health
from harness.celery_hostname import WORKER_HOSTNAME_CALLABLE, WORKER_HOSTNAME_ENV
from harness.processes import alive, descendants, free_port, kill_tree, tail, write_private

#: rl_verify.settings.PRELOAD_ENV (the harness does not import the package it starts).
PRELOAD_ENV = "RL_VERIFY_PRELOAD_TASK_MODULES"

PROJECT_ROOT = Path(__file__).resolve().parent.parent
USERNAME = "demo"
ROLE = "admin"
#: A user who can log in but whom the auth manager grants nothing (no role): what a person without
#: access to the verification DAG gets from the UI plugin's routes (the simple auth manager has no
#: per-DAG grants outside multi-team mode).
OUTSIDER = "outsider"
COMPONENTS = ("api-server", "scheduler", "triggerer", "dag-processor")
HEALTH_KEYS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
EXECUTORS = ("LocalExecutor", "CeleryExecutor")
_WORKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class WorkerSpec:
    """One Celery worker of an AirflowStack in Celery mode.

    name: Celery node ``celery@<name>`` and component ``celery-<name>``; env: extra environment (last
    word, e.g. the worker's own local folders); cwd: working directory (default STATE/workers/<name>);
    hostname: what its task instances record as ``hostname`` (default: name); queues: Celery queues
    (comma-separated, default Airflow's default queue).
    """

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | os.PathLike[str] | None = None
    concurrency: int = 4
    hostname: str | None = None
    queues: str | None = None

    @property
    def component(self) -> str:
        return f"celery-{self.name}"

    @property
    def node_name(self) -> str:
        return f"celery@{self.name}"


# The scheduler's log line once it has processed a worker's executor event, e.g.
#   ... [info     ] TaskInstance Finished: dag_id=d, task_id=t, run_id=r, map_index=-1, ti_id=<uuid>, ...,
#   try_number=1, max_tries=2, ...
# Pinned to the wording of Airflow 3.3.2's scheduler (SchedulerJobRunner.process_executor_events); the
# only reader is AirflowStack.worker_released (the HITL race workaround, see AirflowClient.wait_for_hitl).
# tests/unit/test_harness.py pins it on a real 3.3.2 line: re-check both when upgrading Airflow.
SCHEDULER_TI_FINISHED = re.compile(r"TaskInstance Finished: .*?ti_id=([0-9a-fA-F-]+),.*?try_number=(\d+),")


def finished_task_instances(scheduler_log: str) -> set[tuple[str, int]]:
    """(ti_id, try_number) of every "TaskInstance Finished" line in a piece of scheduler log."""
    return {(m.group(1), int(m.group(2))) for m in SCHEDULER_TI_FINISHED.finditer(scheduler_log)}


class AirflowStack:
    """A real local Airflow (api-server, scheduler, triggerer, dag-processor) on SQLite, in state_dir;
    in Celery mode on PostgreSQL with Redis and Celery workers (see the module's docstring)."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        dags_folder: str | os.PathLike[str] | None = None,
        plugins_folder: str | os.PathLike[str] | None = None,
        python: str | None = None,
        port: int | None = None,
        parallelism: int = 8,
        *,
        executor: str = "LocalExecutor",
        database_url: str | None = None,
        database_migrated: bool = False,
        broker_url: str | None = None,
        result_backend: str | None = None,
        celery_workers: Sequence[WorkerSpec] = (),
    ) -> None:
        """Default: LocalExecutor on SQLite (STATE/airflow.db). executor="CeleryExecutor" needs
        database_url (e.g. harness.services.Postgres.sqlalchemy_url), broker_url (Redis) and at least one
        WorkerSpec; result_backend defaults to "db+" + database_url. database_url alone (LocalExecutor)
        replaces SQLite; ``database_migrated``: that database is known to be migrated by this Airflow (a copy of
        a migrated template), so start skips ``airflow db migrate`` (a process of ~12 s of CPU)."""
        if executor not in EXECUTORS:
            raise StackError(f"executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
        workers = list(celery_workers)
        if executor == "CeleryExecutor":
            if not database_url or not broker_url or not workers:
                raise StackError("CeleryExecutor needs database_url, broker_url and at least one WorkerSpec")
            names = [w.name for w in workers]
            bad = [n for n in names if not _WORKER_NAME.match(n)]
            if bad or len(set(names)) != len(names):
                raise StackError(f"worker names must be unique and [A-Za-z0-9_.-]: {names}")
        elif workers or broker_url or result_backend:
            raise StackError("celery_workers, broker_url and result_backend need executor='CeleryExecutor'")
        self.executor = executor
        self.database_url = database_url
        self.database_migrated = database_migrated
        self.broker_url = broker_url
        self.result_backend = result_backend or (f"db+{database_url}" if executor == "CeleryExecutor" else None)
        self.celery_workers = workers
        self.state_dir = Path(state_dir).resolve()
        self.dags_folder = Path(dags_folder or PROJECT_ROOT / "dags").resolve()
        self.plugins_folder = Path(plugins_folder or PROJECT_ROOT / "plugins").resolve()
        self.python = python or sys.executable
        self.port = port
        self.parallelism = parallelism
        self.home = self.state_dir / "airflow_home"
        self.log_dir = self.state_dir / "logs"
        self.password_file = self.state_dir / "passwords.json"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}
        self.started_in: float | None = None
        self.workers_ready_in: float | None = None
        self._client: AirflowClient | None = None
        self._released: set[tuple[str, int]] = set()
        self._sched_offset = 0

    # -- config ---------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def username(self) -> str:
        return USERNAME

    @property
    def password(self) -> str:
        return json.loads(self.password_file.read_text())[USERNAME]

    def password_of(self, user: str) -> str:
        """The password of ``user`` (``USERNAME`` or ``OUTSIDER``)."""
        return json.loads(self.password_file.read_text())[user]

    def _secrets(self) -> dict[str, str]:
        path = self.state_dir / "secrets.json"
        if path.exists():
            return json.loads(path.read_text())
        values = {
            "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "jwt_secret": secrets.token_urlsafe(48),
            "api_secret_key": secrets.token_urlsafe(32),
        }
        write_private(path, json.dumps(values))
        return values

    def ensure_password(self) -> None:
        """Create the demo user's password file (once); the password is readable from then on."""
        try:
            existing = json.loads(self.password_file.read_text())
        except (OSError, ValueError):
            existing = {}
        missing = [u for u in (USERNAME, OUTSIDER) if not existing.get(u)]
        for user in missing:
            existing[user] = secrets.token_urlsafe(18)
        if missing:
            write_private(self.password_file, json.dumps(existing) + "\n")

    def build_env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment of every component: inherited env, minus foreign AIRFLOW__ config, plus ours."""
        s = self._secrets()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__") and k != "AIRFLOW_CONFIG"}
        cfg = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.plugins_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__FERNET_KEY": s["fernet_key"],
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:{ROLE},{OUTSIDER}:",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.password_file),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # SQLite lets one writer in at a time and sqlite3 gives up after 5 s ("database is locked"): on two busy
            # cores a scheduler write held the lock longer and the triggerer died of it mid-test (its deferred
            # trainings never resumed). The pysqlite dialect takes the wait from the URL: 20 s, below the harness
            # client's 30 s read timeout (at 60 s an API request waiting on the lock timed the client out).
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
                self.database_url or f"sqlite:///{self.state_dir / 'airflow.db'}?timeout=20",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": s["api_secret_key"],
            "AIRFLOW__API__EXPOSE_CONFIG": "False",
            "AIRFLOW__API_AUTH__JWT_SECRET": s["jwt_secret"],
            # New DAG files are seen within seconds; an unchanged file is re-parsed once a minute, not every 5 s:
            # four DAG files re-parsed every 5 s kept one of the two cores busy and slowed every e2e test.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
            # A task parses its DAG file before it runs: on a busy 2-core machine that took 16-40 s, past the
            # 30 s default, and the task died on its first try (a training task is never retried).
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "180",
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "240",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            # The task supervisor notices its task process exited only at its next heartbeat check:
            # 1 s instead of 5 s saves ~4 s per task.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # Per-stack log-server ports so two stacks (or another Airflow) on one machine do not collide.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            "PYTHONUNBUFFERED": "1",
        }
        if self.executor == "CeleryExecutor":
            cfg.update({
                "AIRFLOW__CELERY__BROKER_URL": str(self.broker_url),
                "AIRFLOW__CELERY__RESULT_BACKEND": str(self.result_backend),
                # Sending a task to the broker: 1 s by default, tight on 2 busy cores.
                "AIRFLOW__CELERY__OPERATION_TIMEOUT": "10",
                # Airflow's default (24 h), set so that every component does not warn that it is unset.
                "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
            })
        env.update(cfg)
        if extra_env:
            env.update({k: str(v) for k, v in extra_env.items()})
        return env

    # -- lifecycle ------------------------------------------------------------------------------
    def _run(self, *args: str, timeout: float = 600) -> None:
        log = self.log_dir / f"{args[0]}.log"
        with open(log, "ab") as out:
            r = subprocess.run(
                [self.python, "-m", "airflow", *args], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, timeout=timeout, cwd=self.state_dir,
            )
        if r.returncode != 0:
            raise StackError(f"airflow {' '.join(args)} failed ({r.returncode}):\n{tail(log, 40)}")

    def start(self, extra_env: Mapping[str, str] | None = None, timeout: float = 240.0) -> AirflowStack:
        """Migrate the DB, start the four components, wait until /monitor/health is all healthy."""
        if self.procs:
            raise StackError("stack already started")
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.port = self.port or free_port()
        self.ensure_password()
        self.env = self.build_env(extra_env)
        try:
            self._migrate()
            for name in COMPONENTS:
                self._launch(name)
            for spec in self.celery_workers:
                self._launch(spec.component)
            self._write_stack_file()
            self._wait_healthy(deadline=t0 + timeout)
            if self.celery_workers:
                self._wait_workers(self.celery_workers, deadline=t0 + timeout)
                self.workers_ready_in = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def migrate(self) -> None:
        """Migrate this stack's metadata database and start nothing (e.g. to fill a database template)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.port = self.port or free_port()
        self.ensure_password()
        self.env = self.build_env()
        self._run("db", "migrate")

    def _migrate(self) -> None:
        """A migrated metadata database: a new SQLite one is a copy of this Airflow version's migrated template
        (made once, under a lock, by ``airflow db migrate``); an existing one or another database is migrated."""
        db = self.state_dir / "airflow.db"
        if self.database_url and self.database_migrated:
            return
        if self.database_url or db.exists():
            self._run("db", "migrate")
            return
        template = migrated_sqlite_template(self.python, self.env, self.log_dir / "db.log")
        copy_sqlite(template, db)

    def _worker(self, component: str) -> WorkerSpec | None:
        return next((w for w in self.celery_workers if w.component == component), None)

    def _launch(self, name: str) -> None:
        """Start one component in its own session, appending to its log file."""
        argv, env, cwd = [self.python, "-m", "airflow", name], self.env, self.state_dir
        if name == "scheduler" and self.executor == "LocalExecutor":
            env = self._forking_tasks(env)
        spec = self._worker(name)
        if spec is not None:
            argv = [self.python, "-m", "airflow", "celery", "worker", "--celery-hostname", spec.name,
                    "--concurrency", str(spec.concurrency), "--skip-serve-logs"]
            if spec.queues:
                argv += ["--queues", spec.queues]
            cwd = Path(spec.cwd).resolve() if spec.cwd else self.state_dir / "workers" / spec.name
            cwd.mkdir(parents=True, exist_ok=True)
            env = self._forking_tasks(self.env)
            # The hostname callable lives in this repository: the worker runs from its own folder.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
            env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = WORKER_HOSTNAME_CALLABLE
            env[WORKER_HOSTNAME_ENV] = spec.hostname or spec.name
            env.update({k: str(v) for k, v in spec.env.items()})
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
            )

    @staticmethod
    def _forking_tasks(env: Mapping[str, str]) -> dict[str, str]:
        """The environment of a component that forks every task: it preloads the tasks' modules once (unless
        the caller's environment says otherwise)."""
        return {**env, PRELOAD_ENV: env.get(PRELOAD_ENV, "1")}

    def ping_workers(self, timeout: float = 1.0) -> set[str]:
        """Celery node names (``celery@<name>``) that answer a broadcast ping within ``timeout``."""
        from celery import Celery

        app = Celery(broker=self.broker_url, set_as_current=False)
        try:
            return {name for reply in app.control.ping(timeout=timeout) or [] for name in reply}
        except Exception:  # broker not reachable yet: nobody answered
            return set()
        finally:
            app.close()

    def _wait_workers(self, specs: Iterable[WorkerSpec], deadline: float) -> None:
        """Until every given worker answers a Celery ping (it is consuming); fails fast if one exits."""
        want = {s.node_name: s.component for s in specs}
        answered: set[str] = set()
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise StackError(f"airflow {name} exited with {p.returncode}:\n{self.log_tail(name)}")
            answered = self.ping_workers() & set(want)
            if answered == set(want):
                return
            if time.monotonic() > deadline:
                missing = sorted(set(want) - answered)
                raise StackError(f"Celery workers {missing} did not answer a ping in time\n"
                                 + "\n".join(f"== {want[n]}\n{self.log_tail(want[n], 15)}" for n in missing))

    def _write_stack_file(self) -> None:
        info = {"base_url": self.base_url, "port": self.port, "username": USERNAME,
                "password_file": str(self.password_file), "log_dir": str(self.log_dir),
                "pids": {n: p.pid for n, p in self.procs.items()}}
        (self.state_dir / "stack.json").write_text(json.dumps(info, indent=2) + "\n")

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise StackError(f"airflow {name} exited with {p.returncode}:\n{self.log_tail(name)}")
            last = probe_health(self.base_url)
            if isinstance(last, dict) and all((last.get(k) or {}).get("status") == "healthy" for k in HEALTH_KEYS):
                return
            if time.monotonic() > deadline:
                raise StackError(f"Airflow not healthy in time; last health: {last}\n"
                                 + "\n".join(f"== {n}\n{self.log_tail(n, 15)}" for n in self.procs))
            time.sleep(0.5)

    _HEARTBEATS = {"scheduler": ("scheduler", "latest_scheduler_heartbeat"),
                   "triggerer": ("triggerer", "latest_triggerer_heartbeat"),
                   "dag-processor": ("dag_processor", "latest_dag_processor_heartbeat")}

    def restart_component(self, name: str, timeout: float = 120.0, stop_timeout: float = 5.0) -> float:
        """Stop one component (its process group and descendants) and start it again.

        Same command, environment and log file as ``start``. Returns (the seconds it took) once
        /monitor/health is all healthy and, for a component with a heartbeat (scheduler, triggerer,
        dag-processor), the NEW process has heartbeated (a Celery worker ``celery-<name>``: answers a
        ping). Tests restart e.g. the triggerer while a task is deferred.
        """
        t0 = time.monotonic()
        self.stop_component(name, stop_timeout)
        self.start_component(name, timeout=max(1.0, timeout - (time.monotonic() - t0)))
        return time.monotonic() - t0

    def stop_component(self, name: str, stop_timeout: float = 5.0) -> None:
        """Stop one component (its process group and descendants) until ``start_component``: tests run a
        stretch with no triggerer, e.g. a DAG run ended by hand while nothing watches its deferred task."""
        if name not in self.procs or self.procs[name].poll() is not None:
            raise StackError(f"unknown or stopped component {name!r} (running: {', '.join(self.procs)})")
        old = self.procs[name]
        kill_tree([old.pid], descendants(old.pid), stop_timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            old.wait(timeout=5)

    def start_component(self, name: str, timeout: float = 120.0) -> float:
        """Start a component ``stop_component`` stopped (same command, environment and log file as ``start``);
        the seconds until it is healthy and heartbeating, as ``restart_component``."""
        if name not in self.procs:
            raise StackError(f"unknown component {name!r} (known: {', '.join(self.procs)})")
        if self.procs[name].poll() is None:
            raise StackError(f"airflow {name} is running: stop it first")
        t0 = time.monotonic()
        deadline = t0 + timeout
        since = time.time()
        self._launch(name)
        self._write_stack_file()
        self._wait_healthy(deadline=deadline)
        spec = self._worker(name)
        if spec is not None:
            self._wait_workers([spec], deadline=deadline)
        if name in self._HEARTBEATS:
            key, field = self._HEARTBEATS[name]
            while True:
                if self.procs[name].poll() is not None:
                    raise StackError(f"airflow {name} exited with {self.procs[name].returncode} after "
                                     f"restart:\n{self.log_tail(name)}")
                health = probe_health(self.base_url)
                raw = (health.get(key) or {}).get(field) if isinstance(health, dict) else None
                with contextlib.suppress(ValueError):
                    stamp = datetime.datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
                    if stamp and stamp.timestamp() >= since:
                        break
                if time.monotonic() > deadline:
                    raise StackError(f"airflow {name} did not heartbeat within {timeout}s of its restart:\n"
                                     f"{self.log_tail(name, 15)}")
                time.sleep(0.5)
        return time.monotonic() - t0

    def log_tail(self, component: str, lines: int = 40) -> str:
        return tail(self.log_dir / f"{component}.log", lines)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate every component, its process group and all descendants (task processes included)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if not self.procs:
            return
        children: set[int] = set()
        for p in self.procs.values():
            children.update(descendants(p.pid))
        kill_tree([p.pid for p in self.procs.values()], children, timeout)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self.procs.clear()
        with contextlib.suppress(OSError):
            (self.state_dir / "stack.json").unlink()

    def __enter__(self) -> AirflowStack:
        if not self.procs:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- API ------------------------------------------------------------------------------------
    def client(self) -> AirflowClient:
        """A shared REST client logged in as demo (closed by stop())."""
        if self._client is None:
            self._client = AirflowClient(self.base_url, USERNAME, self.password,
                                         worker_released=self.worker_released)
        return self._client

    def worker_released(self, ti_id: str, try_number: int) -> bool:
        """True once the scheduler logged "TaskInstance Finished" for that ti_id/try (executor event processed)."""
        seen = self._released
        if (ti_id, try_number) in seen:
            return True
        log = self.log_dir / "scheduler.log"
        offset = self._sched_offset
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return False
        cut = data.rfind(b"\n") + 1  # only complete lines
        self._sched_offset = offset + cut
        seen.update(finished_task_instances(data[:cut].decode(errors="replace")))
        return (ti_id, try_number) in seen

    def create_pool(self, name: str, slots: int, include_deferred: bool = True) -> dict:
        return self.client().create_pool(name, slots, include_deferred=include_deferred)


#: One migrated SQLite metadata database per Airflow version, copied by every new SQLite stack: ``airflow db
#: migrate`` is a process of its own, ~12 s of CPU per stack, and ``make test`` starts a dozen stacks.
DB_TEMPLATES = PROJECT_ROOT / ".state" / "db-templates"


def migrated_sqlite_template(python: str, env: Mapping[str, str], log: Path) -> Path:
    """The migrated SQLite template of the installed Airflow version (made on first use; concurrent stacks,
    e.g. two pytest workers, wait for the one that makes it)."""
    import fcntl
    from importlib.metadata import version

    DB_TEMPLATES.mkdir(parents=True, exist_ok=True)
    template = DB_TEMPLATES / f"airflow-{version('apache-airflow')}.db"
    with open(DB_TEMPLATES / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            partial = template.with_name(template.name + f".{os.getpid()}.partial")
            partial.unlink(missing_ok=True)
            menv = {**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{partial}"}
            with open(log, "ab") as out:
                r = subprocess.run([python, "-m", "airflow", "db", "migrate"], env=menv, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600, cwd=DB_TEMPLATES)
            if r.returncode != 0:
                raise StackError(f"airflow db migrate (template {template}) failed ({r.returncode}):\n{tail(log, 40)}")
            staged = partial.with_name(partial.name + ".copy")
            copy_sqlite(partial, staged)
            os.replace(staged, template)  # whole or not at all: a stack never copies a half-made template
            for leftover in DB_TEMPLATES.glob(partial.name + "*"):
                leftover.unlink()
    return template


def copy_sqlite(src: Path, dst: Path) -> None:
    """A consistent copy of the SQLite database ``src`` (its write-ahead log included) as ``dst``."""
    import sqlite3

    source, target = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def stop_from_state(state_dir: str | os.PathLike[str], timeout: float = 5.0) -> bool:
    """Stop a stack started by another process (reads STATE/stack.json). Returns False if none was running."""
    path = Path(state_dir) / "stack.json"
    if not path.exists():
        return False
    pids = list(json.loads(path.read_text())["pids"].values())
    running = [p for p in pids if alive(p)]
    children: set[int] = set()
    for p in running:
        children.update(descendants(p))
    kill_tree(running, children, timeout)
    path.unlink()
    return bool(running)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="airflow_stack", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start in the background and return once healthy")
    s.add_argument("--state", required=True)
    s.add_argument("--dags", default=None)
    s.add_argument("--plugins", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--pool", action="append", default=[], metavar="NAME=SLOTS")
    s.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the stack")
    for name in ("stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--state", required=True)
    a = ap.parse_args(argv)

    if a.cmd == "stop":
        print("stopped" if stop_from_state(a.state) else "not running")
        return 0
    if a.cmd == "status":
        path = Path(a.state) / "stack.json"
        if not path.exists():
            print("not running")
            return 1
        info = json.loads(path.read_text())
        health = probe_health(info["base_url"])
        print(json.dumps({**info, "health": health}, indent=2))
        return 0

    if stop_from_state(a.state):
        print("stopped a previous stack in", a.state)
    extra = dict(kv.split("=", 1) for kv in a.env)
    stack = AirflowStack(a.state, dags_folder=a.dags, plugins_folder=a.plugins, port=a.port)
    stack.start(extra_env=extra)
    for kv in a.pool:
        name, slots = kv.split("=", 1)
        stack.create_pool(name, int(slots))
    print(f"Airflow healthy in {stack.started_in:.1f}s at {stack.base_url} "
          f"(user {USERNAME}, password in {stack.password_file}); logs in {stack.log_dir}")
    if a.foreground:
        try:
            while all(p.poll() is None for p in stack.procs.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            stack.stop()
        return 0
    # Detach: the components run in their own sessions; `stop --state` ends them.
    stack.procs.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
