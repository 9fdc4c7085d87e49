"""A bisection's probes: the operator that runs them (``BisectOperator``, the ``bisect`` task) and what it does to
each probe: trigger it as a verification run on a free node, read its outcome from the record store, stop
it when it can no longer change the answer.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from rl_verify import settings
from rl_verify.core import bisect
from rl_verify.core.names import run_key, short_sha
from rl_verify.core.report.words import attempt_lines
from rl_verify.orchestration import airflow_api, bisection, links
from rl_verify.orchestration.probe_trigger import ProbesTrigger
from rl_verify.orchestration.verification_history import suite_outcome
from rl_verify.store import record

log = logging.getLogger(__name__)


# --- probes ----------------------------------------------------------------------------------------

def probe_run_id(dag_run_id: str, sha: str, attempt: int) -> str:
    """The id of a probe run: the bisection's key, the commit and the how-manieth probe of it."""
    return f"{settings.PROBE_RUN_PREFIX}{run_key(dag_run_id)[:60]}__{short_sha(sha)}__{attempt}"


def probe_conf(plan: Mapping[str, Any], sha: str, conn: str) -> dict[str, Any]:
    """The verification params of one probe: the commit, the bisection's suites on one node, early abort on, and
    the plan's ``lane`` (``core.lane.for_bisection``): ``auto`` (the bitwise lane first) when the regression shows
    within the lane's steps, else ``full``."""
    return {"commit": sha, "suites": list(plan["suites"]), "node": conn, "early_abort": True,
            "repeats": plan["repeats"], "bisection": plan["dag_run_id"], "lane": plan.get("lane", "full")}


def trigger_probe(plan: Mapping[str, Any], sha: str, conn: str, attempt: int, why: str) -> str:
    run_id = probe_run_id(plan["dag_run_id"], sha, attempt)
    airflow_api.trigger_run(settings.AIRFLOW_API_CONN_ID, settings.PROBE_DAG_ID, run_id, probe_conf(plan, sha, conn),
                            note=f"probe of bisection {plan['dag_run_id']}: {why}")
    return run_id


def probe_reading(run_id: str, plan: Mapping[str, Any]) -> tuple[bisect.Reading, dict[str, Any]]:
    """A finished probe's reading and its evidence row (outcome, runs, the followed metric's error at its first
    breach, the report link). No report: the commit could not be checked out or launched (SKIP)."""
    report = record.get_json(run_id, "report.json") or {}
    rows = [r for r in report.get("suites") or [] if r.get("suite") in plan["suites"]]
    row: dict[str, Any] = {"run_id": run_id, "report": links.report_path(settings.PROBE_DAG_ID, run_id),
                           "outcome": "SKIP", "runs": 0, "metric": None, "error": None, "threshold": None,
                           "step": None, "why": ""}
    if not rows:
        row["why"] = "no report: the commit could not be checked out or its run ended before comparing"
        return bisect.Reading.SKIP, row
    if report.get("verdict") in ("REJECTED", "NOT APPROVED"):
        raise AirflowFailException(f"probe {run_id} was {report['verdict']}: its pre-approval by this bisection was "
                                   "refused (see the probe's approve log)")
    readings = []
    for r in rows:
        outcome = suite_outcome(r)
        readings.append(bisect.reading(outcome, r.get("failure_class") if outcome == "FAIL" else None))
    reading = (bisect.Reading.BAD if bisect.Reading.BAD in readings else
               bisect.Reading.SKIP if bisect.Reading.SKIP in readings else
               bisect.Reading.UNSURE if bisect.Reading.UNSURE in readings else bisect.Reading.GOOD)
    first = rows[0]
    row.update(outcome="; ".join(f"{r['suite']} {suite_outcome(r)}" for r in rows),
               runs=sum(len((r.get("outcome") or {}).get("runs") or [0]) for r in rows),
               why=(first.get("outcome") or {}).get("reason") or first.get("verdict") or "")
    row.update(followed_error(rows, plan.get("metrics") or []))
    row["aborted_at"] = aborted_at(rows)
    row["attempts"] = infra_attempts(rows)
    return reading, row


def infra_attempts(rows: list[Mapping[str, Any]]) -> list[str]:
    """Every attempt after an infrastructure failure in a probe's report (issue 55), one line each, named by suite:
    what the evidence table shows beside the probe's outcome (empty: every training ran at its first attempt)."""
    return [f"{r['suite']}: {line}" for r in rows for line in attempt_lines((r.get("outcome") or {}).get("runs") or [])]


