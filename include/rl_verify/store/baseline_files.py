"""One baseline version on the record store, as files: its models (``version.json``, ``current.json``), where
they live, and how one version folder is read and validated completely or written whole (data files first,
``version.json`` last). ``rl_verify.store.baselines`` builds the versions' life cycle on this."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_verify import settings
from rl_verify.core.errors import InputError
from rl_verify.core.files import write_atomic
from rl_verify.core.provenance import Provenance
from rl_verify.core.thresholds import field_errors, parse_json
from rl_verify.engines import engine_of
from rl_verify.suites.spec import SuiteSpec
from rl_verify.store import record


AREA = "baselines"


VERSION_FILE = "version.json"


CURRENT_FILE = "current.json"


_VERSION_DIR = re.compile(r"^v([1-9][0-9]*)$")


FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VersionRecord(Provenance):
    """``version.json``: the provenance plus the version's identity and its data files' sha256."""

    suite: str
    version: int = Field(ge=1)
    created_at: datetime
    #: Data file name -> sha256 of its bytes as written (a later change is refused as corruption).
    files: dict[str, str] = {}


class Promotion(_Model):
    version: int = Field(ge=1)
    promoted_by: str = Field(min_length=1)
    promoted_at: datetime
    previous: int | None = None


class CurrentPointer(_Model):
    """``current.json``: the version in use, the promotion that made it current, and all promotions."""

    suite: str
    version: int = Field(ge=1)
    promoted_by: str = Field(min_length=1)
    promoted_at: datetime
    previous: int | None = None
    #: Every promotion of the suite, oldest first; the last one is this one.
    history: tuple[Promotion, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class VersionEntry:
    """One version folder as :func:`list_versions` finds it: its record, or why it cannot be used."""

    version: int
    record: VersionRecord | None
    problem: str | None
    current: bool


@dataclass(frozen=True)
class Imported:
    """What :func:`import_shipped` did for one suite."""

    record: VersionRecord
    created: bool
    made_current: bool


@dataclass(frozen=True)
class Loaded:
    record: VersionRecord
    #: The engine's data model the version holds (a golden table), None when it holds a tracker.
    model: Any
    #: Data file name -> its bytes as read and checked (version.json not included).
    data: dict[str, bytes]


def store_root_of(root: str | None) -> str:
    return root or settings.RECORD_ROOT


def suite_area(suite: str, root: str | None = None) -> Any:
    """``<root>/baselines/<suite>`` as an ``ObjectStoragePath``."""
    return record.store_root(root) / AREA / suite


def location(suite: str, version: int | None = None, name: str | None = None, root: str | None = None) -> str:
    """Where a person finds a suite's baselines, a version or one of its files: a folder path for a
    local root, the URL otherwise (like ``record.location``)."""
    base = store_root_of(root)
    base = base.rstrip("/") if record.is_url(base) else str(Path(base).expanduser().resolve())
    parts = [base, AREA, suite] + ([f"v{version}"] if version is not None else []) + ([name] if name else [])
    return "/".join(parts)


def parse_version(text: str | int) -> int:
    """``3``, ``"3"`` or ``"v3"`` -> 3; anything else raises InputError."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 1:
        return text
    match = re.fullmatch(r"[vV]?([1-9][0-9]*)", str(text).strip())
    if not match:
        raise InputError(f"{text!r} is not a baseline version", None, None,
                         "give a version number such as 2 or v2 (rl-verify baselines list shows them)")
    return int(match.group(1))


def version_numbers(suite: str, root: str | None) -> list[int]:
    """Every ``v<N>`` folder of the suite, complete or not, sorted."""
    area = suite_area(suite, root)
    if not area.exists():
        return []
    return sorted(int(m.group(1)) for item in area.iterdir() if (m := _VERSION_DIR.match(item.name)))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(path: Any, data: bytes, root: str | None) -> None:
    """Write ``data`` to a store path: atomically on a local folder, one PUT on an object store."""
    try:
        if path.protocol in ("file", "local"):
            write_atomic(Path(path.path), data)
        else:
            record.make_parent(path)
            path.write_bytes(data)
    except OSError as err:
        raise record.store_error(store_root_of(root), err) from err


