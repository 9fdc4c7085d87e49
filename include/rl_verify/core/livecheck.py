"""The live check's contract with the engines: what an engine's check of a growing tracker returns, and
the helpers the engines build their checks from.

A suite is judged while it trains by its engine's live check (a :class:`LiveCheck`, built in the
worker by ``Engine.live`` with the final comparison's own rule code and threshold data, and handed
to the triggerer in serialised form), which returns the breaches that make the final verdict FAIL
whatever the remaining steps bring (``Certain``, each with the kind of rule that made it certain: the
engine's ``every-step``, ``percentile``, ``eval-point``...; ``wall-time`` for any engine: the run has used
more than its wall-time budget) and a status per checked metric (within / breached / warning / waiting).

Anything less (a metric near its bound, breaching steps short of the count, a NaN at a step the
final comparison does not judge) is a warning: reported, never acted on. No Airflow import.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rl_verify.core.thresholds import Rule
from rl_verify.core.tracker import Tracker, TrackerFeed

#: A metric whose latest error has used this share of its threshold is reported as a warning.
NEAR_BOUND = 0.8
WITHIN, BREACHED, WARNING, WAITING = "within", "breached", "warning", "waiting"


@dataclass(frozen=True)
class Certain:
    """A breach no remaining step can undo: the suite's final verdict is FAIL."""

    metric: str
    step: int | None
    rule: str
    text: str
    baseline: float | None = None
    current: float | None = None
    error: float | None = None
    threshold: float | None = None
    operator: str = "<"
    method: str = "absolute"
    #: How the metric left its bound, as far as the steps so far show (``shapes.KINDS``), or None.
    shape: str | None = None
    #: Every point of the metric compared so far, in step order, as (step, current, error, breached): the
    #: report reads the breach's shape from them (a run stopped here has no later point to show it).
    points: tuple[tuple[int, float | None, float | None, bool], ...] = ()


@dataclass(frozen=True)
class Status:
    """Where one checked metric stands now."""

    metric: str
    state: str
    text: str


@dataclass
class LiveResult:
    """What one look at the growing tracker found."""

    steps: int
    certain: list[Certain] = field(default_factory=list)
    status: list[Status] = field(default_factory=list)

    @property
    def doomed(self) -> bool:
        return bool(self.certain)


class LiveCheck(ABC):
    """An engine's check of a growing tracker, serialisable: it is built in the worker and rebuilt in
    the triggerer from ``serialize()`` (its class path and JSON-ready constructor arguments)."""

    @abstractmethod
    def check(self, cur: Tracker, elapsed_s: float | None = None) -> LiveResult:
        """What the steps so far make certain, and where each checked metric stands."""

    @abstractmethod
    def kwargs(self) -> dict[str, Any]:
        """The JSON-ready constructor arguments that rebuild this check."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs()


#: Where the live checks a trigger may rebuild live: the engines.
LIVE_CHECK_MODULES = "rl_verify.engines."


def rebuild(serialized: tuple[str, dict[str, Any]] | list[Any]) -> LiveCheck:
    """The live check ``serialize()`` described: only a :class:`LiveCheck` of an engine module is built
    (the class path comes from the trigger's stored arguments)."""
    classpath, kwargs = serialized
    module, _, name = str(classpath).rpartition(".")
    if not module.startswith(LIVE_CHECK_MODULES):
        raise ValueError(f"not a live check of an engine: {classpath!r}")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, LiveCheck)):
        raise ValueError(f"not a live check: {classpath!r}")
    return cls(**kwargs)


def tracker_from_text(text: str, label: str) -> Tracker:
    """A tracker from its JSONL text (a baseline handed to a live check), read like a file."""
    feed = TrackerFeed(label)
    feed.feed(text.encode("utf-8") + (b"" if text.endswith("\n") else b"\n"))
    return feed.tracker


def compact_tracker(tracker: Tracker) -> str:
    """The step-summary and eval values of ``tracker`` as JSONL (one row per step): what a live check
    needs of a baseline, without the mini-batch rows a real tracker also holds."""
    import json

    rows: dict[int, dict[str, float]] = {}
    for step, values in tracker.evals.items():
        rows.setdefault(step, {}).update({k: p.value for k, p in values.items()})
    for row in tracker.rows:
        rows.setdefault(row.step, {}).update(row.values)
    return "".join(json.dumps({"step": step, **values}) + "\n" for step, values in sorted(rows.items()))


def near_bound(rule: Rule, error: float) -> bool:
    """True when ``error`` has used ``NEAR_BOUND`` of the threshold: a warning, never acted on."""
    return math.isfinite(error) and rule.threshold > 0 and error >= NEAR_BOUND * rule.threshold


def wall_time_breach(elapsed_s: float | None, budget_s: float) -> Certain | None:
    """The certain FAIL of a run that has used its whole wall-time budget, else None."""
    if elapsed_s is not None and elapsed_s >= budget_s:
        return Certain("e2e wall time", None, "wall-time",
                       f"e2e wall time {elapsed_s:.0f} s has reached the budget of < {budget_s:.0f} s",
                       None, float(elapsed_s), float(elapsed_s), float(budget_s), "<", "value")
    return None


def steps_text(steps: list[int]) -> str:
    """Steps as a short list (the first 8, then a count)."""
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f" (+{len(steps) - 8} more)" if len(steps) > 8 else "")


def compared_points(rows: Iterable[tuple[int, float | None, float | None, bool]]
                    ) -> tuple[tuple[int, float | None, float | None, bool], ...]:
    """``Certain.points`` from (step, current, error, breached) rows, JSON-safe (non-finite as text)."""
    return tuple((int(step), _safe(current), _safe(error), bool(breached)) for step, current, error, breached in rows)


def _safe(value: float | None) -> Any:
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else value
