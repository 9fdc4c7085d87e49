"""Airflow operators of rl-verify: the training job and the card approval.

Imported by the DAG file at parse time, so only Airflow itself is imported at module level.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator

from airflow.providers.ssh.operators.ssh_remote_job import SSHRemoteJobOperator
from airflow.providers.ssh.triggers.ssh_remote_job import SSHRemoteJobTrigger
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from rl_verify import settings


class SuiteTrainingOperator(SSHRemoteJobOperator):
    """Run one suite's training on the node as a detached, deferrable remote job.

    A job's identity is (DAG run, suite), not the try: the job folder is
    ``<run_dir>/jobs/<suite>``. A retried, cleared or restarted task re-attaches to the live job
    (or takes the finished one as is) instead of launching a second training; a live job of
    another run makes the launch fail with "node busy" instead of launching.
    """

    def __init__(self, *, suite: str, **kwargs: Any) -> None:
        from rl_verify.suite import load_suite

        spec = load_suite(suite)  # package data file only: no network at parse time
        kwargs.setdefault("timeout", int(spec.wall_time_budget_s * settings.JOB_TIMEOUT_FACTOR))
        super().__init__(
            ssh_conn_id="{{ params.node }}",
            command=f"(built at run time from the {suite} suite spec)",
            remote_os="posix",
            cleanup="never",  # the run's folder is kept for the record; cleanup/reaper remove it
            poll_interval=settings.JOB_POLL_INTERVAL_S,
            max_reconnect_attempts=settings.SSH_RECONNECT_ATTEMPTS,
            **kwargs,
        )
        self.suite = suite

    def execute(self, context: Any) -> None:
        with _worker_time(context):
            self._launch_or_attach(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        with _worker_time(context):
            self._job_marker = event.get("job_marker") or _marker_of(context, self.suite)
            if event.get("done") and event.get("exit_code") == 124:
                for line in (event.get("log_chunk") or "").splitlines():
                    self.log.info("[remote] %s", line)
                stalled = [line for line in (event.get("log_chunk") or "").splitlines() if "STALLED at step" in line]
                raise AirflowFailException(stalled[-1].replace("[rl-verify] ", "") if stalled else
                                           "the job was killed as stalled (exit 124)")
            try:
                super().execute_complete(context, event)
            except AirflowException as err:
                if event.get("done") and event.get("exit_code") not in (None, 0):
                    # The job ran to its end: a retry would only re-attach to the same exit code.
                    raise AirflowFailException(str(err)) from err
                raise

    def _launch_or_attach(self, context: Any) -> None:
        from airflow.providers.ssh.utils.remote_job import RemoteJobPaths, build_posix_wrapper_command
        from airflow.sdk.exceptions import AirflowSkipException

        from rl_verify import pipeline, remote

        ti = context["ti"]
        resolved = ti.xcom_pull(task_ids="resolve_commit")
        if self.suite not in resolved["suites"]:
            raise AirflowSkipException(f"suite {self.suite} not selected for this run")
        values = pipeline.node_settings(resolved["node"])
        layout = remote.RunLayout(resolved["run_dir"])
        spec = pipeline.expanded_specs([self.suite], values, layout.worktree)[0]
        work_dir = layout.work_dir(self.suite)
        paths = RemoteJobPaths(job_id=self.suite, remote_os="posix", base_dir=layout.jobs_dir)
        self._paths, self._detected_os, self._job_id = paths, "posix", self.suite
        self._job_marker = remote.job_marker(resolved["run_key"], self.suite)

        with pipeline.ssh_client(resolved["node"]) as client:
            state = job_state(client, paths.job_dir)
            if state == "absent":
                _refuse_if_busy(client, values["RL_VERIFY_REMOTE_RUNS_DIR"], resolved["run_key"], self.suite)
                shares = {k: values[k] for k in settings.SHARE_ROOT_VARS}
                command = remote.job_command(layout.worktree, work_dir, spec.script, spec.args,
                                             remote.job_marker(resolved["run_key"], self.suite),
                                             settings.STALL_TIMEOUT_S, spec.tracker)
                env = remote.job_environment(spec.env, work_dir, resolved["run_key"], self.suite, shares)
                status, out, err = _run(client, remote.submit_script(
                    build_posix_wrapper_command(command, paths, env), paths.job_dir))
                if status != 0:
                    raise RuntimeError(f"could not submit the {self.suite} job (exit {status}): {err.strip()}")
                self.log.info("Launched %s training: job %s, WORK_DIR %s", self.suite, paths.job_dir, work_dir)
            elif state == "dead":
                # Started, no exit code, no process: killed (or the node rebooted). Waiting for it
                # would only run into the timeout; relaunching would be a second training.
                raise AirflowFailException(f"the {self.suite} job of this run ({paths.job_dir}) died without an "
                                           "exit code (killed or node restarted); not launching a second training")
            else:
                self.log.info("Re-attaching to the %s job of this run (%s): no second training", state, paths.job_dir)

        ti.xcom_push(key="ssh_remote_job", value={
            "job_id": self.suite, "job_dir": paths.job_dir, "log_file": paths.log_file,
            "exit_code_file": paths.exit_code_file, "pid_file": paths.pid_file, "remote_os": "posix",
            "work_dir": work_dir})
        self.defer(trigger=self._trigger(paths.job_dir, remote.job_marker(resolved["run_key"], self.suite), 0),
                   method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout) if self.timeout else None)

    def _trigger(self, job_dir: str, marker: str, log_offset: int) -> "RLJobTrigger":
        return RLJobTrigger(
            ssh_conn_id=self.ssh_conn_id, remote_host=self.remote_host, job_id=self.suite,
            job_dir=job_dir, log_file=f"{job_dir}/stdout.log", exit_code_file=f"{job_dir}/exit_code",
            remote_os="posix", poll_interval=self.poll_interval, log_chunk_size=self.log_chunk_size,
            log_offset=log_offset, command_timeout=self.command_timeout,
            max_reconnect_attempts=self.max_reconnect_attempts, job_marker=marker)

    def defer(self, *, trigger: Any, method_name: str, kwargs: Any = None, timeout: Any = None) -> None:
        # The parent re-defers with its own trigger class while a job runs; keep ours (and its
        # on_kill) for the whole life of the job.
        if not isinstance(trigger, RLJobTrigger) and getattr(self, "_job_marker", None):
            trigger = self._trigger(trigger.job_dir, self._job_marker, trigger.log_offset)
        super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)


def _marker_of(context: Any, suite: str) -> str:
    from rl_verify import remote

    resolved = context["ti"].xcom_pull(task_ids="resolve_commit")
    return remote.job_marker(resolved["run_key"], suite)


class RLJobTrigger(SSHRemoteJobTrigger):
    """The SSH provider's remote-job trigger, plus a kill when a user acts on the task.

    ``on_kill`` runs only when a user marks the deferred task failed/success or clears it (not on
    a triggerer restart), and stops every process of the job — its group, the teacher servers
    that left it, Ray — on the node.
    """

    def __init__(self, *, job_marker: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_marker = job_marker

    def _reconnect_delay(self, attempt: int) -> float:
        # Capped at 10 s (the provider caps at 30-60 s): after an outage the monitor is back
        # within ~10 s of the node; the budget is the number of attempts (~10 s each past the 4th).
        import random

        base = min(2 ** (attempt - 1), 10)
        return base + random.uniform(0, 1)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", {**kwargs, "job_marker": self.job_marker}

    async def _read_log_chunk(self, conn: Any) -> tuple[str, int]:
        # The streamed offset is kept beside the job on the node, so a retried task or a restarted
        # triggerer resumes the remote log where the previous monitor stopped instead of at byte 0.
        import shlex

        marker = f"{shlex.quote(self.job_dir)}/stream_offset"
        if not getattr(self, "_resumed", False):
            self._resumed = True
            if self.log_offset == 0:
                _, out, _ = await self._run_command(conn, f"cat {marker} 2>/dev/null")
                if out.strip().isdigit() and int(out.strip()) > 0:
                    self.log_offset = int(out.strip())
                    self.log.info("Resuming the remote log at byte %d (streamed by an earlier monitor)",
                                  self.log_offset)
        chunk, offset = await super()._read_log_chunk(conn)
        if offset != self.log_offset:
            await self._run_command(conn, f"echo {int(offset)} > {marker}")
        return chunk, offset

    async def _task_state(self) -> str | None:
        """The task's state as the scheduler now sees it, or None when it cannot be read."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return None
        try:
            from asgiref.sync import sync_to_async
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

            states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id])
        except Exception as err:  # a state we cannot read must not kill a training
            self.log.warning("Could not read the task state: %s", err)
            return None
        by_task = states.get(ti.run_id, states)
        state = by_task.get(ti.task_id) if isinstance(by_task, dict) else None
        return str(getattr(state, "value", state)) if state is not None else None

    async def on_kill(self) -> None:
        import shlex

        from rl_verify import remote

        # Airflow calls this for "clear" as well as for "mark failed/success". A cleared task
        # comes back and re-attaches to the live job, so only a task that ended is killed here;
        # when the state cannot be read, the DAG's cleanup task (one_failed) does the kill.
        state = await self._task_state()
        if state not in ("failed", "success", "skipped", "upstream_failed", "removed"):
            self.log.info("Task state is %s (cleared or rescheduled): the job keeps running for re-attach", state)
            return

        script = remote.kill_job_script(self.job_dir, self.job_marker)
        conn = await self._connect()
        try:
            result = await self._run_command(conn, f"bash -c {shlex.quote(script)}")
            self.log.warning("Killed job %s on user request: %s", self.job_marker, result[1].strip())
        finally:
            await self._close(conn)


