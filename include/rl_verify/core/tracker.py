"""Streaming reader of XTuner RL trackers (``tracker.jsonl``).

Promises (the tracker format is xtuner-contract.md's):

* The file is read line by line in binary mode; only the metrics asked for are kept, so memory
  grows with (step-summary rows x wanted metrics), never with the file size.
* Rows are classified by content, never by key order: a row holding the marker key
  ``response/rewards/mean`` is an RL step-summary row (one per training step, ``step`` = N); any
  other row only contributes its ``eval/...`` values (the initial eval row at step 0, separate eval
  rows); mini-batch rows and unknown rows are ignored for step counting. Extra keys are ignored.
* A partial last line (a crashed or still-writing run: it does not parse, or it is cut inside a
  UTF-8 character) is dropped and recorded in ``abnormal``. A complete JSON object that merely
  lacks its trailing newline is kept (the checker parses it too) and noted in ``abnormal``.
* A malformed line anywhere else, a non-UTF-8 line, a row that is not a JSON object, a
  step-summary row without an integer step, an empty file: ``InputError`` naming file:line.
* NaN/Infinity (bare ``NaN``/``Infinity`` literals, as Python's json writes them) or a
  non-numeric value in a wanted metric is kept as a float NaN/inf and recorded in ``abnormal``, so
  the comparison fails at that step instead of passing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rl_verify import settings
from rl_verify.core.errors import InputError

MARKER = "response/rewards/mean"
EVAL_PREFIX = "eval/"
# Abnormal values are reported per metric up to this many times, then summarised, so a run that
# diverged at step 3 does not produce 10,000 lines of report.
MAX_ABNORMAL_PER_METRIC = 5


@dataclass(frozen=True, slots=True)
class Point:
    """One measured value: the step it belongs to, the value and the 1-based file line it came from."""

    step: int
    value: float
    line: int


@dataclass(slots=True)
class SummaryRow:
    """One RL step-summary row (wanted metrics only)."""

    step: int
    line: int
    values: dict[str, float]


@dataclass
class Tracker:
    """What the engine needs from one tracker file.

    ``rows``: step-summary rows in file order. ``evals``: step -> eval metric -> Point, from
    whichever row carries the eval values at that step (eval-only row or merged into the summary
    row; a later row wins). ``last``: metric -> its last Point in any row (final-eval checks).
    ``kept_bytes``: byte length of the prefix of the file holding every kept line.
    """

    path: str
    rows: list[SummaryRow] = field(default_factory=list)
    evals: dict[int, dict[str, Point]] = field(default_factory=dict)
    last: dict[str, Point] = field(default_factory=dict)
    lines: int = 0
    kept_bytes: int = 0
    blank_lines: int = 0
    partial_last_line: bool = False
    abnormal: list[str] = field(default_factory=list)
    _by_step: dict[int, SummaryRow] | None = field(default=None, init=False, repr=False, compare=False)
    _indexed: int = field(default=-1, init=False, repr=False, compare=False)

    @property
    def steps(self) -> int:
        """Number of RL step-summary rows (what the checker counts)."""
        return len(self.rows)

    def series(self, metric: str) -> list[Point]:
        """Values of ``metric`` over the step-summary rows that carry it, in file order."""
        return [Point(r.step, r.values[metric], r.line) for r in self.rows if metric in r.values]

    def summary_at(self, step: int) -> SummaryRow | None:
        """The step-summary row with ``step`` (the last one if a step repeats), or None."""
        if self._by_step is None or self._indexed != len(self.rows):
            # Built lazily (and rebuilt if rows were appended) so lookups stay O(1); a later row wins.
            self._by_step = {row.step: row for row in self.rows}
            self._indexed = len(self.rows)
        return self._by_step.get(step)

    def value_at(self, metric: str, step: int) -> Point | None:
        """``metric`` at ``step``: eval metrics from the row carrying them at that step,
        training metrics from step-summary row ``step``. None when absent."""
        if metric.startswith(EVAL_PREFIX):
            return self.evals.get(step, {}).get(metric)
        row = self.summary_at(step)
        if row is None or metric not in row.values:
            return None
        return Point(step, row.values[metric], row.line)


def _as_step(raw: object) -> int | None:
    """An integral step (int, or float with an integral value), else None. Bools are not steps."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        return int(raw)
    return None


def _as_value(raw: object) -> tuple[float, bool]:
    """(float value, is_numeric). Non-numeric values become NaN so they can never pass."""
    if isinstance(raw, bool):
        return math.nan, False
    if isinstance(raw, (int, float)):
        return float(raw), True
    if isinstance(raw, str):
        try:
            return float(raw), True
        except ValueError:
            return math.nan, False
    return math.nan, False


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes, int]]:
    """Yield (1-based line number, raw line bytes incl. newline, byte offset after the line)."""
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            offset += len(raw)
            yield number, raw, offset


