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

import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from rl_verify import settings
from rl_verify.core.errors import InputError
from rl_verify.core.names import short_sha
from rl_verify.core.provenance import Provenance
from rl_verify.core.thresholds import field_errors, parse_json
from rl_verify.engines import engine_of, known_suites, load_suite
from rl_verify.suites.spec import SuiteSpec
from rl_verify.store.baseline_files import (AREA, CURRENT_FILE, FILE_NAME, VERSION_FILE, CurrentPointer, Imported,
                                            Loaded, Promotion, VersionEntry, VersionRecord, as_bytes,
                                            json_bytes, load, location, parse_version, put, read_bytes, suite_area,
                                            version_numbers, wait_written, write_version)

__all__ = ["AREA", "CURRENT_FILE", "IMPORT_PROMOTER", "RECORD_FOLDER", "VERSION_FILE", "CurrentPointer", "Imported",
           "Promotion", "Provenance", "VersionEntry", "VersionRecord", "add_version", "current", "describe",
           "import_shipped", "in_use", "list_versions", "load_version_data", "location", "parse_pins", "parse_version",
           "promote", "read_data", "resolve", "suite_area", "version_files"]


#: Who promotes version 1 when an import finds no current version (no person approved the runbook's
#: baselines through this tool; the import says so instead of naming someone).
IMPORT_PROMOTER = "import-shipped"


#: A suite by name, or its spec already loaded by the caller (a task loads each suite once and passes it on).
Suite = str | SuiteSpec


def _spec(suite: Suite) -> SuiteSpec:
    """The spec of ``suite``: itself when given as a spec, else loaded (InputError naming the known suites)."""
    if isinstance(suite, SuiteSpec):
        return suite
    known = known_suites()
    if suite not in known:
        raise InputError(f"unknown suite {suite!r}", None, None, f"give one of {', '.join(known)}")
    return load_suite(suite)


def list_versions(suite: Suite, root: str | None = None) -> list[VersionEntry]:
    """Every version folder of ``suite``, oldest first, each with its record or the problem that makes
    it unusable (a broken version is listed, not raised, so the others stay visible)."""
    spec = _spec(suite)
    suite = spec.name
    try:
        pointer = current(spec, root)
    except InputError:
        pointer = None
    out = []
    for n in version_numbers(suite, root):
        try:
            loaded = load(spec, n, root)
            out.append(VersionEntry(n, loaded.record, None, pointer is not None and pointer.version == n))
        except InputError as exc:
            out.append(VersionEntry(n, None, str(exc), pointer is not None and pointer.version == n))
    return out


def show(suite: Suite, version: int | str, root: str | None = None) -> VersionRecord:
    """The record of one version, after validating it and its data files (InputError otherwise)."""
    return load(_spec(suite), parse_version(version), root).record


def current(suite: Suite, root: str | None = None) -> CurrentPointer | None:
    """The suite's current version pointer; None when no version was ever promoted."""
    suite = _spec(suite).name
    path = suite_area(suite, root) / CURRENT_FILE
    where = location(suite, None, CURRENT_FILE, root)
    if not path.exists():
        return None
    fix = (f"promote the version to use again (rl-verify baselines promote --suite {suite} VERSION), which "
           "rewrites it")
    data = parse_json(read_bytes(path, where, f"baseline {suite} {CURRENT_FILE}", fix), where,
                       f"baseline {suite} {CURRENT_FILE}", fix)
    try:
        pointer = CurrentPointer.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"baseline {suite} {CURRENT_FILE} does not fit CurrentPointer: {field_errors(exc)}", where,
                         None, fix) from exc
    if pointer.suite != suite:
        raise InputError(f"baseline {suite} {CURRENT_FILE} names suite {pointer.suite!r}", where, None, fix)
    return pointer


def resolve(suite: Suite, version: int | str | None = None, root: str | None = None) -> VersionRecord:
    """The validated record of ``version``, or of the current version when None (InputError when the
    suite has none: run ``rl-verify baselines import-shipped``)."""
    spec = _spec(suite)
    suite = spec.name
    return _resolve(spec, version, root).record


def _resolve(spec: "SuiteSpec", version: int | str | None, root: str | None) -> Loaded:
    if version is None:
        pointer = current(spec, root)
        if pointer is None:
            raise InputError(f"suite {spec.name} has no current baseline version",
                             location(spec.name, None, CURRENT_FILE, root), None,
                             "run rl-verify baselines import-shipped (version 1 = the shipped baseline), or promote "
                             "a version")
        return load(spec, pointer.version, root)
    return load(spec, parse_version(version), root)


def load_version_data(suite: Suite, version: int | str | None = None, root: str | None = None) -> Any:
    """The data model (e.g. the golden table) a version holds in place of the spec's data file, of
    ``version`` or of the current version when None; InputError when the suite's engine judges against
    a baseline tracker instead."""
    spec = _spec(suite)
    suite = spec.name
    engine = engine_of(spec)
    if not engine.baseline_is_data:
        raise InputError(f"suite {suite} (engine {spec.engine}) keeps no data file in its baseline versions, but a "
                         f"baseline tracker ({engine.baseline_file})", None, None,
                         "read the tracker with read_data, or load the data of a suite whose engine judges against "
                         "a golden table")
    return _resolve(spec, version, root).model


def read_data(suite: Suite, version: int | str, name: str, root: str | None = None) -> bytes:
    """The bytes of one data file of a validated version (e.g. baseline.jsonl to hand to the checker)."""
    spec = _spec(suite)
    suite = spec.name
    loaded = load(spec, parse_version(version), root)
    if name not in loaded.record.files:
        raise InputError(f"baseline {suite} v{loaded.record.version} has no file {name}",
                         location(suite, loaded.record.version, name, root), None,
                         f"its files are: {', '.join(sorted(loaded.record.files)) or 'none'}")
    return (suite_area(suite, root) / f"v{loaded.record.version}" / name).read_bytes()


