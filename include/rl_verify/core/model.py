"""Result types of the verification engine (``Check``, ``SuiteResult``).

Both are plain dataclasses, JSON-serialisable through ``to_dict()`` and rebuilt by ``from_dict()``.

Strict JSON decision: tracker values can be NaN or +-Infinity (a diverged run). JSON has no such
numbers, so ``to_dict()`` writes them as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``
(the spelling Python's own ``json`` module uses for its non-standard literals) and ``from_dict()``
turns those strings back into floats. Every other number stays a JSON number, so the output of
``json.dumps(result.to_dict(), allow_nan=False)`` is always valid strict JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

PASS = "PASS"
FAIL = "FAIL"
#: The outcome of a suite the path-aware skip decided without training (issue 33): its diff since a verified
#: PASS touches no path that can affect it.
UNCHANGED = "PASS (unchanged)"
#: The outcome of a suite the bitwise-first lane decided (issue 33): its first k deterministic steps are the same
#: bits as a trusted reference of a verified commit, on the same environment.
BITWISE = "PASS (bitwise)"
#: The PASSes without a full training: a shortcut says what it covers and what it does not.
SHORTCUTS = (UNCHANGED, BITWISE)
# Failure classes: each one names a different next step (see ``failure_class_of``).
ACCURACY, PERFORMANCE, INFRASTRUCTURE = "accuracy", "performance", "infrastructure"
FAILURE_CLASSES = (ACCURACY, PERFORMANCE, INFRASTRUCTURE)


def infrastructure_class(cause: str) -> str:
    """The failure class of an infrastructure failure with a named cause the scheduler gave (issue 45:
    ``infrastructure (preempted)``, ``infrastructure (time limit)``...): its own class in the report, and still
    an infrastructure failure wherever one is treated as such (``is_infrastructure``)."""
    return f"{INFRASTRUCTURE} ({cause})"


def is_infrastructure(failure_class: str | None) -> bool:
    """Whether ``failure_class`` is an infrastructure failure, with or without a named cause."""
    return bool(failure_class) and (failure_class == INFRASTRUCTURE
                                    or str(failure_class).startswith(INFRASTRUCTURE + " ("))
# Checks that measure machine speed, not accuracy: alone, they make a FAIL a performance failure.
TIMING_METRICS = ("time/step", "e2e wall time")
STEP_COUNT = "RL steps"
SOURCES = ("checker", "golden", "final-eval", "wall-time")
NON_FINITE_STRINGS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
INFERENCE_PREFIX = "Inference:"


def encode_number(value: Any) -> Any:
    """Return ``value`` unchanged unless it is a non-finite float, which becomes its string name."""
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return "NaN"
        return "Infinity" if value > 0 else "-Infinity"
    return value


def decode_number(value: Any) -> Any:
    """Inverse of ``encode_number``: the strings "NaN"/"Infinity"/"-Infinity" become floats."""
    if isinstance(value, str) and value in NON_FINITE_STRINGS:
        return NON_FINITE_STRINGS[value]
    return value


def strict_json_value(value: Any) -> Any:
    """Recursively encode non-finite floats inside dicts/lists so ``allow_nan=False`` succeeds."""
    if isinstance(value, dict):
        return {str(k): strict_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json_value(v) for v in value]
    return encode_number(value)


def infrastructure_steps(reason: str) -> list[str]:
    """The next step of a failure that is not an accuracy signal (runbook section 3 has none: no metric
    was judged)."""
    return [
        "Inference: infrastructure failure, not an accuracy signal "
        f"({reason}). Check the training/launch logs and the node (GPUs, Ray, teacher servers) "
        "and re-run; no metric was judged."
    ]


@dataclass
class Check:
    """One comparison of one metric (at one step, or aggregated over steps when ``step`` is None).

    ``passed`` is True/False, or None when the row is reference only or not calibrated.
    ``source`` says who decided: "checker" (the checkout's check_rl_result), "golden" (OPD golden
    table), "final-eval" (GRPO final eval/accuracy) or "wall-time".
    ``first_breach_step`` is the first step whose own error breaks the bound (for aggregates: the
    first per-step error above the threshold); it feeds the next-step rules.
    ``missing`` marks a row that could not be measured (no current value where one was expected):
    it fails the verdict as an infrastructure problem, never as a breach.
    ``shape``/``shape_text`` describe how a failing metric left its bound (``rl_verify.core.shapes``);
    ``breach_steps`` lists the steps where it was outside, as ranges ("1-45").
    Every step is the tracker's own step number (eval-only row = 0, RL steps from 1).
    """

    metric: str
    step: int | None
    baseline: float | None
    current: float | None
    error: float | None
    threshold: float | None
    operator: str
    method: str
    passed: bool | None
    source: str
    note: str = ""
    first_breach_step: int | None = None
    missing: bool = False
    shape: str | None = None
    shape_text: str = ""
    breach_steps: str = ""

    @property
    def breached(self) -> bool:
        """True when a measured value is outside its threshold (a missing value is not a breach)."""
        return self.passed is False and not self.missing

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats as strings, see module docstring)."""
        return {k: encode_number(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Check":
        """Rebuild a Check from ``to_dict()`` output (unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: decode_number(v) for k, v in data.items() if k in names})


@dataclass
class SuiteResult:
    """The verdict of one suite (grpo or opd) with everything the report needs.

    ``verdict`` is "PASS" or "FAIL"; ``failure_class`` is None (PASS), "accuracy", "performance" or
    "infrastructure" (see ``failure_class_of``). ``next_steps`` strings each start with "Inference:".
    ``trackers`` maps a
    role ("baseline", "current", "golden") to the path the numbers came from.
    """

    suite: str
    verdict: str
    failure_class: str | None = None
    checks: list[Check] = field(default_factory=list)
    abnormal: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    trackers: dict[str, str] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    checker: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def infrastructure(cls, suite: str, reason: str, **details: Any) -> "SuiteResult":
        """A FAIL that is not an accuracy signal (node, launch, missing tracker, crashed run...)."""
        return cls(
            suite=suite,
            verdict=FAIL,
            failure_class="infrastructure",
            abnormal=[f"Infrastructure failure: {reason}"],
            next_steps=infrastructure_steps(reason),
            details={k: v for k, v in details.items()},
        )

    @classmethod
    def unchanged(cls, suite: str, verified: dict[str, Any], files: list[str]) -> "SuiteResult":
        """A PASS without a run: the diff since the verified PASS ``verified`` (``sha``, ``run_id``, ``report``)
        changes only ``files``, none of which can affect the suite. What it covers: every path the suite's spec
        says can move its numbers; what it does not: anything outside the checkout (node, drivers, data)."""
        return cls(suite=suite, verdict=PASS,
                   details={"unchanged": {**verified, "files": list(files)}})

    @classmethod
    def bitwise(cls, suite: str, evidence: dict[str, Any]) -> "SuiteResult":
        """A PASS from the bitwise-first lane: ``evidence`` (``reference``: the verified commit, its run and
        report; ``steps``, ``environment``, ``key``) says which k steps were the same bits. What it covers:
        those steps on that environment; what it does not: the steps after k."""
        return cls(suite=suite, verdict=PASS, details={"bitwise": dict(evidence)})

    @property
    def passed(self) -> bool:
        """True when the verdict is PASS."""
        return self.verdict == PASS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (strict JSON: non-finite floats as strings)."""
        return {
            "suite": self.suite,
            "verdict": self.verdict,
            "failure_class": self.failure_class,
            "checks": [c.to_dict() for c in self.checks],
            "abnormal": list(self.abnormal),
            "next_steps": list(self.next_steps),
            "trackers": dict(self.trackers),
            "plots": list(self.plots),
            "checker": strict_json_value(self.checker) if self.checker is not None else None,
            "details": strict_json_value(self.details),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SuiteResult":
        """Rebuild from ``to_dict()`` output (as passed between DAG tasks through XCom)."""
        return cls(
            suite=data["suite"],
            verdict=data["verdict"],
            failure_class=data.get("failure_class"),
            checks=[Check.from_dict(c) for c in data.get("checks", [])],
            abnormal=list(data.get("abnormal", [])),
            next_steps=list(data.get("next_steps", [])),
            trackers=dict(data.get("trackers", {})),
            plots=list(data.get("plots", [])),
            checker=data.get("checker"),
            details=dict(data.get("details", {})),
        )


def failure_class_of(checks: list[Check], verdict: str) -> str | None:
    """The class of a FAIL, chosen by the next step it calls for (None for a PASS).

    ``infrastructure`` when the run did not produce what was to be measured (wrong step count,
    missing values); ``accuracy`` when a non-timing metric is outside its threshold; else
    ``performance`` when only time checks (``TIMING_METRICS``) breached. A wrong step count wins over
    everything (the checker judged nothing); an accuracy breach wins over missing values elsewhere
    (the measured breach is the stronger signal; the missing values stay in the abnormal findings).
    A non-finite step time is bad data, so ``infrastructure``. A FAIL with none of these (a checker
    that failed without naming a metric) is ``infrastructure``.
    """
    if verdict == PASS:
        return None
    failed = [c for c in checks if c.passed is False]
    if any(c.metric == STEP_COUNT for c in failed):
        return INFRASTRUCTURE
    if any(c.breached and c.metric not in TIMING_METRICS for c in failed):
        return ACCURACY
    if any(c.missing for c in failed):
        return INFRASTRUCTURE
    # A NaN step time is a logging defect, not a slow run.
    if any(c.breached for c in failed) and all(_finite(c.current) for c in failed if c.breached):
        return PERFORMANCE
    return INFRASTRUCTURE


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def missing_findings(checks: list[Check]) -> list[str]:
    """One abnormal finding per metric that could not be measured (never reported as a breach)."""
    out = []
    unmeasured = [c for c in checks if c.missing and c.passed is False]
    for metric in sorted({c.metric for c in unmeasured}):
        rows = [c for c in unmeasured if c.metric == metric]
        steps = [str(c.step) for c in rows if c.step is not None]
        out.append(f"Missing data: {metric} not measured" + (f" at step(s) {', '.join(steps)}" if steps else "")
                   + f" ({rows[0].note.removeprefix('missing: ')}); not a breach, the run is incomplete")
    return out


def verdict_of(checks: list[Check], extra_failure: bool = False) -> str:
    """FAIL when any check has ``passed is False`` (None never fails) or ``extra_failure``."""
    if extra_failure or any(c.passed is False for c in checks):
        return FAIL
    return PASS


def metric_error(baseline: float, current: float, method: str) -> float:
    """Error of ``current`` against ``baseline`` the way XTuner's checker methods define it.

    absolute: |cur - base|; relative: |cur - base| / |base|; slowdown: (cur - base) / |base|
    (positive = slower); value: cur itself. A zero baseline gives 0 when equal, else +inf.
    NaN in, NaN out (so the comparison fails).
    """
    if method == "absolute":
        return abs(current - baseline)
    if method == "relative":
        if baseline == 0:
            return 0.0 if current == 0 else math.inf
        return abs(current - baseline) / abs(baseline)
    if method == "slowdown":
        if baseline == 0:
            return 0.0 if current <= 0 else math.inf
        return (current - baseline) / abs(baseline)
    if method == "value":
        return current
    raise ValueError(f"unknown method {method!r} (expected absolute, relative, slowdown or value)")


def within(error: float | None, operator: str, threshold: float) -> bool:
    """True when ``error <operator> threshold`` holds; NaN/None never holds."""
    if error is None or math.isnan(error):
        return False
    if operator == "<":
        return error < threshold
    if operator == "<=":
        return error <= threshold
    raise ValueError(f"unknown operator {operator!r} (expected < or <=)")
