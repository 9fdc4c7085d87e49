"""Running the live check of one training, and the suite's result when it stopped the training early.

:class:`LiveWatch` is what the trigger runs for one training: tracker bytes and log lines in,
progress lines and the verdict out, from a JSON config (no engine, no record store, no SSH in it),
with the engine's check (``core.livecheck.LiveCheck``) rebuilt from its serialised form. An early
abort's record (``abort.json``) becomes the suite's FAIL (:func:`aborted_result`), its whole table
(:func:`full_aborted_checks`) and its partial curves (:func:`partial_plot`). No Airflow import.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, fields, replace
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rl_verify.core.livecheck import BREACHED, WARNING, Certain, LiveCheck, LiveResult, rebuild
from rl_verify.core.model import FAIL, Check, SuiteResult, failure_class_of
from rl_verify.core.nextsteps import EngineRules, suggest
from rl_verify.core.plots import Panel, plot_panels
from rl_verify.core.shapes import ComparedPoint, Shape, classify
from rl_verify.core.tracker import EVAL_PREFIX, Tracker, TrackerFeed, read_tracker


def progress(result: LiveResult, expected_steps: int, elapsed_s: float | None) -> str:
    """One task-log line: ``step N/M``, the ETA from the observed step time, every metric's status."""
    eta = ""
    if elapsed_s and result.steps:
        per_step = elapsed_s / result.steps
        eta = f", ETA {max(0, expected_steps - result.steps) * per_step / 60:.1f} min ({per_step:.1f} s/step observed)"
    states = "; ".join(s.metric + " " + s.state + (f" ({s.text})" if s.state in (BREACHED, WARNING) else "")
                       for s in result.status)
    return f"step {result.steps}/{expected_steps}{eta} | {states}"


def aborted_checks(certain: list[Certain]) -> list[Check]:
    """The comparison rows of an early abort: one failing row per certain breach, its shape read from every
    point of the metric compared before the stop (``Certain.points``)."""
    rows = []
    for c in certain:
        shape = _shape(c)
        rows.append(Check(metric=c.metric, step=c.step, baseline=c.baseline, current=c.current, error=c.error,
                          threshold=c.threshold, operator=c.operator,
                          method=c.method, passed=False, first_breach_step=c.step, source="live",
                          shape=shape.kind if shape else c.shape, shape_text=shape.text if shape else _shape_text(c),
                          breach_steps=shape.steps if shape else str(c.step),
                          note=f"early abort ({c.rule}): {c.text}"))
    return rows


def _shape(c: Certain) -> Shape | None:
    """The breach's shape from the compared points the live check recorded (None without them: a record
    written before they were kept)."""
    points = [ComparedPoint(int(step), _number(current), _number(error), bool(breached))
              for step, current, error, breached in c.points]
    if not points or not any(p.breached for p in points):
        return None
    shape = classify(points, c.threshold)
    if shape is not None and shape.first_step == points[-1].step and shape.kind in ("gradual", "isolated"):
        # The run was stopped at this point: no later point can show whether the breach stays.
        shape = Shape(shape.kind, shape.first_step, shape.text + " (the run was stopped there)", shape.steps)
    return shape


def _shape_text(c: Certain) -> str:
    if c.shape == "from-start":
        return f"outside its bound from the first compared step {c.step} (the run was stopped there)"
    if c.shape == "non-finite":
        return f"NaN/Infinity at step {c.step}"
    return ""