@contextmanager
def _worker_time(context: Any) -> Iterator[None]:
    """Add the seconds this resume held a worker to the ``worker_seconds`` XCom (deferral excluded)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        ti = context["ti"]
        held = float(ti.xcom_pull(task_ids=ti.task_id, key="worker_seconds") or 0.0)
        ti.xcom_push(key="worker_seconds", value=round(held + time.monotonic() - t0, 3))


def _run(client: Any, script: str) -> tuple[int, str, str]:
    from rl_verify.node import run_script

    return run_script(client, script, timeout=60)


def job_state(client: Any, job_dir: str) -> str:
    """"absent", "running", "finished" or "dead" (started, no exit code, process gone)."""
    import shlex

    status, out, _ = _run(client, f"""d={shlex.quote(job_dir)}
if [ -f "$d/exit_code" ]; then echo finished
elif [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then echo running
elif [ -d "$d" ]; then echo dead
else echo absent; fi""")
    return out.strip() or "absent"


def _refuse_if_busy(client: Any, runs_root: str, key: str, suite: str) -> None:
    from rl_verify import node, remote

    status, out, err = _run(client, remote.prerequisites_script([], runs_root, key, own_suite=suite))
    busy = node.parse_prerequisites(out).busy
    if busy:
        raise RuntimeError("; ".join(busy) + " — not launching a second training on this node")


class CardApprovalOperator(ApprovalOperator):
    """Approval of the experiment card: bounded in time, with verified standing approvals.

    * A person approving a *scheduled* run's card with "standing approval" ticked grants one: later
      scheduled runs with the same experiment fingerprint proceed without waiting, but only after
      the grant has been checked against Airflow's record of that response (``rl_verify.standing``);
      any refusal is logged with its reasons and the run waits for a person.
    * A rejected scheduled card revokes a standing approval for that card.
    * Nobody answers within ``settings.approval_timeout`` (default: before the next scheduled run):
      the run ends NOT APPROVED (timed out), downstream skipped, the node untouched. Never approved
      by default: the request has no default options.
    """

    def __init__(self, **kwargs: Any) -> None:
        approvers = settings.approvers()
        kwargs.pop("params", None)  # DAG-level params are not form fields of the approval
        super().__init__(
            subject="Approve the RL accuracy experiment card for {{ params.commit }}",
            body="{{ ti.xcom_pull(task_ids='experiment_card')['markdown'] }}",
            params={"standing_approval": Param(
                False, type="boolean", title="Standing approval for nightly runs",
                description="Scheduled runs only: let later scheduled runs with this exact card proceed without "
                            "waiting (expires after RL_VERIFY_STANDING_APPROVAL_DAYS days).")},
            assigned_users=approvers or None,
            **kwargs,
        )

    def execute(self, context: Any) -> Any:
        card = context["ti"].xcom_pull(task_ids="experiment_card")
        if context["dag_run"].run_type == "scheduled":
            grant = self._verified_grant(card["fingerprint"])
            if grant is not None:
                self.log.info("Standing approval granted by %s at %s in run %s, verified against its approval "
                              "record: proceeding without waiting", grant.granted_by, grant.granted_at,
                              grant.dag_run_id)
                _push_decision(context, [self.APPROVE], grant.granted_by, grant.granted_at, standing=True,
                               granted_in=grant.dag_run_id)
                return {"chosen_options": [self.APPROVE], "standing_approval": json.loads(grant.to_json())}
        self.response_timeout = settings.approval_timeout()
        if self.response_timeout:
            self.log.info("Waiting for a person for at most %s; unanswered, the run ends NOT APPROVED (timed out)",
                          self.response_timeout)
        return super().execute(context)

    def _verified_grant(self, fingerprint: str) -> Any:
        """The standing approval if every check passes, else None (every reason logged)."""
        from airflow.sdk import Variable

        from rl_verify import airflow_api, standing

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
        card = context["ti"].xcom_pull(task_ids="experiment_card")
        if self.REJECT in chosen:
            self.log.warning("Experiment card REJECTED by %s: nothing is launched", who)
            if scheduled:
                self._revoke(card["fingerprint"], who, at)
        else:
            self.log.info("Experiment card approved by %s", who)
            if (event.get("params_input") or {}).get("standing_approval"):
                self._grant(context, card["fingerprint"], who, at, scheduled)
        return super().execute_complete(context=context, event=event)

    def _grant(self, context: Any, fingerprint: str, who: str, at: str, scheduled: bool) -> None:
        from airflow.sdk import Variable

        from rl_verify.standing import Grant

        if not scheduled:
            self.log.warning("Standing approval NOT granted: only the approval of a scheduled run can grant one "
                             "(this is a %s run)", context["dag_run"].run_type)
            return
        grant = Grant(fingerprint=fingerprint, dag_id=context["dag_run"].dag_id, dag_run_id=context["run_id"],
                      task_id=self.task_id, granted_by=who, granted_at=at)
        Variable.set(settings.STANDING_APPROVAL_VARIABLE, grant.to_json())
        self.log.info("Standing approval for card %s granted by %s (expires after %s days)", fingerprint, who,
                      settings.standing_approval_max_age().days)

    def _revoke(self, fingerprint: str, who: str, at: str) -> None:
        from airflow.sdk import Variable

        from rl_verify import standing

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
    from airflow.sdk.timezone import utcnow

    return utcnow()


def _push_decision(context: Any, chosen: list[str], who: str, at: str, standing: bool,
                   granted_in: str | None = None) -> None:
    context["ti"].xcom_push(key="decision", value={
        "chosen_options": chosen, "by": who, "at": at, "standing": standing, "granted_in": granted_in})