class _Reader:
    """Accumulates one tracker; split out so ``read_tracker`` stays a small driver."""

    def __init__(self, path: Path, wanted: set[str] | None) -> None:
        self.path = path
        self.wanted = wanted
        self.result = Tracker(path=str(path))
        self.bad_counts: dict[str, int] = {}
        self.step_rows: dict[int, int] = {}

    def want(self, key: str) -> bool:
        return self.wanted is None or key in self.wanted

    def note_value(self, metric: str, value: float, numeric: bool, step: int, line: int) -> None:
        """Record NaN/Inf/non-numeric values of wanted metrics in ``abnormal`` (capped)."""
        if numeric and math.isfinite(value):
            return
        count = self.bad_counts.get(metric, 0) + 1
        self.bad_counts[metric] = count
        if count <= MAX_ABNORMAL_PER_METRIC:
            what = ("a non-numeric value" if not numeric
                    else repr(value).replace("nan", "NaN").replace("inf", "Infinity"))
            self.result.abnormal.append(
                f"{self.path}:{line}: {metric} is {what} at step {step} (the check fails at this step)")

    def take(self, number: int, row: object) -> None:
        """Classify one parsed row and keep the wanted values."""
        if not isinstance(row, dict):
            raise InputError(f"line is JSON but not an object ({type(row).__name__})", self.path, number,
                             "each tracker line must be one JSON object; pass the tracker.jsonl written by XTuner")
        step = _as_step(row.get("step"))
        is_summary = MARKER in row
        if step is None:
            if is_summary:
                raise InputError("step-summary row (has 'response/rewards/mean') without an integer 'step'",
                                 self.path, number, "pass an XTuner tracker; every row carries an integer step")
            return  # a row we cannot place in time contributes nothing
        values: dict[str, float] = {}
        for key, raw in row.items():
            if key == "step" or not self.want(key):
                continue
            if not is_summary and not key.startswith(EVAL_PREFIX):
                continue  # mini-batch rows: only eval values may live outside summary rows
            value, numeric = _as_value(raw)
            self.note_value(key, value, numeric, step, number)
            values[key] = value
            if key.startswith(EVAL_PREFIX):
                self.result.evals.setdefault(step, {})[key] = Point(step, value, number)
            self.result.last[key] = Point(step, value, number)
        if is_summary:
            self.result.rows.append(SummaryRow(step, number, values))
            self.step_rows[step] = self.step_rows.get(step, 0) + 1

    def finish(self) -> Tracker:
        """Final consistency notes; returns the Tracker."""
        for metric, count in self.bad_counts.items():
            if count > MAX_ABNORMAL_PER_METRIC:
                self.result.abnormal.append(
                    f"{self.path}: {metric} has {count} NaN/Infinity/non-numeric values in total "
                    f"({count - MAX_ABNORMAL_PER_METRIC} more not listed)")
        if self.result.blank_lines:
            self.result.abnormal.append(
                f"{self.path}: {self.result.blank_lines} blank line(s) ignored (removed from the checker's copy)")
        repeated = sorted(s for s, n in self.step_rows.items() if n > 1)
        if repeated:
            shown = ", ".join(str(s) for s in repeated[:10])
            self.result.abnormal.append(
                f"{self.path}: step(s) {shown}{' ...' if len(repeated) > 10 else ''} appear in more than one "
                "step-summary row (resumed run?); per-step lookups use the last such row, step counts count all")
        return self.result


def _parse(raw: bytes) -> object:
    """Decode (strict UTF-8) and parse one line; raises UnicodeDecodeError or ValueError."""
    return json.loads(raw.decode("utf-8"))