def aborted_result(suite: str, abort: dict, rules: EngineRules) -> SuiteResult:
    """The suite's FAIL after an early abort, from what the live check recorded (``abort.json``).

    One failing row per certain breach (its rule and the step where it became certain in the note),
    the class those rows call for, "aborted at step N of M" first among the findings, and the
    runbook's next steps for the breached metrics.
    """
    certain = [Certain(**{k: _number(v) if k in _FLOATS else tuple(map(tuple, v)) if k == "points" else v
                          for k, v in c.items() if k in _FIELDS}) for c in abort["certain"]]
    checks = aborted_checks(certain)
    failure_class = failure_class_of(checks, FAIL)
    rules_named = "; ".join(f"{c.metric} ({c.rule}, step {c.step})" for c in certain)
    abnormal = [f"Aborted at step {abort['step']} of {abort['expected_steps']}: the final verdict could no longer "
                f"be PASS ({rules_named}); the job was stopped early (early_abort on). "
                + "; ".join(c.text for c in certain)]
    abnormal += [f"Live warning: {w}" for w in abort.get("warnings") or []]
    result = SuiteResult(suite=suite, verdict=FAIL, failure_class=failure_class, checks=checks, abnormal=abnormal,
                         details={"early_abort": {k: v for k, v in abort.items() if k != "certain"}})
    result.next_steps = suggest(rules, checks, FAIL, failure_class)
    return result


def full_aborted_checks(certain: list[Check], compared: list[Check], judged: Sequence[str], stop: int,
                        expected: int | None) -> list[Check]:
    """An aborted run's whole table (issue 35): every judged metric, not only the breaches that stopped it.

    ``certain``: the live check's rows (:func:`aborted_checks`); ``compared``: the engine's comparison of the
    partial tracker (every judged row it could form); ``judged``: the metrics the suite judges; ``stop``: the
    step the run was stopped at. A compared row past the stop, or one with no value because the run never got
    there, reads "not reached" (judged neither way); a certain row replaces the compared row of its metric and
    step; a judged metric with no row at all gets one "not reached" row. Rows keep the compared table's order."""
    out: list[Check] = []
    taken = {(c.metric, c.step) for c in certain}
    placed: set[tuple[str, int | None]] = set()
    for row in compared:
        key = (row.metric, row.step)
        if key in taken:
            if key not in placed:
                out += [k for k in certain if (k.metric, k.step) == key]
                placed.add(key)
            continue
        if row.step is not None and row.step > stop or row.missing:
            row = replace(row, passed=None, missing=False, current=None if row.step is not None and row.step > stop
                          else row.current, error=None, first_breach_step=None, shape=None, shape_text="",
                          breach_steps="", note=f"not reached: the run was stopped at step {stop}"
                          + (f" of {expected}" if expected else ""))
        out.append(row)
    out += [k for k in certain if (k.metric, k.step) not in placed]
    have = {c.metric for c in out}
    for metric in judged:
        if metric not in have:
            out.append(Check(metric=metric, step=None, baseline=None, current=None, error=None, threshold=None,
                             operator="", method="", passed=None, source="live",
                             note=f"not reached: the run was stopped at step {stop}"
                             + (f" of {expected}" if expected else "") + " before this metric was judged"))
    return out


_FLOATS = {"baseline", "current", "error", "threshold"}
_FIELDS = {f.name for f in fields(Certain)}


def _number(value: object) -> float | None:
    """A float back from its JSON form ("nan"/"inf" were written as text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def partial_plot(suite: str, certain: list[dict], current: Path, baseline: Path | None,
                 reference: Any, out: Path) -> Path | None:
    """PNG of the breached metrics' partial curves (what the run wrote before it was stopped)."""
    metrics = list(dict.fromkeys(c["metric"] for c in certain if c["metric"] != "e2e wall time"))
    if not metrics or not current.is_file():
        return None
    cur = read_tracker(current, metrics)
    base = read_tracker(baseline, metrics) if baseline is not None and baseline.is_file() else None
    panels = []
    for metric in metrics:
        def series(t: Tracker) -> list[tuple[float, float]]:
            if metric.startswith(EVAL_PREFIX):
                return [(s, v[metric].value) for s, v in sorted(t.evals.items()) if metric in v]
            return [(p.step, p.value) for p in t.series(metric)]

        reference_curve, label = (series(base), "baseline") if base is not None else ([], "baseline")
        if not reference_curve and reference is not None and reference(metric):
            reference_curve, label = reference(metric), "golden"
        mine = [c for c in certain if c["metric"] == metric]
        failing = [(c["step"], _number(c.get("current"))) for c in mine
                   if c.get("step") is not None and _number(c.get("current")) is not None]
        panels.append(Panel(metric, reference_curve, series(cur), mine[0].get("method", "absolute"),
                            _number(mine[0].get("threshold")), failing, baseline_label=label,
                            note=f"stopped at step {cur.steps}"))
    return plot_panels(out / f"{suite}_metrics.png", f"{suite.upper()}: FAIL, aborted early (partial curves)", panels)


