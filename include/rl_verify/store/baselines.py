"""Versioned baselines in the record store (issue 9, "Versioned use" and "Bad input").

Layout, under the record store root (``RL_VERIFY_RECORD_ROOT``: a local folder or ``s3://conn@bucket/prefix``)::

    <root>/baselines/<suite>/v<N>/version.json    provenance (VersionRecord), written last: a folder
                                                  without it is an incomplete write, never used
    <root>/baselines/<suite>/v<N>/<engine's file>  what the suite's engine judges against
                                                  (``Engine.baseline_file``): the opd engine's golden
                                                  table golden.json (the schema of its data file), the
                                                  grpo engine's baseline tracker baseline.jsonl
    <root>/baselines/<suite>/current.json         the current version: who promoted it, when, the
                                                  previous current, every promotion so far

Version 1 of a suite is what ships today (:func:`import_shipped`, from ``Engine.shipped``): e.g. the
packaged golden table with its recorded source, or a reference to the baseline tracker on the GPU
node's share (the spec's ``baseline``), which this store cannot copy. Versions are only ever added in a new folder
(:func:`add_version`) and never edited or deleted; going back is promoting an older version
(:func:`promote`). Every problem with a version (missing, unreadable, invalid) raises ``InputError``
naming the suite, the version, the file and the fix, and nothing is promoted. The engine validates
the files of a version (``Engine.check_version``).

The store is reached through ``rl_verify.store.record`` only (``store_root``, ``make_parent``), so a local
folder and an object store behave the same; Airflow is imported there, lazily. What the suite's
data is (golden table or baseline tracker) follows its spec's ``engine``, never its name.
"""

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
from rl_verify.core.names import short_sha
from rl_verify.core.provenance import Provenance
from rl_verify.core.thresholds import field_errors, parse_json
from rl_verify.engines import engine_of, known_suites, load_suite
from rl_verify.suites.spec import SuiteSpec
from rl_verify.store import record

AREA = "baselines"
VERSION_FILE = "version.json"
CURRENT_FILE = "current.json"
#: Who promotes version 1 when an import finds no current version (no person approved the runbook's
#: baselines through this tool; the import says so instead of naming someone).
IMPORT_PROMOTER = "import-shipped"

_VERSION_DIR = re.compile(r"^v([1-9][0-9]*)$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")

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
class _Loaded:
    record: VersionRecord
    #: The engine's data model the version holds (a golden table), None when it holds a tracker.
    model: Any
    #: Data file name -> its bytes as read and checked (version.json not included).
    data: dict[str, bytes]


# ----------------------------------------------------------------------------- places

def _spec(suite: str) -> SuiteSpec:
    known = known_suites()
    if suite not in known:
        raise InputError(f"unknown suite {suite!r}", None, None, f"give one of {', '.join(known)}")
    return load_suite(suite)


def _root(root: str | None) -> str:
    return root or settings.RECORD_ROOT


def suite_area(suite: str, root: str | None = None) -> Any:
    """``<root>/baselines/<suite>`` as an ``ObjectStoragePath``."""
    return record.store_root(root) / AREA / suite


def location(suite: str, version: int | None = None, name: str | None = None, root: str | None = None) -> str:
    """Where a person finds a suite's baselines, a version or one of its files: a folder path for a
    local root, the URL otherwise (like ``record.location``)."""
    base = _root(root)
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


def _version_numbers(suite: str, root: str | None) -> list[int]:
    """Every ``v<N>`` folder of the suite, complete or not, sorted."""
    area = suite_area(suite, root)
    if not area.exists():
        return []
    return sorted(int(m.group(1)) for item in area.iterdir() if (m := _VERSION_DIR.match(item.name)))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _put(path: Any, data: bytes, root: str | None) -> None:
    """Write ``data`` to a store path: atomically on a local folder, one PUT on an object store."""
    try:
        if path.protocol in ("file", "local"):
            write_atomic(Path(path.path), data)
        else:
            record.make_parent(path)
            path.write_bytes(data)
    except OSError as err:
        raise record.store_error(_root(root), err) from err


