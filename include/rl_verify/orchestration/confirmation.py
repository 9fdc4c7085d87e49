"""The confirmation rule of the verification DAG (``core.confirm``) over a suite's runs: whether a repeat
trains (``repeat_<suite>-rK``, ``repeat_gate``), the suite's outcome over its runs (``confirm_<suite>``,
``confirm_outcome``), the spread it decides with (the baseline version's, learned from the repeats and the
spread history) and what the check can tell apart (``estimate``, cached in the record store).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from rl_verify import settings
from rl_verify.core import confirm, deviation
from rl_verify.core import spread as core_spread
from rl_verify.core.names import repeat_seed
from rl_verify.engines import engine_of, load_suite
from rl_verify.orchestration import bitwise_lane, spread_history
from rl_verify.orchestration.nodes import version_files
from rl_verify.orchestration.training_job import ATTEMPTS_FILE
from rl_verify.store import baselines, record
from rl_verify.suites.spec import SuiteSpec

log = logging.getLogger(__name__)

#: What the confirmation rule needs of one run (``core.confirm.RunPoints``), beside its result.json.
POINTS_FILE = settings.POINTS_FILE
#: A suite's outcome over its runs (``confirm_<suite>``), beside its first run's files.
OUTCOME_FILE = "outcome.json"


# --- confirming a FAIL noise could have produced (core.confirm) ----------------------------------

def _run_points(run_dir: Path, suite: str, attempt: int) -> confirm.RunPoints | None:
    data = record.read_json(run_dir / settings.attempt_name(suite, attempt) / POINTS_FILE)
    if data is None:
        return None
    return confirm.RunPoints(data["verdict"], data["failure_class"],
                             [confirm.Point(**p) for p in data.get("points") or []], dict(data.get("breached") or {}),
                             list(data.get("not_repeatable") or []), bool(data.get("complete", True)))


def _spread(run_dir: Path, spec: SuiteSpec) -> confirm.Spread | None:
    version = record.read_json(run_dir / spec.name / baselines.RECORD_FOLDER / baselines.VERSION_FILE)
    return engine_of(spec).spread(spec, version)


def _runs(run_dir: Path, suite: str) -> list[confirm.RunPoints]:
    """The suite's runs that reached their comparison, in order, up to the first that did not."""
    runs = []
    for attempt in range(settings.MAX_REPEATS + 1):
        points = _run_points(run_dir, suite, attempt)
        if points is None:
            break
        runs.append(points)
    return runs


def _learned_spread(run_dir: Path, spec: SuiteSpec, dag_run_id: str, repeats: list[confirm.RunPoints],
                    drift: bool) -> confirm.Spread | None:
    """The spread the rule decides with: the version's, learned from the repeats and the spread history."""
    resolved = record.read_json(run_dir / "commit.json") or {}
    return spread_history.learned(_spread(run_dir, spec), spec, resolved, dag_run_id, repeats,
                                  drift=drift)


def _decision(run_dir: Path, spec: SuiteSpec, budget: int, dag_run_id: str,
              drift: bool = False) -> tuple[confirm.Decision, int, confirm.Spread | None]:
    """The rule's decision over the suite's runs in the record so far, how many repeats it saw, and the spread
    it decided with (its drift alarm only with ``drift``: the outcome's, not each gate's)."""
    runs = _runs(run_dir, spec.name)
    if not runs:
        return confirm.Decision(confirm.FAIL, "the first run reached no comparison (see its tasks)"), 0, None
    first, repeats = runs[0], runs[1:]
    learned = _learned_spread(run_dir, spec, dag_run_id, repeats, drift)
    return confirm.decide(first, repeats, learned, confirm.Rule(budget=budget), budget), len(repeats), learned


def _confirm_parts(suite: str) -> list[str]:
    return ["commit.json", settings.STOPPED_BY_BISECTION_FILE, f"{suite}/{baselines.RECORD_FOLDER}"] + [
        f"{settings.attempt_name(suite, k)}/{name}" for k in range(settings.MAX_REPEATS + 1)
        for name in (POINTS_FILE, "result.json", "fetch.json", ATTEMPTS_FILE)]