def json_bytes(model: BaseModel) -> bytes:
    return (json.dumps(model.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode("utf-8")


def fix_stored(suite: str) -> str:
    return (f"a stored version is never edited: promote another one (rl-verify baselines list --suite {suite} shows "
            "them) or add a corrected baseline as a new version")


def read_bytes(path: Any, where: str, what: str, fix: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise InputError(f"{what} is missing", where, None, fix) from exc
    except OSError as exc:
        raise InputError(f"{what} cannot be read ({type(exc).__name__}: {exc})", where, None, fix) from exc


def load(spec: "SuiteSpec", version: int, root: str | None) -> Loaded:
    """Read and validate one version completely (record, data files, their sha256)."""
    suite = spec.name
    label = f"baseline {suite} v{version}"
    folder = suite_area(suite, root) / f"v{version}"
    fix = fix_stored(suite)
    if not folder.exists():
        known = ", ".join(f"v{n}" for n in version_numbers(suite, root)) or "none"
        raise InputError(f"{label} does not exist (versions: {known})", location(suite, version, None, root), None,
                         f"give an existing version (rl-verify baselines list --suite {suite}); version 1 is made by "
                         "rl-verify baselines import-shipped")
    where = location(suite, version, VERSION_FILE, root)
    raw = read_bytes(folder / VERSION_FILE, where, f"{label} {VERSION_FILE}",
                f"the folder is an interrupted write, not a version ({VERSION_FILE} is written last): remove "
                f"{location(suite, version, None, root)} and write the version again")
    data = parse_json(raw, where, f"{label} {VERSION_FILE}", fix)
    try:
        rec = VersionRecord.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{label} {VERSION_FILE} does not fit VersionRecord: {field_errors(exc)}", where, None,
                         fix) from exc
    if rec.suite != suite or rec.version != version:
        raise InputError(f"{label} {VERSION_FILE} says it is {rec.suite} v{rec.version}", where, None, fix)
    files: dict[str, bytes] = {}
    for name in sorted(rec.files):
        at = location(suite, version, name, root)
        files[name] = read_bytes(folder / name, at, f"{label} {name}", fix)
    data_model = engine_of(spec).check_version(spec, files, rec.baseline_ref,
                                               lambda n: location(suite, version, n, root), label, fix)
    for name, data_bytes in files.items():
        if sha256(data_bytes) != rec.files[name]:
            raise InputError(f"{label} {name} changed since it was written (sha256 {sha256(data_bytes)[:12]}, "
                             f"recorded {rec.files[name][:12]})", location(suite, version, name, root), None, fix)
    return Loaded(rec, data_model, files)


def as_bytes(name: str, value: bytes | str | Path) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, Path):
        try:
            return value.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read the file given as {name} ({exc.strerror or exc})", value, None,
                             "give a readable file") from exc
    return value.encode("utf-8")


def write_version(spec: "SuiteSpec", number: int | None, provenance: Provenance, files: Mapping[str, bytes],
                   root: str | None) -> VersionRecord | None:
    """Write a new version folder: ``number`` exactly (None when that folder exists), or the next free
    number. Data files first, ``version.json`` last. Never writes into an existing folder."""
    suite = spec.name
    area = suite_area(suite, root)
    for _ in range(20):
        n = number if number is not None else max(version_numbers(suite, root), default=0) + 1
        folder = area / f"v{n}"
        if folder.protocol in ("file", "local"):
            try:  # the claim: creating the folder is atomic on a local file system
                folder.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                if number is not None:
                    return None
                continue
            except OSError as err:
                raise record.store_error(store_root_of(root), err) from err
        elif folder.exists():  # an object store has no atomic create: a concurrent writer is not excluded
            if number is not None:
                return None
            continue
        rec = VersionRecord(**provenance.model_dump(), suite=suite, version=n,
                            created_at=datetime.now(timezone.utc),
                            files={name: sha256(data) for name, data in files.items()})
        for name, data in sorted(files.items()):
            put(folder / name, data, root)
        put(folder / VERSION_FILE, json_bytes(rec), root)
        return rec
    raise OSError(f"could not claim a new version folder under {location(suite, None, None, root)} after 20 tries")


def wait_written(spec: "SuiteSpec", version: int, root: str | None, wait_s: float | None = None) -> VersionRecord:
    """Version ``version`` once its writer is done. Runs that start together on a fresh store (a bisection's
    probes) import version 1 together: one claims the folder and writes it, ``version.json`` last; the others
    wait up to ``wait_s`` (``settings.BASELINE_WRITE_WAIT_S``) for it before calling the folder an interrupted
    write."""
    deadline = time.monotonic() + (settings.BASELINE_WRITE_WAIT_S if wait_s is None else wait_s)
    folder = suite_area(spec.name, root) / f"v{version}"
    while not (folder / VERSION_FILE).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return load(spec, version, root).record
