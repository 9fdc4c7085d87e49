"""Fetching a suite's files from the node over SFTP: its tracker, logs, checker output and baseline, with a
note of every file that was missing or could not be read (``fetch_suite``)."""

from __future__ import annotations

import fnmatch
import posixpath
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_verify import settings
from rl_verify.node import remote
from rl_verify.suites.spec import SuiteSpec

if TYPE_CHECKING:
    import paramiko

#: An experiment folder's name: the launch's timestamp, YYYYmmddHHMMSS.
_EXP_FOLDER = re.compile(r"\d{14}")

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
        # A Slurm job's id, what Slurm said when it ended the job without its exit code, and the batch output.
        for name in ("stdout.log", "trace.log", "exit_code", "slurm_job_id", "scheduler_end", "slurm.out"):
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
        # A job that recorded its executed lines (issue 44) ran slower than the unrecorded baseline (issue 53)
        meta["recorded_evidence"] = _mtime(sftp, posixpath.join(layout.evidence_dir(job or spec.name),
                                                                "coverage.ini")) is not None
        started = _mtime(sftp, posixpath.join(job_dir, "pid")) or _mtime(sftp, posixpath.join(job_dir, "started"))
        ended = _mtime(sftp, posixpath.join(job_dir, "exit_code"))
        meta["wall_time_s"] = (ended - started) if started and ended else None
        exit_code = dest / "logs" / "job_exit_code"
        meta["exit_code"] = int(exit_code.read_text().strip() or -1) if exit_code.exists() else None
        job_id, ended_by = dest / "logs" / "job_slurm_job_id", dest / "logs" / "job_scheduler_end"
        if job_id.exists():
            meta["slurm_job_id"] = job_id.read_text().strip()
        if ended_by.exists() and meta["exit_code"] is None:
            meta["scheduler_end"] = ended_by.read_text().strip()
    finally:
        sftp.close()
    return meta