def _json_bytes(model: BaseModel) -> bytes:
    return (json.dumps(model.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode("utf-8")


def _fix_stored(suite: str) -> str:
    return (f"a stored version is never edited: promote another one (rl-verify baselines list --suite {suite} shows "
            "them) or add a corrected baseline as a new version")


# ----------------------------------------------------------------------------- validation

def _read(path: Any, where: str, what: str, fix: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise InputError(f"{what} is missing", where, None, fix) from exc
    except OSError as exc:
        raise InputError(f"{what} cannot be read ({type(exc).__name__}: {exc})", where, None, fix) from exc


def _load(spec: "SuiteSpec", version: int, root: str | None) -> _Loaded:
    """Read and validate one version completely (record, data files, their sha256)."""
    suite = spec.name
    label = f"baseline {suite} v{version}"
    folder = suite_area(suite, root) / f"v{version}"
    fix = _fix_stored(suite)
    if not folder.exists():
        known = ", ".join(f"v{n}" for n in _version_numbers(suite, root)) or "none"
        raise InputError(f"{label} does not exist (versions: {known})", location(suite, version, None, root), None,
                         f"give an existing version (rl-verify baselines list --suite {suite}); version 1 is made by "
                         "rl-verify baselines import-shipped")
    where = location(suite, version, VERSION_FILE, root)
    raw = _read(folder / VERSION_FILE, where, f"{label} {VERSION_FILE}",
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
        files[name] = _read(folder / name, at, f"{label} {name}", fix)
    data_model = engine_of(spec).check_version(spec, files, rec.baseline_ref,
                                               lambda n: location(suite, version, n, root), label, fix)
    for name, data_bytes in files.items():
        if _sha256(data_bytes) != rec.files[name]:
            raise InputError(f"{label} {name} changed since it was written (sha256 {_sha256(data_bytes)[:12]}, "
                             f"recorded {rec.files[name][:12]})", location(suite, version, name, root), None, fix)
    return _Loaded(rec, data_model, files)


# ----------------------------------------------------------------------------- reading

def list_versions(suite: str, root: str | None = None) -> list[VersionEntry]:
    """Every version folder of ``suite``, oldest first, each with its record or the problem that makes
    it unusable (a broken version is listed, not raised, so the others stay visible)."""
    spec = _spec(suite)
    try:
        pointer = current(suite, root)
    except InputError:
        pointer = None
    out = []
    for n in _version_numbers(suite, root):
        try:
            loaded = _load(spec, n, root)
            out.append(VersionEntry(n, loaded.record, None, pointer is not None and pointer.version == n))
        except InputError as exc:
            out.append(VersionEntry(n, None, str(exc), pointer is not None and pointer.version == n))
    return out


def show(suite: str, version: int | str, root: str | None = None) -> VersionRecord:
    """The record of one version, after validating it and its data files (InputError otherwise)."""
    return _load(_spec(suite), parse_version(version), root).record


def current(suite: str, root: str | None = None) -> CurrentPointer | None:
    """The suite's current version pointer; None when no version was ever promoted."""
    _spec(suite)
    path = suite_area(suite, root) / CURRENT_FILE
    where = location(suite, None, CURRENT_FILE, root)
    if not path.exists():
        return None
    fix = (f"promote the version to use again (rl-verify baselines promote --suite {suite} VERSION), which "
           "rewrites it")
    data = parse_json(_read(path, where, f"baseline {suite} {CURRENT_FILE}", fix), where,
                       f"baseline {suite} {CURRENT_FILE}", fix)
    try:
        pointer = CurrentPointer.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"baseline {suite} {CURRENT_FILE} does not fit CurrentPointer: {field_errors(exc)}", where,
                         None, fix) from exc
    if pointer.suite != suite:
        raise InputError(f"baseline {suite} {CURRENT_FILE} names suite {pointer.suite!r}", where, None, fix)
    return pointer


def resolve(suite: str, version: int | str | None = None, root: str | None = None) -> VersionRecord:
    """The validated record of ``version``, or of the current version when None (InputError when the
    suite has none: run ``rl-verify baselines import-shipped``)."""
    spec = _spec(suite)
    return _resolve(spec, version, root).record


def _resolve(spec: "SuiteSpec", version: int | str | None, root: str | None) -> _Loaded:
    if version is None:
        pointer = current(spec.name, root)
        if pointer is None:
            raise InputError(f"suite {spec.name} has no current baseline version",
                             location(spec.name, None, CURRENT_FILE, root), None,
                             "run rl-verify baselines import-shipped (version 1 = the shipped baseline), or promote "
                             "a version")
        return _load(spec, pointer.version, root)
    return _load(spec, parse_version(version), root)


def load_version_data(suite: str, version: int | str | None = None, root: str | None = None) -> Any:
    """The data model (e.g. the golden table) a version holds in place of the spec's data file, of
    ``version`` or of the current version when None; InputError when the suite's engine judges against
    a baseline tracker instead."""
    spec = _spec(suite)
    engine = engine_of(spec)
    if not engine.baseline_is_data:
        raise InputError(f"suite {suite} (engine {spec.engine}) keeps no data file in its baseline versions, but a "
                         f"baseline tracker ({engine.baseline_file})", None, None,
                         "read the tracker with read_data, or load the data of a suite whose engine judges against "
                         "a golden table")
    return _resolve(spec, version, root).model


def read_data(suite: str, version: int | str, name: str, root: str | None = None) -> bytes:
    """The bytes of one data file of a validated version (e.g. baseline.jsonl to hand to the checker)."""
    spec = _spec(suite)
    loaded = _load(spec, parse_version(version), root)
    if name not in loaded.record.files:
        raise InputError(f"baseline {suite} v{loaded.record.version} has no file {name}",
                         location(suite, loaded.record.version, name, root), None,
                         f"its files are: {', '.join(sorted(loaded.record.files)) or 'none'}")
    return (suite_area(suite, root) / f"v{loaded.record.version}" / name).read_bytes()


# ----------------------------------------------------------------------------- writing

def _as_bytes(name: str, value: bytes | str | Path) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, Path):
        try:
            return value.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read the file given as {name} ({exc.strerror or exc})", value, None,
                             "give a readable file") from exc
    return value.encode("utf-8")


def _write_version(spec: "SuiteSpec", number: int | None, provenance: Provenance, files: Mapping[str, bytes],
                   root: str | None) -> VersionRecord | None:
    """Write a new version folder: ``number`` exactly (None when that folder exists), or the next free
    number. Data files first, ``version.json`` last. Never writes into an existing folder."""
    suite = spec.name
    area = suite_area(suite, root)
    for _ in range(20):
        n = number if number is not None else max(_version_numbers(suite, root), default=0) + 1
        folder = area / f"v{n}"
        if folder.protocol in ("file", "local"):
            try:  # the claim: creating the folder is atomic on a local file system
                folder.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                if number is not None:
                    return None
                continue
            except OSError as err:
                raise record.store_error(_root(root), err) from err
        elif folder.exists():  # an object store has no atomic create: a concurrent writer is not excluded
            if number is not None:
                return None
            continue
        rec = VersionRecord(**provenance.model_dump(), suite=suite, version=n,
                            created_at=datetime.now(timezone.utc),
                            files={name: _sha256(data) for name, data in files.items()})
        for name, data in sorted(files.items()):
            _put(folder / name, data, root)
        _put(folder / VERSION_FILE, _json_bytes(rec), root)
        return rec
    raise OSError(f"could not claim a new version folder under {location(suite, None, None, root)} after 20 tries")


def add_version(suite: str, provenance: Provenance, files: Mapping[str, bytes | str | Path],
                root: str | None = None) -> int:
    """Write a new version of ``suite`` (the next number, in a new folder) and return its number.

    ``files``: data file name -> content (bytes, text, or a local file): ``golden.json`` for a suite of
    the opd engine, ``baseline.jsonl`` (or ``provenance.baseline_ref``) for grpo, any other plain file
    name as an attachment. Everything is validated before anything is written. The first version of a
    suite is always the shipped one: when none exists yet it is imported first. The new version is not
    made current: that is :func:`promote`.
    """
    spec = _spec(suite)
    label = f"new baseline {suite} version"
    fix = "correct the input and add it again; nothing was written"
    if provenance.source == "shipped":
        raise InputError(f"{label}: the shipped baseline is version 1 and only import_shipped writes it", None, None,
                         "give source 'calibration', or run rl-verify baselines import-shipped")
    data: dict[str, bytes] = {}
    given = {name: str(value) if isinstance(value, Path) else f"{name} (given to add_version)"
             for name, value in files.items()}
    for name, value in files.items():
        if not _FILE_NAME.match(name) or name in (VERSION_FILE, CURRENT_FILE):
            raise InputError(f"{label}: {name!r} cannot be a data file name", None, None,
                             f"use a plain file name (letters, digits, . _ -), not {VERSION_FILE} or {CURRENT_FILE}")
        data[name] = _as_bytes(name, value)
    engine_of(spec).check_version(spec, data, provenance.baseline_ref, lambda n: given.get(n, f"{n} (not given)"),
                                  label, fix)
    if not _version_numbers(suite, root):
        import_shipped(suite, root)
    rec = _write_version(spec, None, provenance, data, root)
    assert rec is not None
    return rec.version


def promote(suite: str, version: int | str, by: str, root: str | None = None) -> CurrentPointer:
    """Make an existing, valid ``version`` the current one (going back = promoting an older one).

    The version is validated completely first; a missing or broken one raises InputError and the
    current version stays as it was. Promoting the current version again changes nothing.
    """
    spec = _spec(suite)
    n = parse_version(version)
    if not by or not by.strip():
        raise InputError(f"promotion of baseline {suite} v{n} names nobody", None, None, "give --by NAME")
    _load(spec, n, root)
    note = ""
    try:
        before = current(suite, root)
    except InputError as exc:  # promoting is the fix for an unreadable pointer: say what was replaced
        before, note = None, f"replaced an unreadable {CURRENT_FILE} (its promotion history is lost): {exc}"
    if before is not None and before.version == n:
        return before
    now = datetime.now(timezone.utc)
    promotion = Promotion(version=n, promoted_by=by.strip(), promoted_at=now,
                          previous=before.version if before else None)
    pointer = CurrentPointer(suite=suite, version=n, promoted_by=promotion.promoted_by, promoted_at=now,
                             previous=promotion.previous,
                             history=(before.history if before else ()) + (promotion,), note=note)
    _put(suite_area(suite, root) / CURRENT_FILE, _json_bytes(pointer), root)
    return pointer


def _written(spec: "SuiteSpec", version: int, root: str | None, wait_s: float | None = None) -> VersionRecord:
    """Version ``version`` once its writer is done. Runs that start together on a fresh store (a bisection's
    probes) import version 1 together: one claims the folder and writes it, ``version.json`` last; the others
    wait up to ``wait_s`` (``settings.BASELINE_WRITE_WAIT_S``) for it before calling the folder an interrupted
    write."""
    deadline = time.monotonic() + (settings.BASELINE_WRITE_WAIT_S if wait_s is None else wait_s)
    folder = suite_area(spec.name, root) / f"v{version}"
    while not (folder / VERSION_FILE).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return _load(spec, version, root).record


def import_shipped(suite: str, root: str | None = None) -> Imported:
    """Version 1 of ``suite`` from what ships today; idempotent (an existing v1 is returned, never
    rewritten). Makes it current when the suite has no current version."""
    spec = _spec(suite)
    created = False
    if 1 in _version_numbers(suite, root):
        rec = _written(spec, 1, root)
    else:
        provenance, files = engine_of(spec).shipped(spec)
        written = _write_version(spec, 1, provenance, files, root)
        created = written is not None
        rec = written if written is not None else _written(spec, 1, root)  # another import won the race
    if rec.source != "shipped":
        raise InputError(f"baseline {suite} v1 is a {rec.source} baseline, not the shipped one",
                         location(suite, 1, VERSION_FILE, root), None,
                         "version 1 is reserved for the shipped baseline; keep this store's v1 as it is and add the "
                         "shipped data as a new version by hand if it is needed")
    made_current = False
    if not created:  # the run that wrote v1 makes it current right after: wait for that, not promote it twice
        deadline = time.monotonic() + settings.BASELINE_WRITE_WAIT_S
        while current(suite, root) is None and time.monotonic() < deadline:
            time.sleep(0.2)
    if current(suite, root) is None:
        promote(suite, 1, IMPORT_PROMOTER, root)
        made_current = True
    return Imported(rec, created, made_current)


# ----------------------------------------------------------------------------- use by a verification run

#: Where a run's record keeps the files of the baseline version each suite was judged against.
RECORD_FOLDER = "baseline-version"


def parse_pins(value: Any, suites: list[str]) -> dict[str, int]:
    """The param ``baseline_versions`` (``""`` or ``"opd=2,grpo=1"``) as suite -> version.

    Every problem (syntax, a suite not selected for the run, a suite named twice) is listed in one
    ValueError naming the param and the fix.
    """
    fix = ("give suite=VERSION pairs separated by commas, e.g. opd=2 (rl-verify baselines list shows the "
           "versions), or leave it empty to use each suite's current version")
    text = "" if value is None else value
    if not isinstance(text, str) or not re.fullmatch(settings.BASELINE_PIN_PATTERN, text):
        raise ValueError(f"param 'baseline_versions': {value!r} is not suite=VERSION pairs: {fix}")
    pins: dict[str, int] = {}
    problems = []
    for pair in filter(None, text.split(",")):
        suite, version = pair.split("=")
        if suite in pins:
            problems.append(f"suite {suite!r} is named twice")
        elif suite not in suites:
            problems.append(f"suite {suite!r} is not selected for this run (suites: {', '.join(suites)})")
        pins[suite] = parse_version(version)
    if problems:
        raise ValueError(f"param 'baseline_versions': {'; '.join(problems)}: {fix}")
    return pins


def describe(rec: VersionRecord) -> str:
    """One line a person reads on a card or a report: the version and where it comes from."""
    if rec.source == "shipped":
        what = f"shipped ({rec.note.split(';')[0]})" if rec.note else "shipped"
        if rec.commit or rec.runs:
            what += f", {rec.runs}-run mean" + (f" of commit {short_sha(rec.commit)}" if rec.commit else "")
    else:
        what = f"calibration of commit {short_sha(rec.commit) or '?'}, N={rec.runs}"
        if rec.approved_by:
            when = f" on {rec.approved_at:%Y-%m-%d}" if rec.approved_at else ""
            what += f", approved by {rec.approved_by}{when}"
    return f"v{rec.version}: {what}"


def in_use(suites: list[str], pins: Mapping[str, int], root: str | None = None) -> dict[str, dict[str, Any]]:
    """The baseline version each suite of a run is judged against: its pinned version, else its
    current one. A suite with no version yet gets version 1 imported (what ships today).

    Returns suite -> ``{"version", "current", "label", "files"}``. Every suite's problem (a missing
    or broken version) is listed in one InputError; nothing is chosen then.
    """
    out: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for suite in suites:
        try:
            numbers = _version_numbers(suite, root)
            # No version yet, or only a v1 with no current pointer: another run may be importing it right now.
            if not numbers or (numbers == [1] and current(suite, root) is None):
                import_shipped(suite, root)
            pointer = current(suite, root)
            rec = resolve(suite, pins.get(suite), root)
        except InputError as err:
            problems.append(str(err))
            continue
        out[suite] = {"version": rec.version, "current": pointer is not None and pointer.version == rec.version,
                      "label": describe(rec), "files": sorted(rec.files)}
    if problems:
        raise InputError(f"{len(problems)} baseline version problem(s); nothing was launched:\n"
                         + "\n".join(f"  - {p}" for p in problems), None, None,
                         "fix the param 'baseline_versions', or promote a valid version "
                         "(rl-verify baselines list | promote)")
    return out


def version_files(suite: str, version: int | str, root: str | None = None) -> dict[str, bytes]:
    """The data files of a validated version: name -> bytes (checked against their sha256)."""
    loaded = _load(_spec(suite), parse_version(version), root)
    return {**loaded.data, VERSION_FILE: _json_bytes(loaded.record)}
