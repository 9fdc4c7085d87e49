"""The record store: one folder per DAG run holding the card, trackers, logs, reports, manifest.

Work happens in a local folder (``RL_VERIFY_RECORD_ROOT`` when it is a path). When the root is an
object storage URL (``s3://...``, ``file://...``), the local copy is staged under the project's
``records/`` and published to the root through Airflow's ``ObjectStoragePath`` by the report task.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rl_verify import settings
from rl_verify.remote import run_key


def is_url(root: str) -> bool:
    return "://" in root


def local_root(root: str = settings.RECORD_ROOT) -> Path:
    """Local folder where records are written (the staging folder for an object-store root)."""
    return settings.PROJECT_ROOT / "records" if is_url(root) else Path(root).expanduser()


def run_record_dir(dag_run_id: str, root: str = settings.RECORD_ROOT) -> Path:
    """The record folder of one DAG run (deterministic: retries and reruns write the same place)."""
    return local_root(root) / settings.DAG_ID / run_key(dag_run_id)


RECORD_FILE_MODE = 0o644


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            # mkstemp makes 0600; a record is read by the UI plugin and the team, like any file written.
            os.fchmod(fh.fileno(), RECORD_FILE_MODE)
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def ensure_writable(folder: Path) -> Path:
    """Create ``folder`` and prove a file can be written there; OSError names the folder otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / ".write-probe", b"")
        (folder / ".write-probe").unlink()
    except OSError as err:
        raise OSError(f"record store folder {folder} cannot be written ({err.strerror or err}): "
                      f"fix RL_VERIFY_RECORD_ROOT or its permissions") from err
    return folder


def write_json(path: Path, value: Any) -> Path:
    return write_atomic(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(record_dir: Path) -> Path:
    """List every archived file of the record with its size and sha256 in ``manifest.json``."""
    files = []
    for path in sorted(p for p in record_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(record_dir).as_posix()
        if rel == "manifest.json" or path.name.startswith("."):
            continue
        files.append({"path": rel, "bytes": path.stat().st_size, "sha256": sha256(path)})
    return write_json(record_dir / "manifest.json", {"record": str(record_dir), "files": files})


def publish(record_dir: Path, root: str = settings.RECORD_ROOT) -> str:
    """Copy the record to an object-store root (no-op for a local root); return where it lives."""
    if not is_url(root):
        return str(record_dir)
    from airflow.sdk import ObjectStoragePath

    target = ObjectStoragePath(root) / settings.DAG_ID / record_dir.name
    for path in sorted(p for p in record_dir.rglob("*") if p.is_file()):
        dest = target / path.relative_to(record_dir).as_posix()
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())
    return str(target)
