"""The record store: one folder per DAG run holding the card, trackers, logs, reports, manifest.

The root (``RL_VERIFY_RECORD_ROOT``) is an object storage URL (``s3://<conn_id>@bucket/prefix``) or a
local folder (the embedded default), both reached through Airflow's ``ObjectStoragePath``. A task
never relies on another task's local disk: it works in a ``workspace`` pulled from the store and
pushes what it produced back before it ends.
"""

from __future__ import annotations

import hashlib
import logging
import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rl_verify import settings
from rl_verify.core.files import read_json, write_atomic, write_json  # noqa: F401 (the record's file API)
from rl_verify.core.names import run_key

log = logging.getLogger(__name__)


def is_url(root: str) -> bool:
    return "://" in root


def store_root(root: str | None = None) -> Any:
    """The record store root as an ``ObjectStoragePath`` (a plain folder becomes ``file://``)."""
    from airflow.sdk import ObjectStoragePath

    root = root or settings.RECORD_ROOT
    return ObjectStoragePath(root if is_url(root) else Path(root).expanduser().resolve().as_uri())


def record_dag(dag_id: str | None) -> str:
    """The DAG whose folder holds the records of runs of ``dag_id``: the one place that decides it.

    A bisection's probe (``settings.PROBE_DAG_ID``) is a verification run under a DAG of its own: its record
    lives with the verification's, keyed by its run key. Every other DAG keeps its own folder; None is the
    verification's. Callers pass the run's own DAG id (``context["dag_run"].dag_id`` is right for any run).
    """
    if dag_id is None or dag_id == settings.PROBE_DAG_ID:
        return settings.DAG_ID
    return dag_id


def dag_store(dag_id: str | None, root: str | None = None) -> Any:
    """The folder of the record store holding every record of runs of ``dag_id`` (``record_dag``)."""
    return store_root(root) / record_dag(dag_id)


def run_store(dag_run_id: str, root: str | None = None, dag_id: str | None = None) -> Any:
    """The record of one DAG run in the store, ``<record_dag(dag_id)>/<run key>`` (default: the verification
    DAG's); deterministic: retries and reruns write the same place."""
    return dag_store(dag_id, root) / run_key(dag_run_id)


def location(dag_run_id: str, root: str | None = None, dag_id: str | None = None) -> str:
    """Where a person finds the run's record: a folder path for a local root, the URL otherwise."""
    root = root or settings.RECORD_ROOT
    base = root.rstrip("/") if is_url(root) else str(Path(root).expanduser().resolve())
    return f"{base}/{record_dag(dag_id)}/{run_key(dag_run_id)}"


def staging_root() -> Path:
    """This worker's folder for task workspaces (``RL_VERIFY_STAGING_DIR``); nothing in it outlives a task
    unless ``RL_VERIFY_KEEP_STAGING`` is set."""
    folder = Path(settings.STAGING_DIR).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def workspace(dag_run_id: str, parts: Iterable[str] | None = None, root: str | None = None,
              dag_id: str | None = None) -> Iterator[Path]:
    """The run's record as a private local folder for one task: pulled from the store (only ``parts``,
    paths relative to the record, when given), pushed back when the block ends, also on failure (what
    a failing task produced is kept), then removed.

    No task reads another task's local disk: on a distributed deployment the next task may run on
    another worker. The folder ends in ``<record_dag(dag_id)>/<run key>`` like the record (see ``relocate``).
    """
    store = run_store(dag_run_id, root, dag_id)
    base = Path(tempfile.mkdtemp(prefix="task-", dir=staging_root()))
    local = base / record_dag(dag_id) / run_key(dag_run_id)
    local.mkdir(parents=True)
    try:
        pull(store, local, parts)
        before = snapshot(local)
        try:
            yield local
        finally:
            try:
                push(local, store, before)
            except Exception as err:
                raise store_error(root or settings.RECORD_ROOT, err) from err
    finally:
        if not settings.KEEP_STAGING:
            shutil.rmtree(base, ignore_errors=True)


def make_parent(path: Any) -> None:
    """Create the folder ``path`` goes in on a local store. An object store has no folders, and its
    ``mkdir`` would create a missing bucket (s3fs, with credentials allowed to) instead of failing."""
    if path.protocol in ("file", "local"):
        path.parent.mkdir(parents=True, exist_ok=True)


def _store_files(store: Any) -> list[tuple[str, Any]]:
    """(path relative to ``store``, file) of every file under ``store``; [] when there is none yet."""
    if not store.exists():
        return []
    prefix = str(store.path).rstrip("/") + "/"
    out = []
    for item in store.rglob("*"):
        if item.is_file():
            out.append((str(item.path)[len(prefix):], item))
    return sorted(out, key=lambda f: f[0])


def pull(store: Any, local: Path, parts: Iterable[str] | None = None) -> int:
    """Copy the record's files (those under ``parts`` when given) into ``local``; return how many."""
    wanted = [p.strip("/") for p in parts] if parts is not None else None
    count = 0
    for rel, item in _store_files(store):
        if wanted is not None and not any(rel == w or rel.startswith(w + "/") for w in wanted):
            continue
        write_atomic(local / rel, item.read_bytes())
        count += 1
    return count