def confirming(certain: Iterable[Any], confirms: Mapping[str, Sequence[float]]) -> bool:
    """Whether a repeat's certain FAIL (checks with ``metric``, ``method``, ``current``, ``baseline``) decides
    its verification's outcome: ``confirms`` (``core.confirm.stop_early``) maps a metric to [sign (0: either
    way), the smallest |diff| that decides]; the diff is the confirmation's (relative methods: divided by
    |baseline|). Only such a FAIL may stop a repeat early; any other lets it measure its other points."""
    for c in certain:
        metric, method, current, baseline = (c.get(k) if isinstance(c, Mapping) else getattr(c, k, None)
                                             for k in ("metric", "method", "current", "baseline"))
        if metric not in confirms:
            continue
        sign, least = int(confirms[metric][0]), float(confirms[metric][1])
        try:
            diff = float(current) - float(baseline)
            if method == "relative":
                diff = diff / abs(float(baseline)) if float(baseline) else math.inf
        except (TypeError, ValueError):
            # A percentile's certain FAIL names no one value: weigh its worst breaching step (its error is the
            # confirmation's |diff|), either way; with nothing to weigh, the certain FAIL itself decides.
            worst = _worst_breach(c)
            if worst is None or least <= 0 or sign != 0 or worst >= least:
                return True
            continue
        if (sign == 0 or (diff > 0) - (diff < 0) == sign) and abs(diff) >= least:
            return True
    return False


def _worst_breach(certain: Any) -> float | None:
    """The largest finite error among a certain FAIL's breaching compared points (None: none)."""
    points = certain.get("points") if isinstance(certain, Mapping) else getattr(certain, "points", ())
    errors = [float(p[2]) for p in points or () if p[3] and p[2] is not None and math.isfinite(float(p[2]))]
    return max(errors) if errors else None


def describe_hit(hit: dict[str, Any]) -> str:
    """A log rule's match in words: what it means, the line (and how often it was seen), and the fix."""
    seen = int(hit.get("seen") or 1)
    text = f"{hit['means']} (log line{f' seen {seen} times' if seen > 1 else ''}: {hit['line']})"
    return text + (f". Fix: {hit['fix']}" if hit.get("fix") else "")


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    """NaN/Infinity as text: event payloads and XCom are JSON."""
    return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