def aborted_at(rows: list[Mapping[str, Any]]) -> dict[str, str]:
    """Per suite of a probe's report whose first run the live check stopped early: "step N of M"."""
    out = {}
    for r in rows:
        abort = (r.get("details") or {}).get("early_abort") or {}
        if abort.get("applied") and abort.get("step") is not None:
            out[str(r["suite"])] = f"step {abort['step']} of {abort.get('expected_steps', '?')}"
    return out


def followed_error(rows: list[Mapping[str, Any]], metrics: list[str]) -> dict[str, Any]:
    """The followed metric (the first of ``metrics`` a suite checks, else the suite's first breached one) and its
    error at its first breach (else its largest error as a fraction of its threshold)."""
    checks = [c for r in rows for c in r.get("checks") or [] if isinstance(c.get("error"), (int, float))]
    wanted = [m for m in metrics if any(c["metric"] == m for c in checks)]
    breached = [c["metric"] for c in checks if c.get("passed") is False]
    metric = (wanted or breached or [c["metric"] for c in checks] or [None])[0]
    mine = [c for c in checks if c["metric"] == metric]
    if not mine:
        return {"metric": None, "error": None, "threshold": None, "step": None, "fraction": None}
    failing = [c for c in mine if c.get("passed") is False]
    pick = failing[0] if failing else max(mine, key=lambda c: abs(c["error"]) / (c.get("threshold") or 1))
    threshold = pick.get("threshold")
    return {"metric": metric, "error": pick["error"], "threshold": threshold, "step": pick.get("step"),
            "fraction": abs(pick["error"]) / threshold if threshold else None}


def stop_probe(run_id: str, bisection_run_id: str, why: str) -> list[str]:
    """Stop a probe whose outcome can no longer change the answer: its repeats are cancelled (a marker its
    repeat gates read) and its unfinished trainings marked failed, so that its cleanup stops its jobs."""
    record.put_json(run_id, settings.STOPPED_BY_BISECTION_FILE, {"bisection": bisection_run_id, "why": why})
    stopped = []
    states = airflow_api.task_states(settings.AIRFLOW_API_CONN_ID, settings.PROBE_DAG_ID, run_id)
    for task_id, state in states.items():
        if settings.suite_of_training_task(task_id) and state in ("none", "scheduled", "queued", "running",
                                                                  "deferred", "up_for_retry", "restarting"):
            try:
                airflow_api.fail_task(settings.AIRFLOW_API_CONN_ID, settings.PROBE_DAG_ID, run_id, task_id,
                                      f"stopped by bisection {bisection_run_id}: {why}")
            except Exception as err:  # stopping early only saves GPU time: the probe's answer is already known
                log.warning("Could not stop %s of probe %s (%s: %s): it trains to its end; its repeats are "
                            "cancelled", task_id, run_id, type(err).__name__, str(err).splitlines()[0][:200])
                continue
            stopped.append(task_id)
    return stopped


def stopped_probe_evidence(run_id: str) -> dict[str, Any]:
    """What a probe stopped by its bisection has produced so far: its report link and training runs when it
    reached its report, else none (the row then says "stopped: no report"); always its run page."""
    report = record.get_json(run_id, "report.json") or {}
    rows = report.get("suites") or []
    return {"report": links.report_path(settings.PROBE_DAG_ID, run_id) if rows else None,
            "runs": sum(len((r.get("outcome") or {}).get("runs") or [0]) for r in rows),
            "run_page": links.run_page_path(settings.PROBE_DAG_ID, run_id)}


def free_slots(plan: Mapping[str, Any], busy: list[str]) -> list[str]:
    """One entry per probe that may start now: each node of the plan as often as it has slots (an SSH node one, a
    Slurm target as many jobs as its partition runs at once: ``plan["slots"]``) less the probes it runs."""
    slots = plan.get("slots") or {}
    return [n for n in plan["nodes"] for _ in range(max(0, int(slots.get(n, 1)) - busy.count(n)))]


