"""Airflow operators of rl-verify: the training job, the card approval and the bisection's probes.

Imported by the DAG file at parse time: the package modules it imports at module level hold no
heavy import (paramiko, pandas, matplotlib and the SSH provider are imported where they are used).
"""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator, Param, ParamsDict, Variable
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.sdk.timezone import utcnow

from rl_verify import engines, settings
from rl_verify.core import bisect
from rl_verify.core.names import repeat_seed, short_sha
from rl_verify.engines import engine_of, live_config, load_suite
from rl_verify.node import ops as node
from rl_verify.node import remote
from rl_verify.orchestration import airflow_api, bisection, notify, standing
from rl_verify.orchestration.contract import Card, Resolved
from rl_verify.orchestration.nodes import expanded_specs, node_settings, ssh_client, suite_node
from rl_verify.orchestration.triggers import ProbesTrigger, RLJobTrigger
from rl_verify.store import record
from rl_verify.store.baselines import RECORD_FOLDER
from rl_verify.suites.spec import SuiteSpec


class SuiteTrainingOperator(BaseOperator):
    """Run one suite's training on the node as a detached job, deferred while it trains.

    Owned on public interfaces only: the SSH provider's ``SSHHook`` (through
    ``orchestration.nodes.ssh_client``) to launch, :class:`rl_verify.orchestration.triggers.RLJobTrigger` to watch.
    A job's identity is (DAG run, suite), not the try: the job folder is
    ``<run_dir>/jobs/<suite>``. A retried, cleared or restarted task re-attaches to the live job
    (or takes the finished one as is) instead of launching a second training; a live job of
    another run makes the launch fail with "node busy" instead of launching.
    """

    ui_color = "#e8f0fe"
    #: ``resolved`` is ``resolve_commit``'s output (an XComArg in the DAG, a ``contract.Resolved`` when run).
    template_fields = ("resolved",)

    def __init__(self, *, suite: str, resolved: Any, job_timeout_s: int | None = None,
                 poll_interval_s: float = settings.JOB_POLL_INTERVAL_S,
                 max_reconnect_attempts: int = settings.SSH_RECONNECT_ATTEMPTS, record_as: str | None = None,
                 attempt: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        spec = load_suite(suite)  # package data file only: no network at parse time
        self.suite = suite
        self.resolved = resolved
        self.job_timeout_s = job_timeout_s or int(spec.wall_time_budget_s * settings.JOB_TIMEOUT_FACTOR)
        self.poll_interval_s = poll_interval_s
        self.max_reconnect_attempts = max_reconnect_attempts
        #: 0: the suite's run; k > 0: its k-th repeat (its own job, WORK_DIR, seed and record folder).
        self.attempt = attempt
        #: The job's name on the node and in the record (``settings.attempt_name``).
        self.job_name = settings.attempt_name(suite, attempt)
        #: The record folder of this training's findings (default: the job's; a calibration run's own).
        self.record_as = record_as or self.job_name
        self._launched: tuple[str, str, str] | None = None  # (node, job_dir, marker) of a launch by this process

    def execute(self, context: Any) -> None:
        with _worker_time(context):
            node, job_dir, marker, live = self._launch_or_attach(context)
        self.defer(trigger=RLJobTrigger(ssh_conn_id=node, job_dir=job_dir, job_marker=marker,
                                        poll_interval=self.poll_interval_s,
                                        max_reconnect_attempts=self.max_reconnect_attempts, live=live),
                   method_name="execute_complete", timeout=timedelta(seconds=self.job_timeout_s))

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        with _worker_time(context):
            live = event.get("live") or {}
            if live.get("certain") or live.get("log_rule"):
                _record_early_abort(context, self.record_as, live,
                                    applied=event.get("status") in ("aborted", "log_rule"))
            failure = _training_failure(self.suite, event)
            # The outcome is the first line of what the task logs after the job (issue 35), the job's lines after it.
            if failure is not None:
                self.log.error("%s", failure)
            elif event.get("status") == "aborted":
                self.log.warning("Stopped on purpose: %s %s. The training task succeeds (it did what the live check "
                                 "asked); the FAIL is %s's", self.suite, event.get("message"),
                                 settings.compare_task(self.suite, self.attempt))
            else:
                self.log.info("The %s job exited 0; the tracker decides whether it trained (%s)",
                              self.suite, settings.fetch_task(self.suite, self.attempt))
            for line in (event.get("log_chunk") or "").splitlines():
                self.log.info("[remote] %s", line)
            if failure is not None:
                raise failure

    def on_kill(self) -> None:
        # Killed while launching (the worker phase lasts seconds); a deferred job is the trigger's.
        if self._launched is None:
            return
        conn, job_dir, marker = self._launched
        try:
            with ssh_client(conn) as client:
                _, out, _ = _run(client, remote.kill_job_script(job_dir, marker))
            self.log.warning("Killed job %s: %s", marker, out.strip())
        except Exception as err:  # the DAG's cleanup task kills what is left
            self.log.warning("Could not kill job %s (%s); cleanup will", marker, err)

    def _launch_or_attach(self, context: Any) -> tuple[str, str, str, dict[str, Any]]:
        """Launch the suite's job, or find this run's; return (node, job dir, job marker, live check config)."""
        resolved: Resolved = self.resolved
        if self.suite not in resolved["suites"]:
            raise AirflowSkipException(f"suite {self.suite} not selected for this run")
        conn, folders = suite_node(resolved, self.suite)
        values = node_settings(conn)
        layout = remote.RunLayout(folders["run_dir"])
        spec = expanded_specs([self.suite], values, layout.worktree, resolved.get("baselines"))[0]
        work_dir, job_dir = layout.work_dir(self.job_name), layout.job_dir(self.job_name)
        marker = remote.job_marker(resolved["run_key"], self.job_name)

        with ssh_client(conn) as client:
            state = job_state(client, job_dir)
            if state == "absent":
                _refuse_if_busy(client, values[settings.REMOTE_RUNS_DIR_KEY], resolved["run_key"], self.job_name)
                shares = {k: values[k] for k in settings.SHARE_ROOT_VARS}
                command = remote.job_command(layout.worktree, work_dir, spec.script, spec.args, marker,
                                             settings.STALL_TIMEOUT_S, spec.tracker)
                seed = resolved.get("seed") if self.attempt == 0 else repeat_seed(resolved["run_key"], self.attempt)
                env = remote.job_environment(spec.env, work_dir, resolved["run_key"], self.job_name, shares, seed)
                self._launched = (conn, job_dir, marker)
                status, out, err = _run(client, remote.submit_job_script(job_dir, command, env))
                if status != 0:
                    raise RuntimeError(f"could not submit the {self.suite} job (exit {status}): {err.strip()}")
                self.log.info("Launched %s training: job %s, WORK_DIR %s", self.suite, job_dir, work_dir)
            elif state == "dead":
                # Started, no exit code, no process: killed (or the node rebooted). Waiting for it
                # would only run into the timeout; relaunching would be a second training.
                raise AirflowFailException(f"the {self.suite} job of this run ({job_dir}) died without an "
                                           "exit code (killed or node restarted); not launching a second training")
            else:
                self.log.info("Re-attaching to the %s job of this run (%s): no second training", state, job_dir)
            version = (resolved.get("baselines") or {}).get(self.suite) or {}
            live = _live_config(spec, client, version, work_dir, bool(resolved.get("early_abort", True)), context,
                                self._confirms(context))
        return conn, job_dir, marker, live

    def _confirms(self, context: Any) -> dict[str, list[float]] | None:
        """A repeat's: what its gate wrote of the certain FAIL that may stop it early (``STOP_EARLY_FILE``,
        ``core.confirm.stop_early``); None for a first run."""
        if self.attempt == 0:
            return None
        return record.get_json(context["run_id"], f"{self.job_name}/{settings.STOP_EARLY_FILE}",
                               dag_id=context["dag_run"].dag_id) or None


#: The most of a baseline tracker on the node's share read for the live check.
LIVE_BASELINE_MAX_BYTES = 64 << 20


def _live_config(spec: SuiteSpec, client: Any, version: dict[str, Any], work_dir: str, early_abort: bool,
                 context: Any, confirms: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """The live check's config for the trigger (``engines.live_config``), its baseline read here, in the
    worker: the run's baseline version (in the record) or the tracker on the node's share. A problem
    reading it only switches the live check off."""
    engine = engine_of(spec)
    where = engine.live_baseline(spec)
    data = baseline = None
    try:
        if engine.baseline_file in version.get("files", ()):
            blob = (record.run_store(context["run_id"], dag_id=context["dag_run"].dag_id) / spec.name / RECORD_FOLDER
                    / engine.baseline_file).read_bytes()
            if engine.baseline_is_data:
                with tempfile.TemporaryDirectory(prefix="rl-verify-live-") as tmp:
                    path = Path(tmp) / engine.baseline_file
                    path.write_bytes(blob)
                    data = engine.load_data(path)
            else:
                baseline, where = blob, f"baseline {version.get('label') or engine.baseline_file}"
        if baseline is None and where:
            status, out = node.read_file(client, where, LIVE_BASELINE_MAX_BYTES)
            baseline = out if status == 0 else None
    except Exception as err:  # bad data must never stop a training: the final comparison judges it
        return {**live_config(spec, work_dir, early_abort, None, None, where, confirms), "check": None,
                "note": str(err)}
    return live_config(spec, work_dir, early_abort, baseline, data, where, confirms)


def _training_failure(suite: str, event: dict[str, Any]) -> AirflowException | None:
    """The exception a watched job's end raises, or None when the training task succeeds: the job exited 0, or
    the live check stopped it on purpose because its FAIL was certain (fetch and compare judge what it wrote; the
    grid's red is then the comparison's, not a crash's). A log rule's stop (the run cannot finish), a stall or a
    non-zero exit fail the task; a watch that lost the job raises a retryable error (a retry re-attaches)."""
    status, exit_code = event.get("status"), event.get("exit_code")
    if status == "aborted":
        return None
    if status == "log_rule":
        return AirflowFailException(f"{suite} {event.get('message')}")
    if exit_code is None:
        return AirflowException(f"the {suite} job could not be watched to its end: {event.get('message')}")
    if exit_code == 124:
        stalled = [line for line in (event.get("log_chunk") or "").splitlines() if "STALLED at step" in line]
        return AirflowFailException(stalled[-1].replace("[rl-verify] ", "") if stalled else
                                    "the job was killed as stalled (exit 124)")
    if exit_code != 0:
        # The job ran to its end: a retry would only re-attach to the same exit code.
        return AirflowFailException(f"the {suite} job exited {exit_code} (see the [remote] lines below)")
    return None


def _record_early_abort(context: Any, folder: str, live: dict[str, Any], applied: bool) -> None:
    """Keep what the live check found in the run's record (``<folder>/abort.json``, the suite's folder) for
    fetch, compare, report."""
    record.put_json(context["run_id"], f"{folder}/abort.json", {**live, "applied": applied},
                    dag_id=context["dag_run"].dag_id)


@contextmanager
def _worker_time(context: Any) -> Iterator[None]:
    """Add the seconds this resume held a worker to the ``worker_seconds`` XCom (deferral excluded)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        ti = context["ti"]
        # This task instance's own value (a mapped task's other instances have theirs).
        held = float(ti.xcom_pull(task_ids=ti.task_id, key="worker_seconds", map_indexes=ti.map_index) or 0.0)
        ti.xcom_push(key="worker_seconds", value=round(held + time.monotonic() - t0, 3))


def _run(client: Any, script: str) -> tuple[int, str, str]:
    return node.run_script(client, script, timeout=60)


def job_state(client: Any, job_dir: str) -> str:
    """"absent", "running", "finished" or "dead" (started, no exit code, process gone)."""
    _, out, _ = _run(client, remote.job_state_script(job_dir))
    return out.strip() or "absent"


def _refuse_if_busy(client: Any, runs_root: str, key: str, suite: str) -> None:
    status, out, err = _run(client, remote.prerequisites_script([], runs_root, key, own_suite=suite))
    busy = node.parse_prerequisites(out).busy
    if busy:
        raise RuntimeError("; ".join(busy) + " — not launching a second training on this node")


class CardApprovalOperator(ApprovalOperator):
    """Approval of the experiment card: bounded in time, with verified standing approvals.

    * A person approving a *scheduled* run's card with "standing approval" ticked grants one: later
      scheduled runs with the same experiment fingerprint proceed without waiting, but only after
      the grant has been checked against Airflow's record of that response (``rl_verify.orchestration.standing``);
      any refusal is logged with its reasons and the run waits for a person.
    * A rejected scheduled card revokes a standing approval for that card.
    * Nobody answers within ``settings.approval_timeout`` (default: before the next scheduled run):
      the run ends NOT APPROVED (timed out), downstream skipped, the node untouched. Never approved
      by default: the request has no default options.
    """

    template_fields = (*ApprovalOperator.template_fields, "card")

    def __init__(self, *, card: Any, subject: str | None = None, standing_offered: bool = True,
                 **kwargs: Any) -> None:
        """``card``: ``experiment_card``'s output (an XComArg in the DAG, a ``contract.Card`` when run);
        ``standing_offered``: False for a card no standing approval may cover (a bisection's)."""
        approvers = settings.approvers()
        kwargs.pop("params", None)  # DAG-level params are not form fields of the approval
        self.card = card
        self.standing_offered = standing_offered
        super().__init__(
            subject=subject or
            "{{ params.commit }} ({{ params.suites | join(', ') }}): approve the RL accuracy experiment card",
            body=None,  # the card's Markdown, set once the card is known (execute)
            params={"standing_approval": Param(
                False, type=["boolean", "null"], title="Standing approval for nightly runs (optional)",
                description="Let later scheduled runs with this exact card proceed without waiting (expires "
                            "after RL_VERIFY_STANDING_APPROVAL_DAYS days). Offered on scheduled runs only.")},
            assigned_users=approvers or None,
            **kwargs,
        )

    def execute(self, context: Any) -> Any:
        approved = self._approve_or_wait(context)
        self._skip_unselected_suites(context)  # reached only when approved without waiting for a person
        return approved

    def _skip_unselected_suites(self, context: Any) -> None:
        """Skip every task of the suites this run does not test, at once: without it each such suite's training
        and confirmation would take a worker (and the node's pool slot) only to skip itself. Ends the task
        (Airflow's SkipMixin raises); a DAG without suite tasks (a bisection's card) skips nothing."""
        resolved = context["ti"].xcom_pull(task_ids="resolve_commit") or {}
        if not resolved.get("suites"):
            return
        unselected = [s for s in engines.known_suites() if s not in resolved["suites"]]
        names = {settings.confirm_task(s) for s in unselected} | {
            name for s in unselected for name in settings.attempt_tasks(s)}
        tasks = [t for t in context["task"].get_flat_relatives(upstream=False) if t.task_id in names]
        if tasks:
            self.log.info("Not tested in this run: %s (their tasks are skipped)", ", ".join(unselected))
            self.skip(ti=context["ti"], tasks=tasks)

    def _approve_or_wait(self, context: Any) -> Any:
        card: Card = self.card
        self.body = card["markdown"]
        params = context.get("params") or {}
        if params.get("bisection"):
            return self._preapproved(context, str(params["bisection"]))
        if context["dag_run"].run_type != "scheduled" or not self.standing_offered:
            self.params = ParamsDict({})  # a standing approval only ever applies to scheduled runs: not offered
        if context["dag_run"].run_type == "scheduled" and self.standing_offered:
            grant = self._verified_grant(card["fingerprint"])
            if grant is not None:
                self.log.info("Standing approval granted by %s at %s in run %s, verified against its approval "
                              "record: proceeding without waiting", grant.granted_by, grant.granted_at,
                              grant.dag_run_id)
                _push_decision(context, [self.APPROVE], grant.granted_by, grant.granted_at, standing=True,
                               granted_in=grant.dag_run_id)
                return {"chosen_options": [self.APPROVE], "standing_approval": json.loads(grant.to_json())}
        self.response_timeout = settings.approval_timeout()
        deadline = None
        if self.response_timeout:
            self.log.info("Waiting for a person for at most %s; unanswered, the run ends NOT APPROVED (timed out)",
                          self.response_timeout)
            deadline = (datetime.now(timezone.utc) + self.response_timeout).strftime("%Y-%m-%d %H:%M UTC")
        what = params.get("commit") or f"{params.get('good')}..{params.get('bad')}"
        notify.send(*notify.card_waiting(str(what), params.get("suites") or [], context["run_id"], deadline,
                                         context["dag_run"].dag_id))
        return super().execute(context)

    def _preapproved(self, context: Any, bisection_run_id: str) -> Any:
        """A bisection's probe: proceed on the bisection's one approval, verified against Airflow's record of
        it and the bisection's plan (the commit in its range, the suites its own); refused, fail at once."""
        resolved = context["ti"].xcom_pull(task_ids="resolve_commit") or {}
        reasons, approval = bisection.preapproval_refusals(bisection_run_id, str(resolved.get("sha") or ""),
                                                           list(resolved.get("suites") or []))
        if reasons:
            raise AirflowFailException(f"pre-approval by bisection {bisection_run_id} refused: " + "; ".join(reasons)
                                       + ". Nothing is launched; a person may trigger this commit without the "
                                       "'bisection' param to approve its own card")
        at = approval.responded_at.isoformat() if hasattr(approval.responded_at, "isoformat") else str(
            approval.responded_at)
        self.log.info("Pre-approved by %s at %s through bisection %s (verified against its approval record): "
                      "proceeding without waiting", approval.responded_by, at, bisection_run_id)
        _push_decision(context, [self.APPROVE], approval.responded_by, at, standing=False,
                       bisection=bisection_run_id)
        return {"chosen_options": [self.APPROVE], "bisection": bisection_run_id}

    def _verified_grant(self, fingerprint: str) -> Any:
        """The standing approval if every check passes, else None (every reason logged)."""
        raw = Variable.get(settings.STANDING_APPROVAL_VARIABLE, default=None)
        if not raw:
            self.log.info("No standing approval for card %s: waiting for a person", fingerprint)
            return None
        try:
            grant = standing.parse_grant(raw)
        except standing.MalformedGrant as err:
            self.log.warning("Standing approval refused: the Variable %s is malformed (%s): waiting for a person",
                             settings.STANDING_APPROVAL_VARIABLE, err)
            return None
        try:
            record = airflow_api.approval_record(settings.AIRFLOW_API_CONN_ID, grant.dag_id, grant.dag_run_id,
                                                 grant.task_id)
        except airflow_api.ApiUnavailable as err:
            self.log.warning("Standing approval refused: it cannot be verified (%s): waiting for a person", err)
            return None
        reasons = standing.refusals(grant, record, fingerprint, _now(), settings.standing_approval_max_age(),
                                    [a["name"] for a in settings.approvers()])
        if reasons:
            self.log.warning("Standing approval refused: %s: waiting for a person", "; ".join(reasons))
            return None
        return grant

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if event.get("error_type") == "timeout":
            return self._timed_out(context)
        # Recorded before the parent runs: on "Reject" it skips downstream by raising, so nothing
        # after it (not even the return value) would reach XCom.
        user = event.get("responded_by_user") or {}
        who = user.get("name") or user.get("id") or "unknown user"
        chosen = list(event.get("chosen_options") or [])
        at = event.get("responded_at")
        at = at.isoformat() if hasattr(at, "isoformat") else str(at)
        _push_decision(context, chosen, who, at, standing=False)
        scheduled = context["dag_run"].run_type == "scheduled"
        card: Card = self.card
        if self.REJECT in chosen:
            self.log.warning("Experiment card REJECTED by %s: nothing is launched", who)
            if scheduled:
                self._revoke(card["fingerprint"], who, at)
        else:
            self.log.info("Experiment card approved by %s", who)
            if self.standing_offered and (event.get("params_input") or {}).get("standing_approval"):
                self._grant(context, card["fingerprint"], who, at, scheduled)
        approved = super().execute_complete(context=context, event=event)
        self._skip_unselected_suites(context)
        return approved

    def _grant(self, context: Any, fingerprint: str, who: str, at: str, scheduled: bool) -> None:
        if not scheduled:
            self.log.warning("Standing approval NOT granted: only the approval of a scheduled run can grant one "
                             "(this is a %s run)", context["dag_run"].run_type)
            return
        grant = standing.Grant(fingerprint=fingerprint, dag_id=context["dag_run"].dag_id, dag_run_id=context["run_id"],
                      task_id=self.task_id, granted_by=who, granted_at=at)
        Variable.set(settings.STANDING_APPROVAL_VARIABLE, grant.to_json())
        self.log.info("Standing approval for card %s granted by %s (expires after %s days)", fingerprint, who,
                      settings.standing_approval_max_age().days)

    def _revoke(self, fingerprint: str, who: str, at: str) -> None:
        raw = Variable.get(settings.STANDING_APPROVAL_VARIABLE, default=None)
        try:
            grant = standing.parse_grant(raw) if raw else None
        except standing.MalformedGrant:
            grant = None
        if grant is not None and grant.fingerprint == fingerprint and not grant.revoked_by:
            Variable.set(settings.STANDING_APPROVAL_VARIABLE, grant.revoked(who, at).to_json())
            self.log.warning("Standing approval for card %s revoked by %s", fingerprint, who)

    def _timed_out(self, context: Any) -> Any:
        """Nobody answered in time: NOT APPROVED, downstream skipped, nothing launched."""
        context["ti"].xcom_push(key="decision", value={
            "chosen_options": [], "by": None, "at": _now().isoformat(timespec="seconds"), "standing": False,
            "timed_out": True, "timeout": str(self.response_timeout) if self.response_timeout else None})
        self.log.warning("NOT APPROVED (timed out): nobody answered the card in time; nothing is launched")
        tasks = [t for t in context["task"].get_direct_relatives(upstream=False) if not t.is_teardown]
        if tasks:
            self.skip(ti=context["ti"], tasks=tasks)
        return {"chosen_options": [], "timed_out": True}


def _now() -> Any:
    return utcnow()


def _push_decision(context: Any, chosen: list[str], who: str, at: str, standing: bool,
                   granted_in: str | None = None, bisection: str | None = None) -> None:
    context["ti"].xcom_push(key="decision", value={
        "chosen_options": chosen, "by": who, "at": at, "standing": standing, "granted_in": granted_in,
        "bisection": bisection})


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
                        row.update(bisection.stopped_probe_evidence(probe_id))
                continue
            probe = state["running"].pop(probe_id, None)
            if probe is None:
                continue
            reading, row = bisection.probe_reading(probe_id, plan)
            state["readings"].setdefault(probe["sha"], []).append(reading.value)
            state["rows"].append({**row, "sha": probe["sha"], "node": probe["node"], "reading": reading.value})
            self.log.info("Probe %s of %s on %s: %s (%s)", probe_id, short_sha(probe["sha"]), probe["node"],
                          reading.value, row["outcome"])
        recorded = {c: bisect.Reading(r) for c, r in (plan.get("recorded") or {}).items()}
        busy = {p["node"] for p in [*state["running"].values(), *state["stopping"].values()]}
        free = [n for n in plan["nodes"] if n not in busy]
        running = {p["sha"]: probe_id for probe_id, p in state["running"].items()}
        step = bisect.plan(shas, {c: [bisect.Reading(r) for r in rs] for c, rs in state["readings"].items()},
                           list(running), len(free), record=recorded, max_commits=len(shas))
        for sha in step.stop:
            probe_id = running[sha]
            why = step.why.get(sha, "its outcome can no longer change the answer")
            stopped = bisection.stop_probe(probe_id, run_id, why)
            self.log.info("Stopping probe %s of %s (%s): %s", probe_id, short_sha(sha), why, ", ".join(stopped) or
                          "no training left to stop")
            probe = state["running"].pop(probe_id)
            state["stopping"][probe_id] = probe
            state["rows"].append({"run_id": probe_id, "sha": sha, "node": probe["node"], "outcome": "stopped",
                                  "stopped": why, "reading": None, **bisection.stopped_probe_evidence(probe_id)})
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
            probe_id = bisection.trigger_probe(plan, sha, conn, attempt, why)
            state["running"][probe_id] = {"sha": sha, "node": conn}
            self.log.info("Probe %s: %s on %s (%s)", probe_id, short_sha(sha), conn, why)
        watched = [*state["running"], *state["stopping"]]
        if not watched:
            raise AirflowFailException(f"the bisection cannot go on: nothing to probe and no probe running "
                                       f"({len(free)} free node(s) of {len(plan['nodes'])})")
        self.defer(trigger=ProbesTrigger(dag_id=settings.PROBE_DAG_ID, run_ids=watched,
                                         poll_interval=self.poll_interval or settings.BISECT_POLL_S),
                   method_name="resume", kwargs={"state": state})