class LiveWatch:
    """The live check of one training as the trigger runs it: tracker bytes and log lines in,
    progress lines and the verdict out.

    ``config`` (JSON, built in the worker by the training operator): ``suite``, ``work_dir`` and
    ``tracker_glob`` (remote, expanded), ``expected_steps``, ``early_abort`` (end the job once its FAIL
    is certain; off: only say where it would have), ``log_rules`` (the spec's: pattern, means, when),
    ``check`` (a serialised :class:`LiveCheck`, or None when nothing can be judged live) and ``note``
    (why there is no check). A config without ``expected_steps`` comes from a trigger deferred by an
    earlier version of rl-verify: the job is only watched (the final comparison still judges it).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.suite = str(config.get("suite") or "?")
        self.work_dir, self.tracker_glob = config.get("work_dir", ""), config.get("tracker_glob", "")
        self.expected_steps = int(config.get("expected_steps") or 0)
        self.early_abort = bool(config.get("early_abort", True))
        self.log_rules = [dict(rule) for rule in config.get("log_rules") or []]
        self._check_config = config.get("check")
        self._note = config.get("note") or "nothing to compare against"
        self.checker: LiveCheck | None = None
        self.feed: TrackerFeed | None = None
        self._fed = bytearray()  # the tracker's bytes taken so far: a poll that read several steps replays them
        self.tracker_path = ""
        self.offset = 0
        self.reported_steps = -1
        self.doomed: LiveResult | None = None   # the first look with a certain FAIL
        self.last: LiveResult | None = None
        self.started = False
        #: Switched off (an error of its own, or a config of an earlier version): the job is only watched.
        self.off = "expected_steps" not in config
        self.stopped = False  # the job was killed by the live check
        self.log_hits: list[dict[str, Any]] = []
        self._open_block: dict[str, Any] | None = None  # an ``exit`` rule's match awaiting its block's end
        self._seen: dict[str, int] = {}  # lines seen per rule (``count``)
        #: A repeat's watch (``core.confirm.stop_early``): only a certain FAIL that decides the verification's
        #: outcome stops it (``confirming``); None: a first run, stopped by any certain FAIL.
        self.confirms: dict[str, list[float]] | None = (
            {str(k): [float(x) for x in v] for k, v in config["confirms"].items()} if config.get("confirms") else None)
        self._passed_over = False  # a repeat's certain FAIL of other metrics was logged once

    def start(self) -> str:
        """Rebuild the engine's check; say in one line what the watch will do."""
        self.started = True
        if self._check_config is None:
            return f"Live check off for {self.suite}: {self._note} (the final comparison reports it)"
        try:
            self.checker = rebuild(self._check_config)
        except Exception as err:  # bad data must never stop a training: the final comparison judges it
            return f"Live check off for {self.suite}: {err}"
        mode = "aborts the run as soon as its FAIL is certain" if self.early_abort else \
            "reports where it would abort (early_abort off)"
        return f"Live check on for {self.suite}: every new step is checked with the final rules; {mode}"

    def log_hit(self, text: str) -> dict[str, Any] | None:
        """Scan new log lines: record every log-rule match; return the first ``seen`` rule whose line has
        now been seen ``count`` times (a wait printing one line forever: its count-th line).

        A match of an ``exit`` rule that quotes its block's end (``quote``: ``block-end``, a traceback)
        waits for that end (the first later line that is not indented, possibly in a later chunk) and
        quotes it; ``exit`` rules are acted on at exit only. Each hit carries the rule's ``fix``.
        """
        first = None
        for line in text.splitlines():
            if self._open_block is not None and line.strip() and not line[0].isspace():
                self._open_block["line"] = line.strip()[:500]
                self._open_block = None
            rule = next((r for r in self.log_rules if re.search(r["pattern"], line)), None)
            if rule is None:
                continue
            when = rule.get("when", "seen")
            self._seen[rule["pattern"]] = self._seen.get(rule["pattern"], 0) + 1
            seen, count = self._seen[rule["pattern"]], int(rule.get("count") or 1)
            if when == "seen" and seen < count:
                continue  # not yet: a line a healthy start prints a few times
            hit = {"pattern": rule["pattern"], "means": rule["means"], "line": line.strip()[:500], "when": when,
                   "fix": rule.get("fix") or "", "seen": seen, "stop": rule.get("stop") or "early_abort",
                   "retry": rule.get("retry")}
            if when == "seen" and seen > count:
                continue  # acted on at its count-th line already
            self.log_hits.append(hit)
            if when == "exit" and rule.get("quote") == "block-end":
                self._open_block = hit
            elif when == "seen" and first is None:
                first = hit
        return first

    def ended_short(self) -> dict[str, Any] | None:
        """At the job's exit: the first log-rule match when the tracker came up short of its steps.

        None when no rule matched, the run has all its steps, or its step count is unknown (no
        live check: fetch counts the steps).
        """
        if not self.log_hits:
            return None
        steps = self.feed.tracker.steps if self.feed is not None else 0 if self.checker is not None else None
        if steps is None or steps >= self.expected_steps:
            return None
        return {**self.log_hits[0], "at_exit": True, "steps": steps}

    def take(self, output: bytes) -> bool:
        """Feed one ``tracker_poll`` output; True when the tracker has more bytes to read now."""
        head, _, chunk = output.partition(b"\n")
        fields = head.decode(errors="replace").split()
        if len(fields) != 3 or fields[0] == "-":
            return False
        path, start, size = fields[0], int(fields[1]), int(fields[2])
        if path != self.tracker_path or self.feed is None:
            self.tracker_path, self.offset, self.feed = path, 0, TrackerFeed(path)
            self._fed = bytearray()
            if start != 0:
                return True  # a new file: read it from its start
        self.feed.feed(chunk)
        self._fed += chunk
        self.offset = start + len(chunk)
        return self.offset < size

    def report(self, elapsed_s: float | None) -> list[str]:
        """Lines for the task log when a new step came in (and the verdict once it is certain)."""
        if self.feed is None or self.checker is None:
            return []
        tracker = self.feed.tracker
        if tracker.steps == self.reported_steps:
            return []
        checked, self.reported_steps = self.reported_steps, tracker.steps
        result = self.checker.check(tracker, elapsed_s)
        self.last = result
        lines = [progress(result, self.expected_steps, elapsed_s)]
        if result.certain and self.doomed is None and self.confirms is not None \
                and not confirming(result.certain, self.confirms):
            if not self._passed_over:
                self._passed_over = True
                lines.append("This repeat's own FAIL is certain at step %d of %d (%s), but not by enough to decide the "
                             "confirmation: it goes on, to measure its other points" % (
                                 result.steps, self.expected_steps,
                                 ", ".join(sorted({c.metric for c in result.certain}))))
        elif result.certain and self.doomed is None:
            self.doomed = doomed = self._first_deciding(checked, result.steps) or result
            read = "" if doomed.steps == result.steps else \
                f" (this look read steps {max(checked, 0) + 1}-{result.steps} at once)"
            lines.append("FAIL is certain at step %d of %d%s: %s" % (
                doomed.steps, self.expected_steps, read, "; ".join(f"[{c.rule}] {c.text}" for c in doomed.certain)))
            if not self.early_abort:
                lines.append("early_abort is off: the run goes on to its end; it would have been aborted here")
        return lines

    def _decides(self, result: LiveResult) -> bool:
        return result.doomed and (self.confirms is None or confirming(result.certain, self.confirms))

    def _first_deciding(self, checked: int, steps: int) -> LiveResult | None:
        """When one look read several new steps: the tracker as it stood once each of them was complete (every
        line before the next step's row), checked in order; the first that decides, else None. The step the
        FAIL became certain at is then the training's, not the poll's (a busy triggerer or short steps read
        many at once). Checked without the wall time: that one is the look's own."""
        if steps - max(checked, 0) < 2 or self.checker is None:
            return None
        lines = bytes(self._fed).splitlines(keepends=True)
        count, rows_after = TrackerFeed(self.tracker_path), []
        for line in lines:
            count.feed(line)
            rows_after.append(count.tracker.steps)
        replay = TrackerFeed(self.tracker_path)
        for i, line in enumerate(lines):
            rows = replay.tracker.steps
            if rows_after[i] > rows and checked < rows < steps:
                earlier = self.checker.check(replay.tracker, None)
                if self._decides(earlier):
                    return earlier
            replay.feed(line)
        return None

    def abort_message(self) -> str:
        assert self.doomed is not None
        return f"aborted at step {self.doomed.steps} of {self.expected_steps}: " + "; ".join(
            c.text for c in self.doomed.certain)

    def summary(self) -> dict[str, Any]:
        """What the live check saw, for the operator (JSON)."""
        out: dict[str, Any] = {"expected_steps": self.expected_steps, "early_abort": self.early_abort,
                               "checked": self.checker is not None}
        if self.doomed is not None:
            out.update(step=self.doomed.steps, certain=[_json_safe(asdict(c)) for c in self.doomed.certain])
        if self.last is not None:
            out["warnings"] = [f"{s.metric}: {s.text}" for s in self.last.status if s.state == "warning"]
        if self.log_hits:
            out["log_rule"] = self.log_hits[0]
        return out
