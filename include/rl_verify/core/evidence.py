"""Executed-code evidence (issue 44): which lines of the checkout's Python a reference's training ran, and what a
diff's touched lines then mean for the shortcuts. Pure: the readings come in as parameters.

When a suite's bitwise reference is made, coverage.py records, in every process of the training (trainer, rollout
and teacher workers), the checkout's lines that ran: ``full`` (the reference's full run, any step) and ``lane``
(the lane's own k deterministic steps). A diff since the reference's commit is read through its hunks on the
reference's side (``hunks``; an insertion next to a line touches it):

* **the lane's validity**: every touched line the full run executed must also have been executed by the lane's k
  steps, else the lane cannot see the change (it first runs later, or only in code the deterministic launch
  bypasses): the lane is off, naming the file and the line;
* **PASS (unchanged)**: a diff whose Python changes touch only lines no process of the full run executed, and no
  other file the training reads, cannot move a number the full run measured.

Fail safe: evidence that is incomplete is no evidence (``Evidence.problems``): a process of the training that
recorded nothing (an expected entry module with no line), evidence older than its reference, a file whose content at
the diff's base is not the one measured. Code whose body never runs as Python line by line (a Triton ``@jit``
kernel, a ``torch.compile``d function: a file that names such a compiler) counts as run wherever its file ran at
all. The remaining blind spot: a changed value in a line that runs every step but matters only later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
#: What in a file's text says some of its Python bodies run compiled, not line by line (coverage sees the
#: decorator run, never the body): such a file counts as run wherever any of its lines ran.
COMPILED_BODY = re.compile(r"triton\.jit|@jit\b|@triton\b|torch\.compile|numba|cuda\.jit|@tilelang")


@dataclass(frozen=True)
class Touched:
    """One file's touched lines on the base side of a diff (1-based), and whether the file is new or deleted."""

    path: str
    lines: frozenset[int]
    added: bool = False
    deleted: bool = False


def parse_diff(text: str) -> dict[str, Touched]:
    """The files of ``git diff -U0 --no-renames BASE HEAD`` output and the base-side lines each hunk touches: a
    hunk that replaces or removes lines touches them; one that only inserts after base line L touches L and L + 1
    (an insertion next to a line counts as touching it)."""
    out: dict[str, Touched] = {}
    path = None
    lines: set[int] = set()
    added = deleted = False

    def flush() -> None:
        if path is not None:
            out[path] = Touched(path, frozenset(lines), added, deleted)

    for line in text.splitlines():
        if line.startswith("diff --git "):
            flush()
            path, lines, added, deleted = None, set(), False, False
        elif line.startswith("--- "):
            deleted_side = line[4:].strip()
            added = deleted_side == "/dev/null"
            if not added:
                path = _strip(deleted_side)
        elif line.startswith("+++ "):
            new = line[4:].strip()
            deleted = new == "/dev/null"
            if path is None:
                path = _strip(new)
        else:
            match = _HUNK.match(line)
            if match and path is not None:
                start, count = int(match.group(1)), int(match.group(2) or "1")
                if count:
                    lines.update(range(start, start + count))
                else:  # pure insertion after base line ``start``
                    lines.update(x for x in (start, start + 1) if x > 0)
    flush()
    return out


def _strip(side: str) -> str:
    side = side.split("\t", 1)[0]
    return side[2:] if side.startswith(("a/", "b/")) else side


