"""Faults of the simulated node, read by the replay trainer at launch (and the hold fault's release)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from simulator.common import (
    FAULT_KINDS,
    DEFAULT_MISSING,
    HIDDEN_SUFFIX,
    _root,
    _write_json,
    _read_json,
)
from simulator import traps


# ----------------------------------------------------------------------------------------------------
# Faults
def set_fault(state: Path, suite: str, kind: str, at_step: int | None = None,
              path: str | None = None, **extra: Any) -> dict[str, Any]:
    """Switch one fault on for ``suite`` (replacing any previous fault of that suite); return it.

    Kinds: crash / hang / nan / hold (at ``at_step``, default 3; hold waits there, alive, until
    ``release``) / oom (logs a CUDA out-of-memory error at ``at_step`` and hangs, as a real run
    often does until an NCCL timeout), truncated, slow (``factor``, default 3),
    missing-input (renames ``path`` - relative to ROOT, default the suite's main model - to
    ``<path>.rlsim-hidden`` until ``clear_faults``). Read by the replay trainer at launch. A crash
    ``at_step`` 0 dies at launch, before any tracker. ``extra`` ``commit`` (a SHA prefix) narrows a fault to
    launches of that commit, ``times`` to the first ``times`` launches it strikes (a one-off fault), every
    launch of the suite counted, the bitwise lane's included.

    Node traps (``traps.NODE_FAULT_KINDS``: low-nofile, hidden-gpu, gpu-lost, foreign-ray,
    no-python) are node-wide: several can be on at once, under ``faults.json["node"]``, whichever
    ``suite`` (grpo|opd|node) they are set through; see ``traps.set_node_fault`` for their parameters.
    """
    if kind in traps.NODE_FAULT_KINDS:
        if suite not in ("grpo", "opd", "node"):
            raise ValueError(f"unknown suite {suite!r} (grpo|opd|node)")
        if at_step is not None or path is not None:
            raise ValueError(f"node fault {kind!r} takes no at_step/path")
        return traps.set_node_fault(state, kind, via=suite, **extra)
    if suite not in ("grpo", "opd"):
        raise ValueError(f"unknown suite {suite!r} (grpo|opd)")
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r} ({'|'.join(FAULT_KINDS)})")
    root = _root(state)
    _clear_suite(root, suite)
    fault: dict[str, Any] = {"kind": kind, **extra}
    if kind in ("crash", "hang", "nan", "hold", "oom"):
        fault["at_step"] = int(at_step if at_step is not None else 3)
    elif at_step is not None:
        fault["at_step"] = int(at_step)
    if kind == "missing-input":
        rel = (path or DEFAULT_MISSING[suite]).strip("/")
        target = root / rel
        if not target.exists():
            raise FileNotFoundError(f"nothing to hide at {target}")
        os.replace(target, root / (rel + HIDDEN_SUFFIX))
        fault["hidden"] = [rel]
    faults = _read_json(root / "faults.json", {})
    faults[suite] = fault
    _write_json(root / "faults.json", faults)
    return fault


def release(state: Path, suite: str) -> None:
    """Let a training held by the "hold" fault go on."""
    (_root(state) / f"release-{suite}").touch()


def _clear_suite(root: Path, suite: str) -> None:
    (root / f"release-{suite}").unlink(missing_ok=True)
    (root / "state" / f"fault-launches-{suite}").unlink(missing_ok=True)  # a new fault counts its own launches
    faults = _read_json(root / "faults.json", {})
    for rel in (faults.get(suite) or {}).get("hidden", []):
        hidden = root / (rel + HIDDEN_SUFFIX)
        if hidden.exists() and not (root / rel).exists():
            os.replace(hidden, root / rel)
    faults.pop(suite, None)
    _write_json(root / "faults.json", faults)


def clear_faults(state: Path, suite: str | None = None) -> None:
    """Switch off the faults of ``suite`` (or of all suites), restoring any hidden input.

    Node traps go off with all faults, with ``suite="node"``, or with the suite they were set through.
    """
    root = _root(state)
    traps.clear_node_faults(state, suite)
    for s in ([suite] if suite else list(_read_json(root / "faults.json", {}))):
        if s != "node":
            _clear_suite(root, s)