class BisectOperator(BaseOperator):
    """Runs a bisection's probes: asks the planner (``core.bisect.plan``) what to probe, triggers each probe as
    a verification run on a free node, defers until one ends (``ProbesTrigger``), reads its outcome from the
    record store, stops probes that can no longer change the answer, and repeats until the answer is known.

    Its state (probes, readings, evidence rows) travels in the deferral's kwargs: a resumed task picks up where
    it was. Returns the result summary (answer, link); the DAG's next task emits the culprit's asset event.
    """

    template_fields = ("plan",)

    def __init__(self, *, plan: Any, poll_interval: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.poll_interval = poll_interval

    def execute(self, context: Any) -> Any:
        state = {"started": time.time(), "running": {}, "stopping": {}, "readings": {}, "rows": [], "count": {}}
        return self._step(context, state, {})

    def resume(self, context: Any, event: dict[str, Any] | None = None, state: dict[str, Any] | None = None) -> Any:
        return self._step(context, state or {}, (event or {}).get("ended") or {})

    def _step(self, context: Any, state: dict[str, Any], ended: dict[str, str]) -> Any:
        plan: dict[str, Any] = self.plan
        shas = [c["sha"] for c in plan["commits"]]
        run_id = context["run_id"]
        for probe_id in ended:
            if probe_id in state["stopping"]:
                self.log.info("Stopped probe %s has ended: its node is free", probe_id)
                state["stopping"].pop(probe_id)
                for row in state["rows"]:
                    if row["run_id"] == probe_id and row.get("stopped"):
                        row.update(stopped_probe_evidence(probe_id))
                continue
            probe = state["running"].pop(probe_id, None)
            if probe is None:
                continue
            reading, row = probe_reading(probe_id, plan)
            state["readings"].setdefault(probe["sha"], []).append(reading.value)
            state["rows"].append({**row, "sha": probe["sha"], "node": probe["node"], "reading": reading.value})
            self.log.info("Probe %s of %s on %s: %s (%s)", probe_id, short_sha(probe["sha"]), probe["node"],
                          reading.value, row["outcome"])
        recorded = {c: bisect.Reading(r) for c, r in (plan.get("recorded") or {}).items()}
        free = free_slots(plan, [p["node"] for p in [*state["running"].values(), *state["stopping"].values()]])
        running = {p["sha"]: probe_id for probe_id, p in state["running"].items()}
        step = bisect.plan(shas, {c: [bisect.Reading(r) for r in rs] for c, rs in state["readings"].items()},
                           list(running), len(free), record=recorded, max_commits=len(shas))
        for sha in step.stop:
            probe_id = running[sha]
            why = step.why.get(sha, "its outcome can no longer change the answer")
            stopped = stop_probe(probe_id, run_id, why)
            self.log.info("Stopping probe %s of %s (%s): %s", probe_id, short_sha(sha), why, ", ".join(stopped) or
                          "no training left to stop")
            probe = state["running"].pop(probe_id)
            state["stopping"][probe_id] = probe
            state["rows"].append({"run_id": probe_id, "sha": sha, "node": probe["node"], "outcome": "stopped",
                                  "stopped": why, "reading": None, **stopped_probe_evidence(probe_id)})
        if step.done:
            answer = bisection.answer_summary(plan, step.answer)
            summary = bisection.finish(plan, state["rows"], answer, time.time() - state["started"], run_id)
            if answer["kind"] != bisect.CULPRIT:
                # No culprit and no range of commits: the bisection did not answer what it was started for.
                raise AirflowFailException(f"the bisection ended without a culprit ({answer['kind']}): "
                                           f"{answer['reason']}. Its page: {summary['link']}")
            return summary
        for sha, conn in zip(step.probe, free):
            attempt = state["count"].get(sha, 0)
            state["count"][sha] = attempt + 1
            why = step.why.get(sha, "")
            probe_id = trigger_probe(plan, sha, conn, attempt, why)
            state["running"][probe_id] = {"sha": sha, "node": conn}
            self.log.info("Probe %s: %s on %s (%s)", probe_id, short_sha(sha), conn, why)
        watched = [*state["running"], *state["stopping"]]
        if not watched:
            raise AirflowFailException(f"the bisection cannot go on: nothing to probe and no probe running "
                                       f"({len(free)} free slot(s) on {len(plan['nodes'])} node(s))")
        self.defer(trigger=ProbesTrigger(dag_id=settings.PROBE_DAG_ID, run_ids=watched,
                                         poll_interval=self.poll_interval or settings.BISECT_POLL_S),
                   method_name="resume", kwargs={"state": state})