@dataclass(frozen=True)
class Evidence:
    """What a reference's runs executed: per checkout-relative ``.py`` path, the sorted lines ``full`` (the full
    run) and ``lane`` (the lane's k deterministic steps) ran in any process; ``hashes``: each measured file's
    content hash at the reference's commit; ``entries``: the entry modules each recording found;
    ``compiled``: the measured files whose bodies run compiled (``COMPILED_BODY``); ``problems``: why it is not
    complete (empty: complete)."""

    full: Mapping[str, Sequence[int]] = field(default_factory=dict)
    lane: Mapping[str, Sequence[int]] = field(default_factory=dict)
    hashes: Mapping[str, str] = field(default_factory=dict)
    compiled: Sequence[str] = ()
    problems: Sequence[str] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"full": {k: list(v) for k, v in self.full.items()}, "lane": {k: list(v) for k, v in self.lane.items()},
                "hashes": dict(self.hashes), "compiled": list(self.compiled), "problems": list(self.problems)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Evidence":
        return cls({k: tuple(v) for k, v in (data.get("full") or {}).items()},
                   {k: tuple(v) for k, v in (data.get("lane") or {}).items()}, dict(data.get("hashes") or {}),
                   tuple(data.get("compiled") or ()), tuple(data.get("problems") or ()))


def completeness(full: Mapping[str, Sequence[int]], lane: Mapping[str, Sequence[int]], entries: Sequence[str],
                 processes: Mapping[str, int]) -> list[str]:
    """Why the recordings are not evidence ([] when they are): an expected entry module (each process kind of the
    training: trainer, rollout worker, teacher) without a line in either recording, or a recording from no process."""
    problems = []
    for which, lines in (("full run", full), ("lane's steps", lane)):
        if not processes.get(which):
            problems.append(f"the {which} recorded nothing (no process wrote coverage data)")
            continue
        missing = [e for e in entries if not lines.get(e)]
        if missing:
            problems.append(f"the {which} has no line of {', '.join(missing)} (a process of the training did not "
                            "record: the environment did not reach it)")
    return problems


def stale_files(evidence: Evidence, base_hashes: Mapping[str, str | None], paths: Iterable[str]) -> list[str]:
    """The ``paths`` whose content at the diff's base is not the content measured (evidence of another file)."""
    return [p for p in paths if p in evidence.hashes and base_hashes.get(p) != evidence.hashes[p]]


def _ran(lines: Mapping[str, Sequence[int]], compiled: Sequence[str], path: str) -> set[int] | None:
    """The lines of ``path`` that ran, or None when the whole file counts as run (it ran and its bodies compile)."""
    got = set(lines.get(path) or ())
    if got and path in compiled:
        return None
    return got


@dataclass(frozen=True)
class LaneBlind:
    """A touched line the full run executed and the lane's steps did not: the lane cannot see its change."""

    path: str
    line: int

    def words(self) -> str:
        return f"{self.path}:{self.line}"


def lane_blind(evidence: Evidence, touched: Mapping[str, Touched]) -> list[LaneBlind]:
    """The touched lines of ``.py`` files that the full run executed and the lane's k steps did not (sorted); a
    file whose bodies compile counts whole: any touched line of a file the full run ran and the lane did not run at
    all."""
    out = []
    for path, t in sorted(touched.items()):
        if not path.endswith(".py"):
            continue
        full, lane = _ran(evidence.full, evidence.compiled, path), _ran(evidence.lane, evidence.compiled, path)
        if full is None:  # the whole file counts as run in the full run; the lane ran it whole too, or not at all
            if lane is not None:
                out.append(LaneBlind(path, min(t.lines) if t.lines else 0))
            continue
        for n in sorted(t.lines & full):
            if lane is not None and n not in lane:
                out.append(LaneBlind(path, n))
    return out


def ran_lines(evidence: Evidence, touched: Mapping[str, Touched]) -> list[str]:
    """The touched lines of ``.py`` files that some process of the full run executed, as ``path:line`` (a file
    whose bodies compile and that ran: ``path`` whole). [] means no changed Python line ran."""
    out = []
    for path, t in sorted(touched.items()):
        if not path.endswith(".py"):
            continue
        full = _ran(evidence.full, evidence.compiled, path)
        if full is None:
            out.append(f"{path} (its bodies compile: the whole file counts as run)")
            continue
        out += [f"{path}:{n}" for n in sorted(t.lines & full)]
    return out
