"""A private single-node Slurm for the tests and demos: Debian's munged, slurmctld and slurmd, run as root.

Like harness/services.py's servers: every file (munge key and socket, slurm.conf, gres.conf, state, spool,
logs, pid files) lives in the state folder it is given, the daemons listen on free ports of 127.0.0.1 and
never touch a system munged or Slurm; ``start()`` returns once the node is IDLE (polled, never a fixed sleep),
``stop()`` ends what it started, and it is a context manager::

    with Slurm(state / "slurm", gpus=16) as slurm:
        subprocess.run(["sbatch", "--gres=gpu:8", "-p", "gpu", "--account=rl-verify", "--wrap", "true"],
                       env={**os.environ, **slurm.env})

Needs root (slurmd starts jobs as their submitter, munged's key is root's) and Debian's slurmctld, slurmd,
slurm-client and munge, and for accounting slurmdbd and mariadb-server (``scripts/ensure_slurm.sh``);
``slurm_available()`` says what is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.processes import descendants, free_port, kill_tree, tail
from rl_verify.node import slurm_states

ENSURE = "scripts/ensure_slurm.sh"
#: The binaries a running cluster needs (clients included: start() polls sinfo, stop() scancel and squeue).
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol", "sacct", "munged", "munge",
            "slurmdbd", "mariadbd", "mariadb-install-db")
#: Job states squeue shows for a job that still holds or waits for resources: rl-verify's one table (issue 54).
ACTIVE_STATES = slurm_states.ACTIVE
#: Longest path of a Unix socket (sun_path is 108 bytes with the terminating NUL).
MAX_SOCKET_PATH = 107
#: NVIDIA's character-device major number: the fake /dev/nvidiaN files carry it, as real ones do.
NVIDIA_MAJOR = 195
_SEP = "\x1f"  # squeue output field separator: no job name or reason contains it
#: What a partition, account or QOS name may be here (they go into slurm.conf and a Lua string unquoted).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SlurmError(RuntimeError):
    """Slurm could not be found, started or asked (the message carries the daemons' log tails)."""


def _binary(name: str) -> str | None:
    """The binary's path: PATH first, then /usr/sbin and /usr/bin (a non-root PATH may lack /usr/sbin)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/bin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return None


def slurm_available() -> str | None:
    """None if this process can run the private Slurm (root, every binary present); else why not, with the fix.

    The tests FAIL with this message rather than skip: ``make test`` runs ``scripts/ensure_slurm.sh`` as root,
    so a missing binary is a broken set-up, not an optional feature."""
    missing = [b for b in BINARIES if _binary(b) is None]
    if _binary("mungekey") is None and _binary("create-munge-key") is None:
        missing.append("mungekey")
    if missing:
        return (f"Slurm binaries missing: {', '.join(missing)}: run {ENSURE} as root "
                "(apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server)")
    if os.geteuid() != 0:
        return "the private Slurm runs as root (slurmd starts jobs as their submitter); this process is not root"
    return None


class Slurm:
    """One private Slurm cluster on this machine: one node (this host's short name, NodeAddr 127.0.0.1) with
    ``gpus`` fake GPUs, partitions ``<partition>`` (default, up) and ``<partition>-down`` (DOWN).

    STATE/slurm.conf, gres.conf, job_submit.lua, plugstack.conf (empty: no system SPANK plugin); STATE/munge/ (key
    0400, socket, pid and seed files); STATE/ctld/ (slurmctld's state, cleared at each start), STATE/spool/ (slurmd);
    STATE/log/{slurmctld,slurmd}.log and {munged,slurmctld,slurmd}.out (each daemon's stderr; munged in the
    foreground logs only there); STATE/dev/nvidia<i> (character devices 195:i; under /dev/rlv-slurm-* where the
    state folder's filesystem is nodev). Clients need only ``env`` (``SLURM_CONF``).

    Conf choices that matter:

    - GPUs are GRES with ``File=`` character devices (slurmd drops a count-only ``gpu`` GRES of a node); jobs see
      ``CUDA_VISIBLE_DEVICES`` with their devices' indexes. ``select/cons_tres`` with ``CR_Core``: several GRES
      jobs share the node. The node declares ``max(os.cpu_count(), gpus)`` CPUs (``SlurmdParameters=
      config_overrides`` lets slurmd register more than the hardware has): a real GPU node has at least a core
      per GPU, so CPUs never limit how many GPU jobs run at once, only GPUs do.
    - ``accounting=True`` adds a private MariaDB (STATE/mariadb, 127.0.0.1, no grant tables) and slurmdbd
      (STATE/slurmdbd.conf, 0600): ``sacct`` then answers for jobs slurmctld forgot after ``MinJobAge``. Without it
      accounting is off (``accounting_storage/none``). No association is ever made (no ``AccountingStorageEnforce``),
      so either way a job carries none and Slurm
      cannot check an account or QOS. A partition's ``AllowAccounts`` then holds EVERY job PENDING ("Job's account
      not known, so it can't use this partition"), the allowed account included, while ``sbatch --test-only``
      still says it would start (with ``EnforcePartLimits=ALL`` every submission is refused instead); its
      ``AllowQos`` refuses nothing (``--test-only --qos=bogus`` is accepted). So the partition has neither: a
      ``job_submit/lua`` script (STATE/job_submit.lua, next to slurm.conf where Slurm looks for it) refuses an
      ``--account`` not in ``accounts`` and a ``--qos`` not in ``qos`` at submission, ``--test-only`` included,
      with Slurm's own errors ("Invalid account or account/partition combination specified", "Invalid qos
      specification"). A job without ``--account`` or ``--qos`` is accepted (as a default association would be).
    - ``KillWait=30`` (Slurm's default): a cancelled job's batch step has that long to end the job's marked
      processes before Slurm kills it (with 5 s, a loaded machine's step was killed midway and left the job's Ray
      daemons running); it leaves as soon as it is done, within seconds when idle. ``MinJobAge=300``: ``squeue -t
      all`` still shows an ended job for 5 minutes (``jobs()``); ``reconfigure`` shortens it (a forgotten job's test).
    """

    def __init__(self, state_dir: Path, gpus: int = 8, partition: str = "gpu",
                 accounts: tuple[str, ...] = ("rl-verify", "ml-infra"), qos: tuple[str, ...] = ("normal",),
                 task_prolog: Path | None = None, accounting: bool = False) -> None:
        if gpus < 1:
            raise ValueError(f"gpus must be at least 1, not {gpus}")
        bad = [n for n in (partition, *accounts, *qos) if not _NAME.match(n)]
        if bad or not accounts or not qos:
            raise ValueError(f"partition, accounts and QOS must be non-empty names of letters, digits, _ . -: {bad}")
        self.state_dir = Path(state_dir).resolve()
        self.gpus = gpus
        self.partition = partition
        self.accounts = tuple(accounts)
        self.qos = tuple(qos)
        #: Slurm's TaskProlog (run before each task, the batch step's too; the ``export`` lines it prints join the
        #: task's environment): what a compute node sets up for its jobs (the rig: which simulated node a job is on).
        self.task_prolog = Path(task_prolog).resolve() if task_prolog else None
        #: Job accounting through a private slurmdbd on a private MariaDB (sacct answers for jobs slurmctld forgot).
        self.accounting = accounting
        #: slurmctld forgets an ended job this long after its end (it purges about once a minute).
        self.min_job_age = 300
        self.hostname = socket.gethostname().split(".")[0]
        self.conf_path = self.state_dir / "slurm.conf"
        self.log_dir = self.state_dir / "log"
        self.munge_dir = self.state_dir / "munge"
        self.munge_socket = self.munge_dir / "munge.socket"
        self.started_in: float | None = None
        self.ports: dict[str, int] = {}
        self.devices: list[Path] = []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._socket_tmp: Path | None = None

    def __repr__(self) -> str:
        return f"Slurm(conf={str(self.conf_path)!r}, gpus={self.gpus}, ports={self.ports})"

    # -- what clients need ------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, squeue, ...) needs in its environment besides PATH: ``SLURM_CONF``.

        The conf names the munge socket (``AuthInfo=socket=...``), so clients reach this cluster's munged."""
        return {"SLURM_CONF": str(self.conf_path)}

    def run(self, *args: str, timeout: float = 30.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (stdout and stderr kept apart, text)."""
        binary = _binary(args[0]) or args[0]
        env = {**os.environ, **self.env}
        r = subprocess.run([binary, *args[1:]], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
        return r

    def jobs(self) -> list[dict[str, str]]:
        """Every job squeue shows, ended ones included (``-t all``; slurmctld forgets them after MinJobAge):
        ``{"id", "name", "state", "reason", "user", "partition"}``, in squeue's order."""
        fields = ("id", "name", "state", "reason", "user", "partition")
        fmt = _SEP.join(("%i", "%j", "%T", "%r", "%u", "%P"))
        r = self.run("squeue", "--noheader", "--states=all", f"--format={fmt}", check=True)
        return [dict(zip(fields, line.split(_SEP), strict=True)) for line in r.stdout.splitlines() if line.strip()]

    def active_jobs(self) -> list[dict[str, str]]:
        """The jobs that hold or wait for resources (pending, running, completing, ...)."""
        return [j for j in self.jobs() if j["state"] in ACTIVE_STATES]

    def node_state(self) -> str:
        """The node's state as sinfo prints it (``idle``, ``mixed``, ``down*``, ...; "" if unknown)."""
        r = self.run("sinfo", "--noheader", "--Node", f"--nodes={self.hostname}", f"--partition={self.partition}",
                     "--format=%T", timeout=15)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""

    def cancel_all(self, timeout: float = 90.0) -> None:
        """scancel every active job and wait (polling squeue) until none is left; SlurmError after ``timeout``."""
        deadline = time.monotonic() + timeout
        left = self.active_jobs()
        if left:
            self.run("scancel", *sorted({j["id"] for j in left}), check=False)
        while left:
            if time.monotonic() > deadline:
                raise SlurmError(f"slurm: jobs still active {timeout:.0f}s after scancel: {left}\n{self.log_tails()}")
            time.sleep(0.2)
            left = self.active_jobs()

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> Slurm:
        """Start munged, slurmctld and slurmd; return once the node is IDLE. SlurmError (with the daemons' log
        tails) if a daemon exits or the node is not idle within ``timeout``; what did start is stopped again."""
        reason = slurm_available()
        if reason:
            raise SlurmError(reason)
        if any(p.poll() is None for p in self._procs.values()):
            raise SlurmError("slurm: already started")
        t0 = time.monotonic()
        try:
            self._prepare()
            self._start_munged(timeout)
            self._write_conf()
            if self.accounting:
                self._start_accounting(timeout - (time.monotonic() - t0))
            self._spawn("slurmctld", [_binary("slurmctld") or "slurmctld", "-D", "-c", "-f", str(self.conf_path)])
            self._spawn("slurmd", [_binary("slurmd") or "slurmd", "-D", "-f", str(self.conf_path)])
            self._wait_for(lambda: self.node_state() == "idle", timeout - (time.monotonic() - t0),
                           f"node {self.hostname} idle")
        except BaseException:
            self.stop(cancel=False)
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _prepare(self) -> None:
        """The state folders, the munge socket's path and the fake GPU device files."""
        for sub in ("", "log", "munge", "ctld", "spool"):
            path = self.state_dir / sub
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o755)
        # 0755: clients of another user (a login node's) read slurm.conf and reach the munge socket (munged
        # warns otherwise); the key inside stays 0400. The state folder's parents are the caller's business.
        self.devices = self._make_devices()
        self.munge_socket = self.munge_dir / "munge.socket"
        if len(str(self.munge_socket)) > MAX_SOCKET_PATH:  # e.g. a deep pytest folder: a short one of its own
            self._socket_tmp = Path(tempfile.mkdtemp(prefix="munge-"))
            os.chmod(self._socket_tmp, 0o755)
            self.munge_socket = self._socket_tmp / "munge.socket"

    def _make_devices(self) -> list[Path]:
        """Character devices nvidia0..N-1 (195:i) in STATE/dev, or under /dev where the state folder's
        filesystem refuses device nodes (mknod fails, or it is mounted nodev)."""
        folders = [self.state_dir / "dev", Path(f"/dev/rlv-slurm-{os.getpid()}-{id(self):x}")]
        last: OSError | None = None
        for folder in folders:
            made: list[Path] = []
            try:
                folder.mkdir(parents=True, exist_ok=True)
                if os.statvfs(folder).f_flag & os.ST_NODEV:
                    raise OSError(f"{folder} is on a nodev filesystem")
                for i in range(self.gpus):
                    path = folder / f"nvidia{i}"
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
                    os.chmod(path, 0o666)  # mknod's mode is cut by the umask
                    made.append(path)
                return made
            except OSError as e:
                last = e
                for path in made:
                    with contextlib.suppress(OSError):
                        path.unlink()
        raise SlurmError(f"slurm: cannot make the fake GPU device files: {last}")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        """Start a daemon in the foreground in its own session, stdout and stderr to STATE/log/<name>.out."""
        env = {**os.environ, **self.env}
        with open(self.log_dir / f"{name}.out", "ab") as out:
            self._procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 cwd=self.state_dir, env=env, start_new_session=True)

    def _start_munged(self, timeout: float) -> None:
        """A private munged: its own key (0400), socket, pid, log and seed files; ready when ``munge -n`` works."""
        key = self.munge_dir / "munge.key"
        if not key.exists():
            mungekey = _binary("mungekey")
            if mungekey:
                r = subprocess.run([mungekey, "--create", "--keyfile", str(key)], text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
                if r.returncode != 0:
                    raise SlurmError(f"slurm: mungekey failed ({r.returncode}): {r.stdout.strip()}")
            else:  # munge < 0.5.14 has no mungekey: 1024 random bytes are a valid key
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
                with os.fdopen(fd, "wb") as f:
                    f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        with contextlib.suppress(FileNotFoundError):
            self.munge_socket.unlink()
        self._spawn("munged", [
            _binary("munged") or "munged", "--foreground",
            # --force: run although root owns it (munged prefers its own user), and past a stale socket. The log
            # file is named only to keep munged off /var/log/munge: in the foreground it logs to stderr.
            "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={self.munge_dir / 'munged.pid'}", f"--log-file={self.log_dir / 'munged.log'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}", "--num-threads=4"])
        munge = _binary("munge") or "munge"

        def credential() -> bool:
            r = subprocess.run([munge, "--no-input", f"--socket={self.munge_socket}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=10)
            return r.returncode == 0

        self._wait_for(credential, timeout, "munged answering")

    def _write_conf(self) -> None:
        """slurm.conf, gres.conf, job_submit.lua and an empty plugstack.conf in the state folder (0644: clients
        of any user read slurm.conf)."""
        if not self.ports:  # chosen once: a conf rewritten while the cluster runs (reconfigure) keeps them
            for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb"):
                port = free_port()
                while port in self.ports.values():
                    port = free_port()
                self.ports[name] = port
        ctld_port, slurmd_port = self.ports["slurmctld"], self.ports["slurmd"]
        s, logs = self.state_dir, self.log_dir
        cpus = max(os.cpu_count() or 1, self.gpus)
        memory_mib = _memory_mib()
        auth_info = f"socket={self.munge_socket}"
        lines = [
            "# A private single-node Slurm (generated by harness/slurm.py; do not edit)",
            # Fixed: slurmctld refuses a StateSaveLocation written under another cluster name (even with -c).
            "ClusterName=rlvlocal",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # Read by the daemons and by every client: the private munged, never /run/munge's.
            f"AuthInfo={auth_info}",
            f"StateSaveLocation={s / 'ctld'}",
            f"SlurmdSpoolDir={s / 'spool'}",
            f"SlurmctldPidFile={s / 'slurmctld.pid'}",
            f"SlurmdPidFile={s / 'slurmd.pid'}",
            f"SlurmctldLogFile={logs / 'slurmctld.log'}",
            f"SlurmdLogFile={logs / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={s / 'plugstack.conf'}",
            # No cgroups (none to delegate here): processes tracked through /proc, tasks not bound.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            # AccountingStoragePass names the munge socket slurmctld signs its slurmdbd connection with.
            *(["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
               f"AccountingStoragePort={self.ports['slurmdbd']}", f"AccountingStoragePass={self.munge_socket}"]
              if self.accounting
              else ["AccountingStorageType=accounting_storage/none"]),
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            # STATE/job_submit.lua (next to slurm.conf, where Slurm looks) refuses unknown accounts and QOS.
            "JobSubmitPlugins=lua",
            "SchedulerType=sched/backfill",
            # Schedule a submitted batch job at once, not batched for up to 3 s (the default batch_sched_delay).
            "SchedulerParameters=batch_sched_delay=0",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            # The node may declare more CPUs than the machine has (see the class docstring).
            "SlurmdParameters=config_overrides",
            *([f"TaskProlog={self.task_prolog}"] if self.task_prolog else []),
            "KillWait=30",
            f"MinJobAge={self.min_job_age}",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "MailProg=/bin/true",  # Debian's default /usr/bin/mail is absent: slurmctld logs an error
            "Waittime=0",
            f"NodeName={self.hostname} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mib} "
            f"Gres=gpu:{self.gpus} State=UNKNOWN",
            # No AllowAccounts/AllowQos: without slurmdbd they hold every job PENDING (job_submit.lua checks).
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName={self.partition}-down Nodes=ALL MaxTime=INFINITE State=DOWN",
            "",
        ]
        folder = self.devices[0].parent
        files = {
            "slurm.conf": "\n".join(lines),
            "gres.conf": f"Name=gpu File={folder}/nvidia[0-{self.gpus - 1}]\n" if self.gpus > 1
            else f"Name=gpu File={folder}/nvidia0\n",
            "plugstack.conf": "",
            "job_submit.lua": _job_submit_lua(self.accounts, self.qos),
        }
        for name, text in files.items():
            path = s / name
            path.write_text(text)
            os.chmod(path, 0o644)
        dbd = s / "slurmdbd.conf"   # next to slurm.conf, where slurmdbd looks (SLURM_CONF's folder); 0600: slurmdbd
        with contextlib.suppress(FileNotFoundError):  # refuses a conf others may read
            dbd.unlink()
        fd = os.open(dbd, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join([
                "# The private slurmdbd (generated by harness/slurm.py; do not edit)",
                "AuthType=auth/munge", f"AuthInfo={auth_info}", "DbdAddr=127.0.0.1", "DbdHost=localhost",
                f"DbdPort={self.ports['slurmdbd']}", "SlurmUser=root", f"PidFile={s / 'slurmdbd.pid'}",
                f"LogFile={logs / 'slurmdbd.log'}", "DebugLevel=info",
                "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
                f"StoragePort={self.ports['mariadb']}", "StorageUser=root", "StorageLoc=slurm_acct_db", ""]))

    def _start_accounting(self, timeout: float) -> None:
        """A private MariaDB (its own data folder, 127.0.0.1 only, no grant tables: nothing else reaches it) and a
        slurmdbd on it; ready when slurmdbd takes connections (slurmctld registers the cluster itself)."""
        deadline = time.monotonic() + timeout
        data = self.state_dir / "mariadb"
        if not (data / "mysql").exists():
            r = subprocess.run([_binary("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
                                f"--datadir={data}", "--user=root", "--skip-test-db",
                                "--auth-root-authentication-method=normal"], text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=max(30.0, timeout))
            if r.returncode != 0:
                raise SlurmError(f"slurm: mariadb-install-db failed ({r.returncode}): {r.stdout[-2000:]}")
        socket_path = (self._socket_tmp or self.munge_dir) / "mariadb.sock"
        self._spawn("mariadbd", [
            _binary("mariadbd") or "mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
            "--bind-address=127.0.0.1", f"--port={self.ports['mariadb']}", f"--socket={socket_path}",
            f"--pid-file={self.state_dir / 'mariadb.pid'}", f"--log-error={self.log_dir / 'mariadb.log'}",
            "--skip-grant-tables", "--skip-name-resolve"])
        self._wait_for(lambda: _accepts(self.ports["mariadb"]), deadline - time.monotonic(), "MariaDB listening")
        self._spawn("slurmdbd", [_binary("slurmdbd") or "slurmdbd", "-D"])
        self._wait_for(lambda: _accepts(self.ports["slurmdbd"]), deadline - time.monotonic(), "slurmdbd listening")

    def reconfigure(self, *, min_job_age: int | None = None, accounting: bool | None = None) -> None:
        """Change the running cluster's conf: ``min_job_age`` through ``scontrol reconfigure``; ``accounting`` (only
        off, or back on where slurmdbd runs) by restarting slurmctld from its saved state, as a site does."""
        if accounting and "slurmdbd" not in self._procs:
            raise SlurmError("slurm: accounting can only come back where slurmdbd runs (start with accounting)")
        if min_job_age is not None:
            self.min_job_age = min_job_age
        restart = accounting is not None and accounting != self.accounting
        if accounting is not None:
            self.accounting = accounting
        self._write_conf()
        if restart:
            self.stop_controller()
            self.start_controller()
            # A restarted slurmctld knows its node again only once slurmd registers: until then sbatch --test-only
            # refuses the next run's job ("Requested node configuration is not available").
            self._wait_for(lambda: self.node_state() in ("idle", "mixed", "allocated", "completing"), 90,
                           "the node back in service after the restart")
        else:
            self.run("scontrol", "reconfigure", check=True)

    def _wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ready() until True; SlurmError with the log tails when a daemon exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                if ready():
                    return
            died = [f"{n} exited with {p.returncode}" for n, p in self._procs.items() if p.poll() is not None]
            if died:
                raise SlurmError(f"slurm: waiting for {what}: {', '.join(died)}\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise SlurmError(f"slurm: {what}: not within {timeout:.0f}s\n{self.log_tails()}")
            time.sleep(0.1)

    def log_tails(self, lines: int = 20) -> str:
        """The last lines of every daemon's log and captured output."""
        parts = []
        for name in ("munged.log", "munged.out", "slurmctld.log", "slurmctld.out", "slurmd.log", "slurmd.out",
                     "slurmdbd.log", "slurmdbd.out", "mariadb.log", "mariadbd.out"):
            path = self.log_dir / name
            if path.exists() and path.stat().st_size:
                parts.append(f"== {path}\n{tail(path, lines)}")
        return "\n".join(parts) or "(no daemon log)"

    def stop_controller(self, timeout: float = 10.0) -> None:
        """End slurmctld (SIGTERM, SIGKILL after ``timeout``) as an outage or a restart does: slurmd and the jobs it
        runs go on, Slurm's clients fail ("Unable to contact slurm controller") until :meth:`start_controller`."""
        proc = self._procs.pop("slurmctld", None)
        if proc is not None and proc.poll() is None:
            kill_tree([proc.pid], descendants(proc.pid), timeout)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def start_controller(self, timeout: float = 90.0) -> float:
        """Start slurmctld again from its saved state (no ``-c``: the jobs it knew are recovered); return the seconds
        until squeue answers again. SlurmError with the logs after ``timeout``."""
        if self._procs.get("slurmctld") is not None and self._procs["slurmctld"].poll() is None:
            raise SlurmError("slurm: slurmctld is running")
        t0 = time.monotonic()
        self._spawn("slurmctld", [_binary("slurmctld") or "slurmctld", "-D", "-f", str(self.conf_path)])
        self._wait_for(lambda: self.run("squeue", "--noheader", timeout=30).returncode == 0, timeout,
                       "slurmctld answering again")
        return time.monotonic() - t0

    def running(self) -> bool:
        """Whether every daemon this object started is still running."""
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def stop(self, timeout: float = 10.0, cancel: bool = True) -> None:
        """Cancel every job (``cancel``: and wait until squeue shows none), then end slurmd, slurmctld and munged
        (SIGTERM, SIGKILL after ``timeout``) and any process of a job of this cluster still left; remove the device
        files. Safe to call twice and after a failed start."""
        ctld = self._procs.get("slurmctld")
        if cancel and ctld is not None and ctld.poll() is None:
            with contextlib.suppress(SlurmError, subprocess.SubprocessError, OSError):
                self.cancel_all()
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                kill_tree([proc.pid], descendants(proc.pid), timeout)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        # A job's slurmstepd leaves slurmd's process tree (it is reparented to init, in a session of its own):
        # after a cancel that failed or timed out, its processes are found by this cluster's conf in their
        # environment.
        steps, left = self._job_processes()
        if left:
            kill_tree(steps, left, timeout)
        for path in self.devices:
            with contextlib.suppress(OSError):
                path.unlink()
        if self.devices and self.devices[0].parent.is_relative_to("/dev"):
            with contextlib.suppress(OSError):
                self.devices[0].parent.rmdir()
        self.devices = []
        if self._socket_tmp is not None:
            shutil.rmtree(self._socket_tmp, ignore_errors=True)
            self._socket_tmp = None

    def _job_processes(self) -> tuple[list[int], list[int]]:
        """(slurmstepd pids, every pid) of this cluster's jobs still running: processes whose environment has this
        cluster's SLURM_CONF and either are a slurmstepd or carry SLURM_JOB_ID (a login shell that merely has
        SLURM_CONF, and this process, are left alone)."""
        conf = f"SLURM_CONF={self.conf_path}".encode()
        steps: list[int] = []
        every: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if conf not in env:
                continue
            if comm == "slurmstepd":
                steps.append(int(entry.name))
            elif not any(v.startswith(b"SLURM_JOB_ID=") for v in env):
                continue
            every.append(int(entry.name))
        return steps, every

    def __enter__(self) -> Slurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    """Whether something takes TCP connections on 127.0.0.1:``port``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False


def _memory_mib() -> int:
    """RealMemory for the node: 90 % of the machine's (slurmd would drain a node claiming more than it has)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return max(1, int(line.split()[1]) // 1024 * 9 // 10)
    return 1024


def _job_submit_lua(accounts: tuple[str, ...], qos: tuple[str, ...]) -> str:
    """A job_submit/lua script refusing an ``--account`` not in ``accounts`` and a ``--qos`` not in ``qos``, with
    Slurm's own error codes (so sbatch prints Slurm's own words) and a line naming what is allowed."""
    def table(names: tuple[str, ...]) -> str:
        return "{ " + ", ".join(f'["{n}"] = true' for n in names) + " }"

    return "\n".join([
        "-- generated by harness/slurm.py. Accounting is off (no slurmdbd): Slurm knows no account or QOS, and a",
        "-- partition's AllowAccounts/AllowQos would hold every job PENDING (\"Job's account not known\").",
        "-- The allowed ones are checked here instead, when a job is submitted (sbatch --test-only included).",
        f"local allowed_accounts = {table(accounts)}",
        f"local allowed_qos = {table(qos)}",
        f'local allowed_accounts_text = "{",".join(accounts)}"',
        f'local allowed_qos_text = "{",".join(qos)}"',
        "-- Slurm's error numbers (slurm_errno.h): 22.05's lua table has no ESLURM_INVALID_QOS.",
        "local ESLURM_INVALID_ACCOUNT = 2045",
        "local ESLURM_INVALID_QOS = 2066",
        "function slurm_job_submit(job_desc, part_list, submit_uid)",
        "  if job_desc.account ~= nil and not allowed_accounts[job_desc.account] then",
        '    slurm.log_user("Invalid account or account/partition combination specified: %s (allowed: %s)",',
        "                   job_desc.account, allowed_accounts_text)",
        "    return ESLURM_INVALID_ACCOUNT",
        "  end",
        "  if job_desc.qos ~= nil and not allowed_qos[job_desc.qos] then",
        '    slurm.log_user("Invalid qos specification: %s (allowed: %s)", job_desc.qos, allowed_qos_text)',
        "    return ESLURM_INVALID_QOS",
        "  end",
        "  return slurm.SUCCESS",
        "end",
        "function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)",
        "  return slurm.SUCCESS",
        "end",
        "",
    ])


__all__ = ["ACTIVE_STATES", "Slurm", "SlurmError", "slurm_available"]