def repeat_gate(suite: str, attempt: int, dag_run_id: str) -> bool:
    """Whether the suite's repeat ``attempt`` trains: the runs so far are all there, the budget allows it
    and the confirmation rule asks for another run. False skips the repeat's tasks."""
    with record.workspace(dag_run_id, parts=_confirm_parts(suite)) as run_dir:
        resolved = record.read_json(run_dir / "commit.json") or {}
        budget = int(resolved.get("repeats", 0))
        if suite not in (resolved.get("suites") or []) or attempt > budget:
            log.info("No repeat %d of %s: %s", attempt, suite, "not selected" if suite not in
                     (resolved.get("suites") or []) else f"the budget is {budget} extra run(s)")
            return False
        stopped = record.read_json(run_dir / settings.STOPPED_BY_BISECTION_FILE)
        if stopped:
            log.info("No repeat %d of %s: this probe was stopped by bisection %s (%s)", attempt, suite,
                     stopped.get("bisection"), stopped.get("why"))
            return False
        decision, seen, learned = _decision(run_dir, load_suite(suite), budget, dag_run_id)
        if seen != attempt - 1:
            log.info("No repeat %d of %s: run %d has no comparison (see its tasks)", attempt, suite, attempt)
            return False
        if decision.outcome is not None:
            log.info("No repeat %d of %s: %s (%s)", attempt, suite, decision.outcome, decision.reason)
            return False
        stop = confirm.stop_early(_run_points(run_dir, suite, 0), learned)
        record.write_json(run_dir / settings.attempt_name(suite, attempt) / settings.STOP_EARLY_FILE, stop)
        log.warning("%s: repeat %d of %d at the same commit with a new seed: %s. It stops early only on a "
                    "certain FAIL that decides the outcome: %s", suite, attempt, budget, decision.reason,
                    ", ".join(f"{m} {'either way' if s == 0 else 'up' if s > 0 else 'down'} by >= {d:.4g}"
                              for m, (s, d) in stop.items()) or "none")
        return True


def confirm_outcome(suite: str, dag_run_id: str) -> dict[str, Any]:
    """The suite's outcome over its runs (``outcome.json``): the rule's decision, every run's own runbook
    verdict, and what the check can and cannot tell apart (healthy breach chance per metric, the false
    alarm after confirmation, the smallest shift detected with 90% probability). A FAIL, reproduced or at
    once, fails the task (the grid shows which suite failed)."""
    with record.workspace(dag_run_id, parts=_confirm_parts(suite)) as run_dir:
        resolved = record.read_json(run_dir / "commit.json") or {}
        if suite not in (resolved.get("suites") or []):
            raise AirflowSkipException(f"suite {suite} not selected for this run")
        lane_outcome = bitwise_lane.decided(dag_run_id, suite)
        if lane_outcome:  # the training task wrote it; no run to confirm
            log.info("%s: %s: %s", suite, lane_outcome["outcome"], lane_outcome["reason"])
            return lane_outcome
        budget = int(resolved.get("repeats", 0))
        spec = load_suite(suite)  # read once: the decision, the estimates and the spread history share it
        decision, seen, learned = _decision(run_dir, spec, budget, dag_run_id, drift=True)
        if decision.outcome is None:  # a repeat the rule asked for did not reach its comparison
            decision = confirm.Decision(confirm.FAIL, f"repeat {seen + 1} did not reach its comparison (see its "
                                        "tasks): an infrastructure failure", decision.evidence, decision.rule)
        runs = [_run_summary(run_dir, resolved, suite, k) for k in range(seen + 1)]
        outcome = {"suite": suite, "outcome": decision.outcome, "reason": decision.reason, "rule": decision.rule,
                   "evidence": decision.evidence, "budget": budget, "runs": runs,
                   "spread": spread_history.describe(learned), "estimates": _estimates(run_dir, spec, budget)}
        record.write_json(run_dir / suite / OUTCOME_FILE, outcome)
        spread_history.keep(suite, dag_run_id, spread_history.spread_key(spec, resolved),
                            decision.outcome, _runs(run_dir, suite))
        for alarm in (learned.drift if learned is not None else ()):
            log.warning("%s: drift alarm: %s", suite, alarm)
    log.info("%s: %s: %s", suite, decision.outcome, decision.reason)
    if decision.outcome in confirm.FAILING:
        raise AirflowFailException(f"{suite} {decision.outcome}: {decision.reason}")
    return outcome