def snapshot(local: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under ``local`` by relative path: what ``push`` compares against."""
    out = {}
    for path in local.rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            st = path.stat()
            out[path.relative_to(local).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def push(local: Path, store: Any, before: dict[str, tuple[int, int]]) -> list[str]:
    """Write the files created or changed since ``before`` to the store, delete the ones removed;
    return the relative paths written."""
    after = snapshot(local)
    written = []
    for rel, stamp in sorted(after.items()):
        if before.get(rel) == stamp:
            continue
        dest = store / rel
        make_parent(dest)
        dest.write_bytes((local / rel).read_bytes())
        written.append(rel)
    for rel in sorted(set(before) - set(after)):
        (store / rel).unlink(missing_ok=True)
    return written


def relocate(value: Any, run_dir: Path) -> Any:
    """``value`` (JSON-like) with every path into some copy of this run's record (another task's
    workspace, on any worker) rewritten into ``run_dir``; other strings unchanged."""
    marker = f"/{run_dir.parent.name}/{run_dir.name}/"
    if isinstance(value, str):
        at = value.find(marker)
        return str(run_dir) + "/" + value[at + len(marker):] if value.startswith("/") and at >= 0 else value
    if isinstance(value, dict):
        return {k: relocate(v, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [relocate(v, run_dir) for v in value]
    return value


def put_json(dag_run_id: str, rel: str, value: Any, root: str | None = None, dag_id: str | None = None) -> str:
    """Write one small JSON file of the record straight to the store (no workspace); return its location."""
    dest = run_store(dag_run_id, root, dag_id) / rel
    make_parent(dest)
    dest.write_bytes((json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8"))
    return f"{location(dag_run_id, root, dag_id)}/{rel}"


def get_json(dag_run_id: str, rel: str, root: str | None = None, dag_id: str | None = None) -> Any | None:
    """One JSON file of the record read straight from the store; None when it does not exist."""
    source = run_store(dag_run_id, root, dag_id) / rel
    return json.loads(source.read_bytes()) if source.exists() else None


def cached_json(kind: str, key: Any, compute: Callable[[], Any], root: str | None = None) -> Any:
    """``compute()``'s JSON result, kept in the store under ``cache/<kind>/<sha256 of key>.json`` and reused
    by every later run whose ``key`` (any JSON value naming every input, code version included) is equal.
    A cache entry that cannot be read or written only costs the computation again."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    entry = store_root(root) / "cache" / kind / f"{digest}.json"
    try:
        if entry.exists():
            return json.loads(entry.read_bytes())["value"]
    except Exception:  # unreadable or half-written by a crashed writer: computed again, rewritten below
        pass
    value = compute()
    try:
        make_parent(entry)
        entry.write_bytes((json.dumps({"key": key, "value": value}, sort_keys=True, default=str) + "\n")
                          .encode("utf-8"))
    except Exception as err:  # the result stands; the next run computes it again
        log.warning("Could not keep %s in the record store's cache (%s: %s)", kind, type(err).__name__, err)
    return value


def ensure_store_writable(dag_run_id: str, root: str | None = None, dag_id: str | None = None) -> str:
    """Prove the run's record can be written to the store (probe object written and removed); return
    its location. Raises OSError naming RL_VERIFY_RECORD_ROOT and what to fix otherwise."""
    root = root or settings.RECORD_ROOT
    try:
        probe = run_store(dag_run_id, root, dag_id) / ".write-probe"
        make_parent(probe)
        probe.write_bytes(b"")
        probe.unlink()
    except Exception as err:  # credentials, endpoint, bucket, permissions: every cause is the same setting
        raise store_error(root, err) from err
    return location(dag_run_id, root, dag_id)


def store_error(root: str, err: BaseException) -> OSError:
    """The error a task raises when the record store cannot be written: names the setting and the fix."""
    if is_url(root):
        netloc = root.split("://", 1)[1].split("/", 1)[0]
        conn = netloc.split("@", 1)[0] if "@" in netloc else None
        fix = (f"check the Airflow connection {conn!r} (credentials and endpoint), that the bucket exists and "
               "that those credentials may write to it" if conn else
               "name an Airflow connection in the URL (s3://<conn_id>@<bucket>/<prefix>) whose credentials may "
               "write to the bucket")
    else:
        fix = "give a folder the Airflow workers may write, or fix its permissions"
    return OSError(f"record store RL_VERIFY_RECORD_ROOT={root} cannot be written ({type(err).__name__}: {err}): {fix}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(record_dir: Path, shown_as: str | None = None) -> Path:
    """List every archived file of the record with its size and sha256 in ``manifest.json``
    (``shown_as``: the record's location, when ``record_dir`` is a working copy of it)."""
    files = []
    for path in sorted(p for p in record_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(record_dir).as_posix()
        if rel == "manifest.json" or path.name.startswith("."):
            continue
        files.append({"path": rel, "bytes": path.stat().st_size, "sha256": sha256(path)})
    return write_json(record_dir / "manifest.json", {"record": shown_as or str(record_dir), "files": files})