def add_version(suite: Suite, provenance: Provenance, files: Mapping[str, bytes | str | Path],
                root: str | None = None) -> int:
    """Write a new version of ``suite`` (the next number, in a new folder) and return its number.

    ``files``: data file name -> content (bytes, text, or a local file): ``golden.json`` for a suite of
    the opd engine, ``baseline.jsonl`` (or ``provenance.baseline_ref``) for grpo, any other plain file
    name as an attachment. Everything is validated before anything is written. The first version of a
    suite is always the shipped one: when none exists yet it is imported first. The new version is not
    made current: that is :func:`promote`.
    """
    spec = _spec(suite)
    suite = spec.name
    label = f"new baseline {suite} version"
    fix = "correct the input and add it again; nothing was written"
    if provenance.source == "shipped":
        raise InputError(f"{label}: the shipped baseline is version 1 and only import_shipped writes it", None, None,
                         "give source 'calibration', or run rl-verify baselines import-shipped")
    data: dict[str, bytes] = {}
    given = {name: str(value) if isinstance(value, Path) else f"{name} (given to add_version)"
             for name, value in files.items()}
    for name, value in files.items():
        if not FILE_NAME.match(name) or name in (VERSION_FILE, CURRENT_FILE):
            raise InputError(f"{label}: {name!r} cannot be a data file name", None, None,
                             f"use a plain file name (letters, digits, . _ -), not {VERSION_FILE} or {CURRENT_FILE}")
        data[name] = as_bytes(name, value)
    engine_of(spec).check_version(spec, data, provenance.baseline_ref, lambda n: given.get(n, f"{n} (not given)"),
                                  label, fix)
    if not version_numbers(suite, root):
        import_shipped(spec, root)
    rec = write_version(spec, None, provenance, data, root)
    assert rec is not None
    return rec.version


def promote(suite: Suite, version: int | str, by: str, root: str | None = None) -> CurrentPointer:
    """Make an existing, valid ``version`` the current one (going back = promoting an older one).

    The version is validated completely first; a missing or broken one raises InputError and the
    current version stays as it was. Promoting the current version again changes nothing.
    """
    spec = _spec(suite)
    suite = spec.name
    n = parse_version(version)
    if not by or not by.strip():
        raise InputError(f"promotion of baseline {suite} v{n} names nobody", None, None, "give --by NAME")
    load(spec, n, root)
    note = ""
    try:
        before = current(spec, root)
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
    put(suite_area(suite, root) / CURRENT_FILE, json_bytes(pointer), root)
    return pointer


def import_shipped(suite: Suite, root: str | None = None) -> Imported:
    """Version 1 of ``suite`` from what ships today; idempotent (an existing v1 is returned, never
    rewritten). Makes it current when the suite has no current version."""
    spec = _spec(suite)
    suite = spec.name
    created = False
    if 1 in version_numbers(suite, root):
        rec = wait_written(spec, 1, root)
    else:
        provenance, files = engine_of(spec).shipped(spec)
        written = write_version(spec, 1, provenance, files, root)
        created = written is not None
        rec = written if written is not None else wait_written(spec, 1, root)  # another import won the race
    if rec.source != "shipped":
        raise InputError(f"baseline {suite} v1 is a {rec.source} baseline, not the shipped one",
                         location(suite, 1, VERSION_FILE, root), None,
                         "version 1 is reserved for the shipped baseline; keep this store's v1 as it is and add the "
                         "shipped data as a new version by hand if it is needed")
    made_current = False
    if not created:  # the run that wrote v1 makes it current right after: wait for that, not promote it twice
        deadline = time.monotonic() + settings.BASELINE_WRITE_WAIT_S
        while current(spec, root) is None and time.monotonic() < deadline:
            time.sleep(0.2)
    if current(spec, root) is None:
        promote(spec, 1, IMPORT_PROMOTER, root)
        made_current = True
    return Imported(rec, created, made_current)


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


def in_use(suites: list[Suite], pins: Mapping[str, int], root: str | None = None) -> dict[str, dict[str, Any]]:
    """The baseline version each suite of a run is judged against: its pinned version, else its
    current one. A suite with no version yet gets version 1 imported (what ships today).

    Returns suite -> ``{"version", "current", "label", "files"}``. Every suite's problem (a missing
    or broken version) is listed in one InputError; nothing is chosen then.
    """
    out: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for suite in suites:
        try:
            spec = _spec(suite)  # once per suite: every step below is given the spec, not the name
            numbers = version_numbers(spec.name, root)
            # No version yet, or only a v1 with no current pointer: another run may be importing it right now.
            if not numbers or (numbers == [1] and current(spec, root) is None):
                import_shipped(spec, root)
            pointer = current(spec, root)
            rec = resolve(spec, pins.get(spec.name), root)
        except InputError as err:
            problems.append(str(err))
            continue
        out[spec.name] = {"version": rec.version, "current": pointer is not None and pointer.version == rec.version,
                      "label": describe(rec), "files": sorted(rec.files)}
    if problems:
        raise InputError(f"{len(problems)} baseline version problem(s); nothing was launched:\n"
                         + "\n".join(f"  - {p}" for p in problems), None, None,
                         "fix the param 'baseline_versions', or promote a valid version "
                         "(rl-verify baselines list | promote)")
    return out


def version_files(suite: Suite, version: int | str, root: str | None = None) -> dict[str, bytes]:
    """The data files of a validated version: name -> bytes (checked against their sha256)."""
    loaded = load(_spec(suite), parse_version(version), root)
    return {**loaded.data, VERSION_FILE: json_bytes(loaded.record)}