def _run_summary(run_dir: Path, resolved: Mapping[str, Any], suite: str, attempt: int) -> dict[str, Any]:
    name = settings.attempt_name(suite, attempt)
    result = record.read_json(run_dir / name / "result.json") or {}
    fetched = record.read_json(run_dir / name / "fetch.json") or {}
    return {"attempt": attempt, "folder": name, "verdict": result.get("verdict"),
            "failure_class": result.get("failure_class"),
            "seed": resolved.get("seed") if attempt == 0 else repeat_seed(resolved.get("run_key", ""), attempt),
            "steps": fetched.get("steps"), "expected_steps": fetched.get("expected_steps"),
            "record": f"{resolved.get('record', '')}/{name}",
            # its attempts after infrastructure failures (issue 55), when it had any
            "attempts": list(record.read_json(run_dir / name / ATTEMPTS_FILE) or [])}


def _estimates(run_dir: Path, spec: SuiteSpec, budget: int) -> dict[str, Any]:
    """What the check can tell apart for this suite and baseline version (normal, independent noise with
    the version's spread): per judged metric the chance that a healthy run breaches it and the smallest
    shift detected with 90% probability, and the whole procedure's false alarm and mean runs."""
    first, spread = _run_points(run_dir, spec.name, 0), _spread(run_dir, spec)
    if spread is None or first is None or not first.points:
        return {"spread": None, "note": "the baseline version records no run-to-run spread (or the engine judges "
                                        "no point comparisons): one repeat decides, no error rate is estimated"}
    # Every point a complete run is judged at against this version, not the points this run reached: a run
    # stopped early at step 5 would otherwise state lower error rates than a PASS on the same version (issue 35).
    layout = engine_of(spec).judged_layout(spec, version_files(run_dir / spec.name)) or confirm.Layout.of(first.points)
    # Seeded simulations of the same inputs give the same figures: computed once per baseline spread, judged
    # points and budget (tens of seconds on a busy core), kept in the record store for every later run.
    key = {"code": _confirm_code(), "thresholds": layout.thresholds, "steps": layout.steps, "sigma": spread.sigma,
           "df": spread.df, "runs": spread.runs, "source": spread.source, "budget": budget,
           "percentiles": dict(layout.percentiles), "points_per_metric": spread.points_per_metric}
    return record.cached_json("estimates", key, lambda: estimate(layout, spread, budget))


def estimate(layout: confirm.Layout, spread: confirm.Spread, budget: int) -> dict[str, Any]:
    """The figures of ``_estimates`` for one layout of judged points, spread and repeat budget (its source is
    part of their cache key: ``_confirm_code``)."""
    rule = confirm.Rule(budget=budget)
    healthy = confirm.simulate(layout, spread, rule, samples=1000, seed=1)
    metrics = {}
    for metric in layout.thresholds:
        if metric in spread.sigma:
            metrics[metric] = {
                "sigma": spread.sigma[metric],
                "threshold": layout.thresholds[metric],
                "healthy_breach": deviation.healthy_breach_rate(spread.sigma[metric], layout.thresholds[metric],
                                                              len(layout.steps[metric]), spread.runs,
                                                              layout.percentiles.get(metric)),
                "min_detectable_shift": confirm.minimum_detectable_shift(layout, spread, metric, rule, samples=300)}
    return {"spread": spread.source, "runs_in_baseline": spread.runs, "metrics": metrics,
            "single_run_false_alarm": 1 - healthy[confirm.PASS],
            "false_alarm": healthy[confirm.REPRODUCED] + healthy[confirm.FAIL],
            "inconclusive": healthy[confirm.INCONCLUSIVE], "mean_runs": healthy["runs"],
            "simulated": "1000 healthy verifications (normal, independent noise; the reference's own error drawn "
                         "once per verification)"}


@functools.cache
def _confirm_code() -> str:
    """The code's own version in the estimates' cache key: a change to the rule, the simulation
    (``core/confirm.py``), the pooling (``core/spread.py``) or what ``estimate`` asks of it (samples, seeds)
    computes them again."""
    import hashlib
    import inspect

    return hashlib.sha256(Path(confirm.__file__).read_bytes() + Path(core_spread.__file__).read_bytes()
                          + inspect.getsource(estimate).encode()).hexdigest()
