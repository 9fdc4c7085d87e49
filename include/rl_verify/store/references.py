"""The bitwise lane's references (issue 33): the first k steps of a deterministic run at a verified commit, kept in
the record store under ``bitwise-references/<key>.json``, where ``key`` is ``core.bitwise.reference_key`` (suite,
experiment fingerprint, environment fingerprint, lane config): any of them changing finds no reference.

A reference is written only after the verification of its commit PASSed in full and its self-check (two
deterministic runs of that commit) ran: ``state`` is ``trusted`` when they agreed bit for bit, else ``not
reproducible`` (the lane is then off for that key, and the reports say why). A later PASS with other bits (a
healthy numerics change) replaces it.

The executed-code evidence of a reference (issue 44) is kept under ``bitwise-references/evidence/<key>.json``.

A reference whose bits a FAILing commit also had is ``blind`` to that regression (issue 42): the FAIL's record is
kept in it (``blind``) and the lane is off for its key until a full PASS makes a new reference.
"""

from __future__ import annotations

import json
from typing import Any

from rl_verify.store import record

FOLDER = "bitwise-references"
TRUSTED, NOT_REPRODUCIBLE = "trusted", "not reproducible"


def _path(key: str, root: str | None = None) -> Any:
    if not key.isalnum():
        raise ValueError(f"reference key {key!r} is not a fingerprint (letters and digits only)")
    return record.store_root(root) / FOLDER / f"{key}.json"


def get(key: str, root: str | None = None) -> dict[str, Any] | None:
    """The reference kept under ``key``, or None when there is none (or it cannot be read: no lane, a full
    verification, never a failure)."""
    path = _path(key, root)
    try:
        return json.loads(path.read_bytes()) if path.exists() else None
    except (OSError, ValueError):
        return None


def put(key: str, reference: dict[str, Any], root: str | None = None) -> str:
    """Keep ``reference`` under ``key`` (replacing an earlier one); return where it is."""
    if reference.get("state") not in (TRUSTED, NOT_REPRODUCIBLE):
        raise ValueError(f"a reference's state is {TRUSTED!r} or {NOT_REPRODUCIBLE!r}, not {reference.get('state')!r}")
    path = _path(key, root)
    record.make_parent(path)
    path.write_bytes((json.dumps({**reference, "key": key}, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    return str(path)


def others(suite: str, experiment: str, lane: str, key: str, root: str | None = None) -> list[dict[str, Any]]:
    """The references kept for ``suite`` with the same experiment fingerprint and lane config (``lane``: its
    fingerprint) under other keys, i.e. other environments, newest first. Only references that record those
    fields (and the environment's facts) are found; one that cannot be read is passed over."""
    folder = record.store_root(root) / FOLDER
    try:
        items = list(folder.iterdir()) if folder.exists() else []
    except OSError:
        return []
    found = []
    for item in items:
        name = item.name.removesuffix(".json")
        if name == item.name or name == key or not name.isalnum():
            continue
        kept = get(name, root)
        if kept and (kept.get("suite"), kept.get("experiment"), kept.get("lane")) == (suite, experiment, lane) \
                and kept.get("facts"):
            found.append(kept)
    return sorted(found, key=lambda r: str(r.get("made_at") or ""), reverse=True)


def state(reference: dict[str, Any] | None) -> str:
    """``core.lane.ReferenceState`` of a kept reference: trusted, not reproducible, blind (trusted, but a FAILing
    commit had its bits), or absent."""
    if reference is None:
        return "absent"
    if reference.get("state") == TRUSTED and reference.get("blind"):
        return "blind"
    return reference["state"] if reference.get("state") in (TRUSTED, NOT_REPRODUCIBLE) else "absent"


def blind_words(reference: dict[str, Any] | None) -> str:
    """What a blind reference did not see, in one phrase ("" when it is not blind)."""
    blind = (reference or {}).get("blind") or {}
    if not blind:
        return ""
    steps = blind.get("steps") or (reference or {}).get("steps") or "k"
    return (f"{str(blind.get('sha') or '?')[:9]} has its first {steps} steps' bits and ended {blind.get('outcome')} in "
            f"run {blind.get('run_id')} (its report: {blind.get('report')})")


def mark_blind(key: str, made_at: str | None, failed: dict[str, Any], root: str | None = None) -> bool:
    """Mark the reference kept under ``key`` blind to the regression of ``failed`` (``sha``, ``outcome``, ``run_id``,
    ``report``): only the reference made at ``made_at`` (the one the lane compared with; a newer one was made from
    a later PASS and is left as it is). Returns whether it was marked."""
    kept = get(key, root)
    if kept is None or kept.get("state") != TRUSTED or kept.get("made_at") != made_at:
        return False
    put(key, {**kept, "blind": dict(failed)}, root)
    return True


#: The references' executed-code evidence, one file a key, in a folder of its own (the references' folder lists
#: references only).
EVIDENCE_FOLDER = "evidence"


def _evidence_path(key: str, root: str | None = None) -> Any:
    return _path(key, root).parent / EVIDENCE_FOLDER / f"{key}.json"


def put_evidence(key: str, recorded: dict[str, Any], root: str | None = None) -> str:
    """Keep the executed-code evidence of the reference under ``key`` (issue 44; ``core.evidence.Evidence``'s dict
    with the reference's ``sha`` and ``made_at``), beside it; return where."""
    path = _evidence_path(key, root)
    record.make_parent(path)
    path.write_bytes((json.dumps(recorded, sort_keys=True) + "\n").encode("utf-8"))
    return str(path)


def get_evidence(key: str, reference: dict[str, Any] | None, root: str | None = None) -> dict[str, Any] | None:
    """The evidence kept beside the reference ``reference`` under ``key``, or None: none kept, unreadable, or
    another reference's (older than this one: made at another time)."""
    path = _evidence_path(key, root)
    try:
        found = json.loads(path.read_bytes()) if path.exists() else None
    except (OSError, ValueError):
        return None
    if not found or not reference or found.get("made_at") != reference.get("made_at") \
            or found.get("sha") != reference.get("sha"):
        return None
    return found


def newest_with_evidence(suite: str, experiment: str, lane: str,
                         root: str | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The newest trusted, not blind, reference of ``suite`` with this experiment fingerprint and lane config (any
    environment) that kept executed-code evidence, with that evidence (complete or not: the caller reads its
    ``problems``; an older complete one is not looked for: the newest reference is the project's latest word);
    None when there is none."""
    for kept in others(suite, experiment, lane, key="", root=root):
        if state(kept) != TRUSTED:
            continue
        found = get_evidence(str(kept.get("key")), kept, root)
        if found is not None:
            return kept, found
    return None
