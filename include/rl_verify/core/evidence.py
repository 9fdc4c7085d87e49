"""Executed-code evidence (issues 44, 53): which code blocks of the checkout's Python a reference's training ran, and
what a diff's changes then mean for the shortcuts. Pure: the readings come in as parameters.

When a suite's bitwise reference is made, coverage.py records, in every process of the training (trainer, rollout
workers, teachers, forked workers), the checkout's lines that ran: ``full`` (the reference's full run, any step) and
``lane`` (the lane's own k deterministic steps). The unit of judgement is the block Python executes
(``core.blocks``): a module body, a class body, a function body. A diff (``read_changes``: git's own file list,
each file's hunks on the reference's side; an insertion touches the lines on both sides of it) is read against them
(``read_diff``):

* a touched line belongs to the innermost block around it on the reference's side (definition-time code, such as a
  decorator, a default value or a ``def`` line, to the enclosing block); the change "ran" when any line of that
  block ran in any recorded process. Only a change whose every touched block never ran counts as unrun;
* **the lane's validity**: a touched block the full run ran and the lane's k steps did not, or, inside a block both
  ran, a touched statement (the line, or the nearest recorded lines around it) that only the full run ran: the lane
  cannot see the change (it first runs later): the lane is off, naming the file and the line;
* a file the evidence cannot judge (new, deleted or unreadable on one side, binary, a symlink or submodule, content
  other than the measured one, no parse at either end, a module with no line the interpreter reports) is
  ``unknown``: the path rules decide for it, as they do for every non-Python file.

Fail safe: incomplete evidence is no evidence (``Evidence.problems``). Code whose body never runs as Python line by
line (a Triton ``@jit`` kernel, a ``torch.compile``d function: a file that names such a compiler) counts as run
wherever its file ran at all. The remaining blind spot: a value computed in the lane's steps (at import, or in a
block the lane runs) that matters only later.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_verify.core import blocks as code_blocks

#: What in a file's text says some of its Python bodies run compiled, not line by line (coverage sees the
#: decorator run, never the body): such a file counts as run wherever any of its lines ran.
COMPILED_BODY = re.compile(r"triton\.jit|@jit\b|@triton\b|torch\.compile|numba|cuda\.jit|@tilelang")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
#: git's modes of a symlink and of a submodule (a gitlink): never judged by line evidence.
_NOT_FILES = {"120000": "a symlink", "160000": "a submodule"}


@dataclass(frozen=True)
class Change:
    """One file git lists in a diff: its ``status`` (git's letter: A, M, D, T), modes and base blob, its hunks on
    the base side (``(start, count)`` of each ``@@ -start,count`` header), ``whole``: why every line of it counts
    as touched ("" when its hunks say which), and for a ``.py`` file present at the head whether it parses there."""

    path: str
    status: str
    old_mode: str = "100644"
    new_mode: str = "100644"
    base_blob: str | None = None
    hunks: tuple[tuple[int, int], ...] = ()
    whole: str = ""
    head_parses: bool | None = None

    def base_lines(self, last: int) -> set[int]:
        """The base-side lines the change touches in a file of ``last`` lines: a hunk that replaces or removes lines
        touches them; one that only inserts after line L touches L and L + 1; a whole change every line."""
        if self.whole:
            return set(range(1, max(last, 1) + 1))
        out: set[int] = set()
        for start, count in self.hunks:
            out.update(range(start, start + count) if count else
                       (n for n in (start, start + 1) if 1 <= n <= max(last, 1)))
        return out


def read_changes(output: str) -> dict[str, Change]:
    """The files of a diff as ``sh/changed_lines.sh`` prints them (git's ``--raw -z`` list, ``--numstat -z``, each
    file's hunk headers and head-side parse). Every file git lists is returned: one whose hunks git did not give,
    a binary file, a mode-only or type change, an empty file and a deletion count as touched whole. Raises
    ValueError when the output is not that script's (a truncated read must not pass for a small diff)."""
    raw = numstat = None
    hunks: dict[int, list[tuple[int, int]]] = {}
    parses: dict[int, bool] = {}
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "RAW":
            raw = base64.b64decode(rest)
        elif kind == "NUMSTAT":
            numstat = base64.b64decode(rest)
        elif kind in ("HUNK", "PARSE"):
            index, _, value = rest.partition(" ")
            if kind == "PARSE":
                parses[int(index)] = value.strip() == "ok"
                continue
            match = _HUNK.match(value)
            if not match:
                raise ValueError(f"changed_lines: unreadable hunk header {value!r}")
            hunks.setdefault(int(index), []).append((int(match.group(1)), int(match.group(2) or "1")))
        elif line.strip():
            raise ValueError(f"changed_lines: unexpected line {line[:80]!r}")
    if raw is None or numstat is None:
        raise ValueError("changed_lines: the file list is missing from the node's answer (RAW/NUMSTAT)")
    binary = _binary_paths(numstat)
    out: dict[str, Change] = {}
    fields = raw.split(b"\0")
    for index, (meta, path_bytes) in enumerate(zip(fields[0::2], fields[1::2])):
        if not meta:
            break
        old_mode, new_mode, old_blob, _, status = meta.decode().lstrip(":").split()[:5]
        path = path_bytes.decode("utf-8", "surrogateescape")
        got = tuple(hunks.get(index, ()))
        status = status[:1]
        whole = ("binary" if path in binary else
                 _NOT_FILES.get(old_mode) or _NOT_FILES.get(new_mode) or
                 ("deleted" if status == "D" else "") or
                 ("a change of type" if status == "T" else "") or
                 ("a mode change only" if not got and old_mode != new_mode and status == "M" else "") or
                 ("no hunk (an empty file)" if not got else ""))
        out[path] = Change(path, status, old_mode, new_mode, None if set(old_blob) == {"0"} else old_blob, got,
                           whole, parses.get(index) if path.endswith(".py") else None)
    return out


def _binary_paths(numstat: bytes) -> set[str]:
    """The paths ``git diff --numstat -z`` marks binary (``-`` for both counts)."""
    out = set()
    for record in numstat.split(b"\0"):
        parts = record.split(b"\t", 2)
        if len(parts) == 3 and parts[0] == b"-" and parts[1] == b"-":
            out.add(parts[2].decode("utf-8", "surrogateescape"))
    return out


@dataclass(frozen=True)
class Evidence:
    """What a reference's runs executed: per checkout-relative ``.py`` path, the sorted lines ``full`` (the full
    run) and ``lane`` (the lane's k deterministic steps) ran in any process; ``hashes``: every tracked ``.py``
    file's git blob id at the reference's commit (measured or not); ``blocks``: each such file's blocks
    (``core.blocks.blocks_of`` in the training's interpreter; a file no process ran keeps only its module's);
    ``unparsed``: the files that did not parse there; ``compiled``: the measured files whose bodies run compiled
    (``COMPILED_BODY``); ``problems``: why it is not complete (empty: complete)."""

    full: Mapping[str, Sequence[int]] = field(default_factory=dict)
    lane: Mapping[str, Sequence[int]] = field(default_factory=dict)
    hashes: Mapping[str, str] = field(default_factory=dict)
    compiled: Sequence[str] = ()
    problems: Sequence[str] = ()
    blocks: Mapping[str, Sequence[code_blocks.Block]] = field(default_factory=dict)
    unparsed: Sequence[str] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"full": {k: list(v) for k, v in self.full.items()}, "lane": {k: list(v) for k, v in self.lane.items()},
                "hashes": dict(self.hashes), "compiled": list(self.compiled), "problems": list(self.problems),
                "blocks": {k: [list(b) for b in v] for k, v in self.blocks.items()}, "unparsed": list(self.unparsed)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Evidence":
        return cls({k: tuple(v) for k, v in (data.get("full") or {}).items()},
                   {k: tuple(v) for k, v in (data.get("lane") or {}).items()}, dict(data.get("hashes") or {}),
                   tuple(data.get("compiled") or ()), tuple(data.get("problems") or ()),
                   {k: tuple((int(b[0]), int(b[1]), int(b[2]), bool(b[3])) for b in v)
                    for k, v in (data.get("blocks") or {}).items()}, tuple(data.get("unparsed") or ()))


def completeness(readings: Mapping[str, Mapping[str, Any]], processes: Sequence[tuple[str, str]]) -> list[str]:
    """Why the recordings are not evidence ([] when they are), per process, not per module (issue 53). ``readings``:
    each recording by name ("full run", "lane's steps") as ``sh/evidence_read.sh`` printed it (``processes``: its
    data files; ``kinds``: kind -> the pids whose own data file ran the kind's function); ``processes``: the suite's
    expected kinds as (kind, runs: ``path.py:qualname``). A recording from no process, or one in which no process
    proved a kind (the driver importing a worker's module proves no worker), is named."""
    problems = []
    for which, reading in readings.items():
        if not reading.get("processes"):
            problems.append(f"the {which} recorded nothing (no process wrote coverage data)")
            continue
        proved = reading.get("kinds") or {}
        problems += [f"the {which}: no process of kind {kind!r} recorded ({runs}): the environment did not reach it"
                     for kind, runs in processes if not proved.get(kind)]
    return problems


def merged_blocks(*readings: Mapping[str, Sequence[Sequence[Any]]]) -> dict[str, list[code_blocks.Block]]:
    """One block list per file from several recordings of the same commit (each keeps a file's whole list only where
    one of its processes ran the file): the longest one each."""
    out: dict[str, list[code_blocks.Block]] = {}
    for reading in readings:
        for path, found in reading.items():
            if len(found) > len(out.get(path, ())):
                out[path] = [(int(b[0]), int(b[1]), int(b[2]), bool(b[3])) for b in found]
    return out


@dataclass(frozen=True)
class Reading:
    """What executed-code evidence says of a diff's ``.py`` files: ``ran``: touched lines (``path:line``) whose
    block some process of the full run or of the lane's steps ran; ``lane_unseen``: those whose block the full run
    ran and the lane's k steps never did (the lane cannot see them); ``unrun``: touched lines whose block no process
    of either ran; ``unknown``: the ``.py`` files the evidence cannot judge, each with why (the path rules decide for
    them); ``problems``: the evidence's own (not empty: no evidence at all)."""

    ran: tuple[str, ...] = ()
    lane_unseen: tuple[str, ...] = ()
    unrun: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def judged(self) -> set[str]:
        """The ``.py`` files whose every touched block no process ran (the only ones evidence may take from the
        path rules)."""
        ran = {r.rsplit(":", 1)[0] for r in self.ran}
        unknown = {u.split(" (", 1)[0] for u in self.unknown}
        return {r.rsplit(":", 1)[0] for r in self.unrun} - ran - unknown

    def to_dict(self) -> dict[str, Any]:
        return {"ran": list(self.ran), "lane_unseen": list(self.lane_unseen), "unrun": list(self.unrun),
                "unknown": list(self.unknown), "problems": list(self.problems)}


def _unknown_why(evidence: Evidence, change: Change) -> str:
    """Why the evidence cannot judge a ``.py`` change ("" when it can)."""
    path = change.path
    if change.status == "A":
        return "a new file: nothing recorded it"
    for mode in (change.old_mode, change.new_mode):
        if mode in _NOT_FILES:
            return _NOT_FILES[mode]
    if change.whole == "binary":
        return "git sees it as binary"
    if path in evidence.unparsed or path not in evidence.blocks:
        return "it did not parse at the reference's commit" if path in evidence.unparsed else \
            "the evidence has no account of it"
    if change.base_blob is None or evidence.hashes.get(path) != change.base_blob:
        return "its content at the diff's base is not the content measured"
    if change.status != "D" and change.head_parses is not True:
        return "it does not parse at the commit under test" if change.head_parses is False else \
            "whether it parses at the commit under test is not known"
    return ""


def _ran_in(lines: Sequence[int], start: int, end: int) -> bool:
    return any(start <= n <= end for n in lines)


def _later_near(full: Sequence[int], lane: Sequence[int], line: int, start: int, end: int) -> bool:
    """Whether ``line`` or the nearest line before and after it inside its block that the full run recorded ran in
    the full run and not in the lane's steps: a statement (or the branch an ``else:`` opens, the statement a closing
    bracket ends) of a block the lane runs that itself first runs later. Finer than the block, for the lane only:
    it can only turn the lane off."""
    recorded = sorted(n for n in full if start <= n <= end)
    before = [n for n in recorded if n < line][-1:]
    after = [n for n in recorded if n > line][:1]
    near = set(before + after) | ({line} if line in recorded else set())
    return bool(near - set(lane))


def read_diff(evidence: Evidence, changes: Mapping[str, Change]) -> Reading:
    """What the evidence says of each changed ``.py`` file (non-Python files are the path rules' alone): every
    touched line is judged by its block (``core.blocks.judged_block``) in the full run's and the lane's lines; a
    file whose bodies compile counts whole wherever any of its lines ran."""
    if evidence.problems:
        return Reading(problems=tuple(evidence.problems))
    ran: list[str] = []
    unseen: list[str] = []
    unrun: list[str] = []
    unknown: list[str] = []
    for path, change in sorted(changes.items()):
        if not path.endswith(".py"):
            continue
        why = _unknown_why(evidence, change)
        if why:
            unknown.append(f"{path} ({why})")
            continue
        file_blocks = list(evidence.blocks[path])
        full, lane = evidence.full.get(path) or (), evidence.lane.get(path) or ()
        if path in evidence.compiled and full:
            ran.append(f"{path}:1")
            if not lane:
                unseen.append(f"{path}:1")
            continue
        for line in sorted(change.base_lines(file_blocks[0][1])):
            index = code_blocks.judged_block(file_blocks, line)
            if index is None:
                unknown.append(f"{path} (no line of it is one the interpreter reports)")
                break
            start, end = file_blocks[index][:2]
            if _ran_in(full, start, end):
                ran.append(f"{path}:{line}")
                if not _ran_in(lane, start, end) or _later_near(full, lane, line, start, end):
                    unseen.append(f"{path}:{line}")
            elif _ran_in(lane, start, end):  # code only the lane's launch runs (its rollout backend): its bits
                ran.append(f"{path}:{line}")
            else:
                unrun.append(f"{path}:{line}")
    return Reading(tuple(ran), tuple(unseen), tuple(unrun), tuple(dict.fromkeys(unknown)))
