"""Bit-for-bit comparison of a deterministic run's first steps with a reference (issue 33, the bitwise lane).

Identity is only ever a shortcut to PASS: a difference means "run the full statistical check", never FAIL. So
every doubt counts as a difference: a value whose type differs (``1`` against ``1.0``), ``-0.0`` against
``0.0``, a NaN with another payload, a metric present on one side only, a missing step. Two NaNs with the same
bits are identical (a deterministic run reproduces them). The fields compared are every numeric field of a
tracker row but those an ``exclude`` pattern names (wall time, throughput, memory: they differ run to run
whatever the numerics). Pure; standard library only.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

#: What a tracker row always carries besides metrics: its step (compared as the row's key, not as a metric).
STEP_FIELD = "step"
#: The field only a step's summary row has (``core.tracker.MARKER``): the last row a step writes.
SUMMARY_FIELD = "response/rewards/mean"


@dataclass(frozen=True)
class Difference:
    """Where a run's numbers first parted from the reference: the step, the metric and both values as read
    (``None``: absent on that side), and why they are not the same bits."""

    step: int
    metric: str
    reference: Any
    current: Any
    why: str

    def line(self) -> str:
        """One line for a report or a log: step, metric, both values."""
        return (f"step {self.step}, {self.metric}: reference {_shown(self.reference)}, this run "
                f"{_shown(self.current)} ({self.why})")


def _shown(value: Any) -> str:
    if value is None:
        return "absent"
    if isinstance(value, float) and not math.isnan(value):
        return f"{value!r} ({value.hex()})"
    return repr(value)


def is_numeric(value: Any) -> bool:
    """Whether a tracker value is a number the lane compares (bool is not: a flag, not a metric)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def compared_fields(row: Mapping[str, Any], exclude: Sequence[str] = ()) -> dict[str, Any]:
    """The fields of one tracker row that the lane compares: every numeric one but the step and those matching
    an ``exclude`` pattern (``fnmatch`` style on the metric name, e.g. ``time/*``)."""
    return {k: v for k, v in row.items()
            if k != STEP_FIELD and is_numeric(v) and not any(fnmatchcase(k, p) for p in exclude)}


def _bits(value: int | float) -> tuple[str, bytes | int]:
    if isinstance(value, float):
        return "float", struct.pack("<d", value)
    return "int", value


def same_bits(a: Any, b: Any) -> str | None:
    """None when ``a`` and ``b`` are the same value bit for bit, else why not (one short phrase)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        return "absent in the reference" if a is None else "absent in this run"
    kind_a, bits_a = _bits(a)
    kind_b, bits_b = _bits(b)
    if kind_a != kind_b:
        return f"{kind_a} against {kind_b}"
    if bits_a != bits_b:
        return "different bits"
    return None


def step_difference(step: int, reference: Mapping[str, Any], current: Mapping[str, Any],
                    exclude: Sequence[str] = ()) -> Difference | None:
    """The first compared metric (in sorted order, so the answer does not depend on key order) whose values
    differ between two rows of the same step, else None."""
    ref, cur = compared_fields(reference, exclude), compared_fields(current, exclude)
    for metric in sorted(set(ref) | set(cur)):
        why = same_bits(ref.get(metric), cur.get(metric))
        if why:
            return Difference(step, metric, ref.get(metric), cur.get(metric), why)
    return None


def by_step(rows: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Tracker rows keyed by their integer step (rows without one are not steps; a later row of a step wins, as
    a resumed tracker's does)."""
    out: dict[int, Mapping[str, Any]] = {}
    for row in rows:
        step = row.get(STEP_FIELD)
        if isinstance(step, int) and not isinstance(step, bool):
            out[step] = row
    return out


@dataclass(frozen=True)
class LaneReading:
    """What the lane's steps so far say: ``identical`` through ``steps_seen`` of ``steps`` steps, or the first
    ``difference``. ``done`` once every step is identical or a difference is found."""

    steps: int
    steps_seen: int
    difference: Difference | None

    @property
    def identical(self) -> bool:
        return self.difference is None and self.steps_seen >= self.steps

    @property
    def done(self) -> bool:
        return self.difference is not None or self.steps_seen >= self.steps


def read_lane(reference: Iterable[Mapping[str, Any]], current: Iterable[Mapping[str, Any]], steps: int,
              exclude: Sequence[str] = (), first_step: int = 0) -> LaneReading:
    """Compares the current run's rows with the reference's, step by step from ``first_step`` on, over the
    ``steps`` steps the lane covers (``first_step`` .. ``first_step + steps - 1``), as far as the current run
    has come: a step the current run has not written yet ends the reading (it is read again when more rows
    come); a step the reference lacks is a difference (the reference does not cover the lane)."""
    ref, cur = by_step(reference), by_step(current)
    seen = 0
    for step in range(first_step, first_step + steps):
        if step not in cur:
            break
        if step not in ref:
            return LaneReading(steps, seen, Difference(step, STEP_FIELD, None, step, "step absent in the reference"))
        diff = step_difference(step, ref[step], cur[step], exclude)
        if diff:
            return LaneReading(steps, seen, diff)
        seen += 1
    return LaneReading(steps, seen, None)