def read_tracker(path: str | Path, metrics: Iterable[str] | None = None) -> Tracker:
    """Stream ``path`` and return a ``Tracker`` holding only ``metrics`` (all metrics when None).

    Raises ``InputError`` (file:line and a fix) for a missing, empty, non-UTF-8 or malformed file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("tracker file not found" if not path.exists() else "tracker path is not a file",
                         path, None, "check the path; the tracker is <WORK_DIR>/<exp>/logs/exp_tracking/tracker.jsonl")
    reader = _Reader(path, set(metrics) if metrics is not None else None)
    tracker = reader.result
    pending: tuple[int, bytes, int] | None = None  # one line of look-ahead: the last line is special
    for item in _iter_lines(path):
        if pending is not None:
            _take_line(reader, *pending, last=False)
        pending = item
    if pending is not None:
        _take_line(reader, *pending, last=True)
    if pending is None or (tracker.kept_bytes == 0 and not tracker.partial_last_line):
        raise InputError("tracker file is empty", path, None,
                         "the run wrote no rows; check the training log for a crash before step 0")
    if tracker.kept_bytes == 0:
        raise InputError("tracker holds no complete row (only a partial line)", path, pending[0],
                         "the run wrote no complete row yet; check the training log, or wait for the tracker flush")
    return reader.finish()


def _take_line(reader: _Reader, number: int, raw: bytes, offset: int, last: bool) -> None:
    """Parse one line; the last line may be partial (dropped), any other bad line is an InputError."""
    tracker = reader.result
    if not raw.strip():
        tracker.blank_lines += 1
        return
    has_newline = raw.endswith(b"\n")
    try:
        row = _parse(raw)
    except UnicodeDecodeError as exc:
        if last and not has_newline:
            _drop_partial(reader, number, "cut inside a UTF-8 character")
            return
        raise InputError(f"line is not valid UTF-8 (byte {exc.start})", reader.path, number,
                         "the tracker must be UTF-8 JSON lines; re-copy it from the node") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        if last:
            _drop_partial(reader, number, f"does not parse: {exc.msg}" if hasattr(exc, "msg") else "does not parse")
            return
        raise InputError(f"malformed JSON line ({exc})", reader.path, number,
                         "only the last line of a tracker may be partial; re-copy the tracker or fix that line"
                         ) from exc
    reader.take(number, row)
    tracker.lines = number
    tracker.kept_bytes = offset
    if last and not has_newline:
        tracker.abnormal.append(f"{reader.path}:{number}: last line has no trailing newline "
                                "(it parses as a complete row and is kept)")


def _drop_partial(reader: _Reader, number: int, why: str) -> None:
    reader.result.partial_last_line = True
    reader.result.abnormal.append(
        f"{reader.path}:{number}: partial last line dropped ({why}); the run crashed or was still writing")


def write_sanitised(tracker: Tracker, dest: str | Path) -> Path:
    """Copy the tracker's kept lines to ``dest`` (partial last line and blank lines removed),
    byte for byte otherwise, so a strict line-by-line ``json.loads`` reader cannot trip on them.
    Streams; written atomically (temp file + os.replace)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tracker.path, "rb") as src, open(tmp, "wb") as out:
        offset = 0
        for raw in src:
            if offset >= tracker.kept_bytes:
                break
            offset += len(raw)
            if not raw.strip():
                continue
            out.write(raw if raw.endswith(b"\n") else raw + b"\n")
    os.replace(tmp, dest)
    return dest


class TrackerFeed:
    """A tracker read while it grows: :meth:`feed` takes the file's new bytes only.

    Complete lines are classified exactly as :func:`read_tracker` classifies them (same ``_Reader``);
    a partial last line waits in a buffer until its newline arrives. ``offset`` is the byte length
    of the complete lines taken, i.e. where the next read of the file starts.
    """

    def __init__(self, path: str | Path, metrics: Iterable[str] | None = None) -> None:
        self._reader = _Reader(Path(path), set(metrics) if metrics is not None else None)
        self._pending = b""
        self._line = 0
        self.offset = 0

    @property
    def tracker(self) -> Tracker:
        """Everything taken so far (rows, evals, last values, abnormal values)."""
        return self._reader.result

    @property
    def waiting(self) -> int:
        """Bytes of a partial last line waiting for its end."""
        return len(self._pending)

    def feed(self, data: bytes) -> int:
        """Take the complete lines in the buffer + ``data``; return how many step-summary rows were new.

        A complete line that does not parse raises ``InputError`` naming file:line (only the last,
        still unfinished line may be partial, and it is kept waiting, not parsed).
        """
        buffer = self._pending + data
        cut = buffer.rfind(b"\n") + 1
        complete, self._pending = buffer[:cut], buffer[cut:]
        before = len(self.tracker.rows)
        for raw in complete.splitlines(keepends=True):
            self._line += 1
            self.offset += len(raw)
            if not raw.strip():
                self.tracker.blank_lines += 1
                continue
            try:
                row = _parse(raw)
            except (UnicodeDecodeError, ValueError) as exc:
                raise InputError(f"malformed tracker line ({exc})", self._reader.path, self._line,
                                 "only the last line of a growing tracker may be partial") from exc
            self._reader.take(self._line, row)
            self.tracker.lines = self._line
            self.tracker.kept_bytes = self.offset
        return len(self.tracker.rows) - before


def check_baseline_tracker(data: bytes, expected_steps: int, suite: str, where: str, what: str, fix: str) -> int:
    """``data`` as a baseline tracker of ``suite``: readable, no partial line, no NaN/Infinity, and
    ``expected_steps`` step-summary rows (the checker asserts equal step counts); returns the steps.
    Every problem raises InputError naming ``where`` and ``fix``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rl-verify-baseline-") as tmp:
        local = Path(tmp) / settings.BASELINE_TRACKER_FILE
        local.write_bytes(data)
        try:
            tracker = read_tracker(local)
        except InputError as exc:
            raise InputError(f"{what} is not a readable tracker: {exc.problem}", where, exc.line, fix) from exc
    if tracker.partial_last_line:
        raise InputError(f"{what} ends in a partial line", where, tracker.lines + 1, fix)
    bad = next(((row.step, m) for row in tracker.rows for m, v in row.values.items() if not math.isfinite(v)), None)
    if bad is not None:
        raise InputError(f"{what} has a NaN/Infinity/non-numeric {bad[1]} at step {bad[0]}", where, None, fix)
    if tracker.steps != expected_steps:
        raise InputError(f"{what} has {tracker.steps} step-summary rows but suite {suite} trains "
                         f"{expected_steps} steps (the checker asserts equal step counts)", where, None, fix)
    return tracker.steps