def fingerprint(facts: Mapping[str, Any]) -> str:
    """A short, stable hash of JSON-shaped facts (key order does not matter): an environment's fingerprint (GPU
    model and count, driver, CUDA, package versions, the lane's env) or a reference's key."""
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def environment_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What differs between two environments' facts (``check_prerequisites``'s: gpu, gpu_count, driver, cuda,
    packages), one "name before -> after" per fact, packages by name; "(none)" for what one side could not say. The
    fingerprint itself is not a fact."""
    def flat(facts: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in facts.items() if k not in ("packages", "fingerprint")}
        out.update({str(name): version for name, version in (facts.get("packages") or {}).items()})
        return out

    def shown(value: Any) -> str:
        return "(none)" if value is None else str(value)

    old, new = flat(before), flat(after)
    return [f"{name} {shown(old.get(name))} -> {shown(new.get(name))}"
            for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]


def reference_key(suite: str, experiment: str, environment: str, lane: Mapping[str, Any]) -> str:
    """The key a reference is kept and found under: the suite, its experiment fingerprint, the environment's
    fingerprint and the lane's config (env, args, steps, exclude); any of them changing means no reference."""
    return fingerprint({"suite": suite, "experiment": experiment, "environment": environment, "lane": dict(lane)})


class LaneFeed:
    """A deterministic run's tracker read while it grows, kept as the lane compares it: per step, the compared
    fields of its rows merged in file order (``compared_fields``; a mini-batch row's value is overwritten by the
    step summary's). :meth:`feed` takes the file's new bytes; a partial last line waits for its newline; a
    complete line that is not a JSON object is skipped (the tracker's own format checks are the fetch's)."""

    def __init__(self, exclude: Sequence[str] = ()) -> None:
        self.exclude = tuple(exclude)
        self.steps: dict[int, dict[str, Any]] = {}
        #: The steps whose summary row has been read (nothing more of them comes).
        self.summarized: set[int] = set()
        self._pending = b""

    def feed(self, data: bytes) -> None:
        buffer = self._pending + data
        cut = buffer.rfind(b"\n") + 1
        complete, self._pending = buffer[:cut], buffer[cut:]
        for raw in complete.splitlines():
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            step = row.get(STEP_FIELD) if isinstance(row, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                self.steps.setdefault(step, {STEP_FIELD: step}).update(compared_fields(row, self.exclude))
                if SUMMARY_FIELD in row:
                    self.summarized.add(step)

    def rows(self) -> list[dict[str, Any]]:
        """The merged rows in step order (what a reference keeps and :func:`read_lane` reads)."""
        return [self.steps[s] for s in sorted(self.steps)]


def difference_dict(diff: Difference | None) -> dict[str, Any] | None:
    """A difference as JSON (non-finite floats as their ``repr``, exact floats also as hex): for the record."""
    if diff is None:
        return None

    def shown(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        return value

    return {"step": diff.step, "metric": diff.metric, "reference": shown(diff.reference),
            "current": shown(diff.current), "why": diff.why, "line": diff.line()}


class LaneWatch:
    """The lane as the trigger runs it on one deterministic job: the ``tracker_poll`` script's output in, the
    reading out. ``config``: ``work_dir`` and ``tracker_glob`` (remote), ``steps`` k, ``first_step``,
    ``exclude``, and ``reference`` (its rows; None: record the k steps, for a reference's self-check).

    A step counts once its summary row, a later step's row, or the job's end has been read: a tracker is flushed
    in blocks, so a step's mini-batch rows can arrive before its summary row, and half a step must never read as
    a difference."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.work_dir, self.tracker_glob = str(config.get("work_dir", "")), str(config.get("tracker_glob", ""))
        self.steps, self.first_step = int(config["steps"]), int(config.get("first_step", 0))
        self.reference: list[dict[str, Any]] | None = config.get("reference")
        self.feed = LaneFeed(config.get("exclude") or ())
        self.tracker_path, self.offset = "", 0

    def take(self, output: bytes) -> bool:
        """Feed one ``tracker_poll`` output (``<path> <start> <size>`` then the bytes, or ``-``); True when the
        tracker has more bytes to read now."""
        head, _, chunk = output.partition(b"\n")
        fields = head.decode(errors="replace").split()
        if len(fields) != 3 or fields[0] == "-":
            return False
        path, start, size = fields[0], int(fields[1]), int(fields[2])
        if path != self.tracker_path:
            self.tracker_path, self.offset, self.feed = path, 0, LaneFeed(self.feed.exclude)
            if start != 0:
                return True
        self.feed.feed(chunk)
        self.offset = start + len(chunk)
        return self.offset < size

    def complete(self, ended: bool = False) -> list[dict[str, Any]]:
        """The rows of the steps read to their end (all of them once the job has ended)."""
        rows = self.feed.rows()
        if ended or not rows:
            return rows
        return rows[:-1] + [r for r in rows[-1:] if r[STEP_FIELD] in self.feed.summarized]

    def reading(self, ended: bool = False) -> LaneReading:
        """How far the lane has come: against the reference, or (recording) how many of its steps are in."""
        rows = self.complete(ended)
        if self.reference is None:
            have = {r[STEP_FIELD] for r in rows}
            seen = 0
            while self.first_step + seen in have and seen < self.steps:
                seen += 1
            return LaneReading(self.steps, seen, None)
        return read_lane(self.reference, rows, self.steps, first_step=self.first_step)

    def summary(self, ended: bool = False) -> dict[str, Any]:
        """The reading as JSON for the trigger's event: ``identical`` (k same steps, or k steps recorded),
        ``steps_seen``, ``difference``, and the k steps' ``rows`` (what a reference keeps)."""
        reading = self.reading(ended)
        last = self.first_step + self.steps
        return {"identical": reading.identical, "done": reading.done, "steps": self.steps,
                "steps_seen": reading.steps_seen, "difference": difference_dict(reading.difference),
                "rows": [r for r in self.complete(ended) if self.first_step <= r[STEP_FIELD] < last]}
