"""The training operator of rl-verify (``SuiteTrainingOperator``, the ``run_<suite>`` tasks of the verification and
probe DAGs and the calibration's trainings): one suite's training on its node as a detached job, deferred while
it trains (the live check's config and what the job's end means for the task: ``orchestration.training_job``).

Imported by the DAG files at parse time: the package modules it imports at module level hold no
heavy import (paramiko, pandas, matplotlib and the SSH provider are imported where they are used). The card
approval is ``orchestration.approval``'s, the bisection's probes ``orchestration.probes``'.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from rl_verify import settings
from rl_verify.core import evidence, retry
from rl_verify.core.model import BITWISE
from rl_verify.core.names import repeat_seed, short_sha
from rl_verify.engines import load_suite
from rl_verify.node import launcher as launchers
from rl_verify.node import ops as node
from rl_verify.node import remote
from rl_verify.orchestration import airflow_api, bitwise_lane
from rl_verify.orchestration.contract import Resolved
from rl_verify.orchestration.nodes import expanded_spec, node_launcher, node_settings, ssh_client, suite_node
from rl_verify.orchestration.training_job import (ATTEMPTS_FILE, attempts, cause_of, current_job, live_check_config,
                                                  log_tail, record_early_abort, retry_policy, training_failure)
from rl_verify.orchestration.triggers import RLJobTrigger
from rl_verify.store import record, references
from rl_verify.suites.spec import SuiteSpec


class SuiteTrainingOperator(BaseOperator):
    """Run one suite's training on the node as a detached job, deferred while it trains.

    Owned on public interfaces only: the SSH provider's ``SSHHook`` (through
    ``orchestration.nodes.ssh_client``) to launch, :class:`rl_verify.orchestration.triggers.RLJobTrigger` to watch.
    A job's identity is (DAG run, suite, attempt), not the try: the job folder is ``<run_dir>/jobs/<suite>``, and
    ``<suite>-t<n>`` for the n-th attempt after infrastructure failures (issue 55: the retry policy
    ``core.retry`` decides in the task, after the failed attempt's processes are proven gone; every attempt is kept
    in the record's ``attempts.json``). A retried, cleared or restarted task re-attaches to the live job of the
    current attempt (or takes the finished one as is) instead of launching a second training; a live job of
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
        #: The suite's spec as read here, expanded for its node when the job launches (not read again).
        self.spec = spec
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
        #: (node, job_dir, marker, launcher config) of a launch by this process
        self._launched: tuple[str, str, str, dict[str, Any]] | None = None

    def execute(self, context: Any) -> None:
        with _worker_time(context):
            entry = self._lane_entry(context)
            if entry is not None and (entry["choice"] == "bitwise" or entry.get("read_lane")):
                read = record.get_json(context["run_id"], f"{self.suite}/{bitwise_lane.LANE_FILE}",
                                       dag_id=context["dag_run"].dag_id)
                if read is not None and read.get("identical") and entry["choice"] == "bitwise":
                    # an earlier try of this task decided it
                    self.log.info("%s: %s in an earlier try of this task; nothing to train", self.suite, BITWISE)
                    return
                reference = references.get(entry["key"]) or {}
                if read is None and reference.get("state") == references.TRUSTED:
                    self._defer_lane(context, "lane", reference.get("rows") or [], "lane_complete")
                elif read is None:
                    self.log.warning("The bitwise reference %s is gone: full verification", entry["key"])
            self._defer_full(context)

    def _defer_full(self, context: Any) -> None:
        try:
            node, job_dir, marker, live = self._launch_or_attach(context)
        except _TrainingLost as lost:  # an earlier try's job ended without an exit code: an attempt that failed
            self._failed_attempt(context, {}, AirflowFailException(str(lost)))
        self.defer(trigger=RLJobTrigger(ssh_conn_id=node, job_dir=job_dir, job_marker=marker,
                                        poll_interval=self.poll_interval_s,
                                        max_reconnect_attempts=self.max_reconnect_attempts, live=live,
                                        launcher=node_launcher(node)),
                   method_name="execute_complete", timeout=timedelta(seconds=self.job_timeout_s))

    # --- the bitwise lane (issue 33: orchestration.bitwise_lane) ---------------------------------------------

    def _lane_entry(self, context: Any, repeats_too: bool = False) -> dict[str, Any] | None:
        """The lane's decision for this suite (``check_prerequisites``' ``lanes``): only a verification's first
        run has one (a calibration run or a lane = full run: None), and its repeats when ``repeats_too`` (the one
        that runs to its end may make the reference the first run could not)."""
        if (self.attempt != 0 and not repeats_too) or self.spec.bitwise is None \
                or self.suite not in (self.resolved.get("suites") or []):
            return None
        prereq = context["ti"].xcom_pull(task_ids="check_prerequisites") or {}
        return (prereq.get("lanes") or {}).get(self.suite)

    def _defer_lane(self, context: Any, which: str, reference: list[dict[str, Any]] | None, method: str) -> None:
        """Launch (or re-attach to) one of the suite's deterministic jobs and defer to the trigger's lane watch:
        ``reference`` rows to compare with, or None to record the k steps (a reference's first self-check run)."""
        assert self.spec.bitwise is not None
        job = settings.lane_job(self.suite, which)
        # The reference's first self-check run records the lines the lane's k steps run (issue 44).
        lane_evidence = which == "ref1" and self.spec.evidence is not None
        launched = bitwise_lane.evidence_lane_spec(self.spec) if lane_evidence else bitwise_lane.lane_spec(self.spec)
        try:
            conn, job_dir, marker, work_dir, spec = self._start(
                context, job, launched, None, once=True, evidence=lane_evidence,
                stop_config=bitwise_lane.evidence_stop_config(self.spec) if lane_evidence else None)
        except _JobEnded as ended:  # an earlier try launched it and it ended unread: no shortcut, no reference
            self.log.warning("%s; going on without it", ended)
            if which == "lane":
                self._defer_full(context)
            return
        lane_watch = {"work_dir": work_dir, "tracker_glob": spec.tracker, "steps": self.spec.bitwise.steps,
                      "exclude": list(self.spec.bitwise.exclude), "reference": reference,
                      # stopping it while its processes save their executed lines would spoil the evidence
                      "ends_itself_s": settings.LANE_EVIDENCE_END_S if lane_evidence and self.spec.evidence
                      and (self.spec.evidence.stop_env or self.spec.evidence.stop_config) else 0}
        context["ti"].xcom_push(key=f"{which}_started", value=time.time())
        # The lane job is stopped by the trigger after k steps: its own timeout is the wall time of k steps, 3x.
        k_share = self.spec.bitwise.steps / max(1, self.spec.expected_steps)
        self.defer(trigger=RLJobTrigger(ssh_conn_id=conn, job_dir=job_dir, job_marker=marker,
                                        poll_interval=self.poll_interval_s,
                                        max_reconnect_attempts=self.max_reconnect_attempts, lane=lane_watch,
                                        launcher=node_launcher(conn)),
                   method_name=method, timeout=timedelta(seconds=max(600.0, 3 * k_share * self.job_timeout_s)))

    def _lane_reading(self, context: Any, which: str, event: dict[str, Any]) -> dict[str, Any]:
        """The lane's reading from the trigger's event; the job is stopped whatever ended the watch."""
        reading = dict(event.get("lane") or {})
        decided = event.get("status") == "lane" or event.get("exit_code") == 0
        reading["identical"] = bool(reading.get("identical")) and decided
        if event.get("status") != "lane":
            reading.setdefault("problem", event.get("message"))
            conn, folders = suite_node(self.resolved, self.suite)
            job_dir = remote.RunLayout(folders["run_dir"]).job_dir(settings.lane_job(self.suite, which))
            try:
                with ssh_client(conn) as client:
                    _run(client, launchers.launcher_for(node_launcher(conn)).stop(
                        job_dir, remote.job_marker(self.resolved["run_key"], settings.lane_job(self.suite, which))))
            except Exception as err:  # the run's cleanup stops what is left
                self.log.warning("Could not stop the %s job (%s); cleanup will", which, err)
        for line in (event.get("log_chunk") or "").splitlines()[-20:]:
            self.log.info("[remote] %s", line)
        return reading

    def lane_complete(self, context: Any, event: dict[str, Any]) -> None:
        """The lane's k steps were read: the same bits end the suite PASS (bitwise); anything else goes on to
        the full training under the same approval (the lane never FAILs a run)."""
        with _worker_time(context):
            entry = self._lane_entry(context) or {}
            reading = self._lane_reading(context, "lane", event)
            started = context["ti"].xcom_pull(task_ids=self.task_id, key="lane_started")
            found = bitwise_lane.evidence(entry, reading, time.time() - started if started else None)
            dag_id = context["dag_run"].dag_id
            decides = entry.get("choice") == "bitwise"  # else the record doubts this commit: bits read, no verdict
            try:
                record.put_json(context["run_id"], f"{self.suite}/{bitwise_lane.LANE_FILE}", found, dag_id=dag_id)
                if found["identical"] and decides:
                    bitwise_lane.pass_bitwise(context["run_id"], dag_id, self.suite, found)
            except Exception as err:  # the lane never fails a run: without its record, verify in full
                self.log.warning("%s: the lane's reading could not be kept (%s: %s): full verification", self.suite,
                                 type(err).__name__, err)
                self._defer_full(context)
            if not decides:
                self.log.warning("%s: the record doubts this commit (%s), so the lane decides nothing: its %d of %d "
                                 "steps are %s the reference of %s (a FAIL now marks that reference blind to it). "
                                 "The full verification runs now", self.suite, entry.get("why"), found["steps_seen"],
                                 found["steps"], "the same bits as" if found["identical"] else "not the same bits as",
                                 short_sha((entry.get("reference") or {}).get("sha") or ""))
                self._defer_full(context)
            if found["identical"]:
                self.log.info("%s: %s: %d of %d deterministic steps are the same bits as the reference of %s; no "
                              "full training (fetch, compare and the confirmation are skipped)", self.suite, BITWISE,
                              found["steps_seen"], found["steps"],
                              short_sha((entry.get("reference") or {}).get("sha") or ""))
                return
            why = (found["difference"] or {}).get("line") or reading.get("problem") or \
                f"only {found['steps_seen']} of {found['steps']} steps were read"
            self.log.warning("%s: the bitwise lane is no shortcut here: %s. The full verification runs now, under the "
                             "same approval", self.suite, why)
            self._defer_full(context)

    def reference_first(self, context: Any, event: dict[str, Any]) -> None:
        """A reference's first self-check run has recorded its k steps: the second runs against them."""
        with _worker_time(context):
            reading = self._lane_reading(context, "ref1", event)
            if self.spec.evidence is not None:
                self._read_evidence(context, settings.lane_job(self.suite, "ref1"), "lane")
            if not reading.get("identical"):
                self.log.warning("%s: no bitwise reference made: the first deterministic run did not reach its %s "
                                 "steps (%s)", self.suite, reading.get("steps"), reading.get("problem") or "short")
                return
            record.put_json(context["run_id"], f"{self.suite}/reference-run-1.json", reading,
                            dag_id=context["dag_run"].dag_id)
            self._defer_lane(context, "ref2", reading.get("rows") or [], "reference_second")

    def reference_second(self, context: Any, event: dict[str, Any]) -> None:
        """The second self-check run was compared with the first: the candidate reference (trusted or not
        reproducible) waits in the run's record for the suite's outcome (``bitwise_lane.promote``)."""
        with _worker_time(context):
            second = self._lane_reading(context, "ref2", event)
            first = record.get_json(context["run_id"], f"{self.suite}/reference-run-1.json",
                                    dag_id=context["dag_run"].dag_id) or {}
            made = bitwise_lane.candidate(first, second, self._lane_entry(context, repeats_too=True) or {},
                                          bitwise_lane.evidence_of(context["run_id"], self.spec,
                                                                   context["dag_run"].dag_id))
            record.put_json(context["run_id"], f"{self.suite}/{bitwise_lane.CANDIDATE_FILE}", made,
                            dag_id=context["dag_run"].dag_id)
            self.log.info("%s: bitwise reference candidate: %s (%s); kept if the suite PASSes", self.suite,
                          made["state"], made["self_check"])

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        with _worker_time(context):
            live = event.get("live") or {}
            if live.get("certain") or live.get("log_rule"):
                record_early_abort(context, self.record_as, live,
                                    applied=event.get("status") in ("aborted", "log_rule"))
            failure = training_failure(self.suite, event)
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
            if failure is not None:  # tried again in this task (it defers again), or raised naming every attempt
                self._failed_attempt(context, event, failure)
            self._note_deciding_attempt(context)
            entry = self._lane_entry(context, repeats_too=True)
            made = record.get_json(context["run_id"], f"{self.suite}/{bitwise_lane.LANE_FILE}",
                                   dag_id=context["dag_run"].dag_id) if entry else None
            if entry and event.get("exit_code") == 0 and entry.get("make_reference") and \
                    (entry["choice"] != "bitwise" or made is not None) and not self._reference_begun(context):
                # A repeat makes it when the first run did not run to its end (stopped early on a noise breach):
                # a PASS (not reproduced) keeps a reference as a first-run PASS does (issue 42).
                self.log.info("%s: making the bitwise reference of this environment after %s: 2 deterministic runs "
                              "of %d steps (kept if the suite PASSes)", self.suite,
                              "its run" if self.attempt == 0 else f"repeat {self.attempt}, the run that ran to its "
                              "end", entry["steps"])
                if self.spec.evidence is not None:
                    self._read_evidence(context, current_job(self.job_name, self._attempts(context)), "full")
                self._defer_lane(context, "ref1", None, "reference_first")

    # --- attempts after infrastructure failures (issue 55: core.retry) ----------------------------------------

    def _attempts(self, context: Any) -> list[dict[str, Any]]:
        return attempts(context["run_id"], self.record_as, context["dag_run"].dag_id)

    def _failed_attempt(self, context: Any, event: dict[str, Any], failure: AirflowException) -> None:
        """The current attempt failed (``failure``): keep it in the record. When the policy tries it again and the
        failed attempt's processes are proven gone, train the next attempt in a job folder of its own, in this same
        task (its node's pool slot kept; the task defers again); else raise ``failure``, naming every attempt."""
        run_id, dag_id = context["run_id"], context["dag_run"].dag_id
        tried = self._attempts(context)
        job = current_job(self.job_name, tried)
        earlier = [a for a in tried if a.get("retried")]
        conn, folders = suite_node(self.resolved, self.suite)
        cause = cause_of(self.spec, event, failure)
        go, decision = retry.decide(retry_policy(), earlier, cause, conn)
        entry: dict[str, Any] = {"attempt": len(earlier) + 1, "job": job, "node": conn, "kind": cause.kind,
                                 "why": cause.why, "decision": decision, "retried": False, "decided": True,
                                 "ended_at": time.time(), "log": log_tail(event)}
        if go:
            clean, said = self._stop_attempt(conn, folders["run_dir"], job)
            entry["stopped"] = said
            if not clean:
                go, entry["decision"] = False, ("not tried again: the failed attempt's processes could not be "
                                                "proven gone (" + "; ".join(said[-3:]) + ")")
        if go:
            abort = record.get_json(run_id, f"{self.record_as}/abort.json", dag_id=dag_id)
            if abort:  # the next attempt's fetch must not read this attempt's stop
                entry["abort"] = abort
                record.put_json(run_id, f"{self.record_as}/abort.json", {}, dag_id=dag_id)
            entry.update(retried=True, decided=False)
        # A task cleared after its last attempt failed for good ends that attempt again: one entry, not two.
        kept = [a for a in tried if a.get("retried") or a.get("job") != job]
        record.put_json(run_id, f"{self.record_as}/{ATTEMPTS_FILE}", [*kept, entry], dag_id=dag_id)
        lines = retry.describe([*kept, entry])
        self._note_attempts(context, lines)
        if not go:
            self.log.error("%s: %s", self.suite, " | ".join(lines))
            raise AirflowFailException(f"{failure} [" + " | ".join(lines) + "]") from None
        following = settings.retry_job(self.job_name, entry["attempt"] + 1)
        self.log.warning("%s: attempt %d failed as infrastructure (%s): %s. %s; the node is clean (%s). Attempt %d "
                         "trains as job %s in %d s", self.suite, entry["attempt"], cause.kind, cause.why, decision,
                         "; ".join(said[-2:]) or "nothing was left", entry["attempt"] + 1, following,
                         retry_policy().delay_s)
        time.sleep(retry_policy().delay_s)
        self._defer_full(context)

    def _note_attempts(self, context: Any, lines: list[str]) -> None:
        """The task's note in the grid: its attempts (issue 55). Best effort: the record and the log have them."""
        try:
            airflow_api.set_task_note(settings.AIRFLOW_API_CONN_ID, context["dag_run"].dag_id, context["run_id"],
                                      self.task_id, "Infrastructure attempts: " + " | ".join(lines))
        except Exception as err:
            self.log.warning("Could not set the task's note (%s: %s); the attempts are in this log and the record",
                             type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")

    def _stop_attempt(self, conn: str, run_dir: str, job: str) -> tuple[bool, list[str]]:
        """Stop a failed attempt's job and prove it gone before the next starts: (clean, what the stop said).
        A stop that cannot run, or that leaves a process (a ``LEFT`` line), is no proof."""
        job_dir = remote.RunLayout(run_dir).job_dir(job)
        try:
            with ssh_client(conn) as client:
                status, out, err = _run(client, launchers.launcher_for(node_launcher(conn)).stop(
                    job_dir, remote.job_marker(self.resolved["run_key"], job)))
        except Exception as err:  # unreachable: no proof, no second training
            return False, [f"the stop could not run: {type(err).__name__}: {str(err)[:200]}"]
        said = [line.strip() for line in out.splitlines() if line.strip()]
        if status != 0:
            return False, [*said, f"the stop exited {status}: {err.strip()[-200:]}"]
        return not any(line.startswith("LEFT") for line in said), said

    def _note_deciding_attempt(self, context: Any) -> None:
        """After failed attempts, the one whose job ended as the training's end (it trained) is kept last."""
        tried = self._attempts(context)
        if not tried or not tried[-1].get("retried"):
            return
        job, conn = current_job(self.job_name, tried), suite_node(self.resolved, self.suite)[0]
        every = [*tried, {"attempt": len(tried) + 1, "job": job, "node": conn, "kind": None, "why": "",
                          "retried": False, "decided": True, "ended_at": time.time()}]
        record.put_json(context["run_id"], f"{self.record_as}/{ATTEMPTS_FILE}", every, dag_id=context["dag_run"].dag_id)
        self._note_attempts(context, retry.describe(every))
        self.log.info("%s: attempt %d (job %s) ran after %d attempt(s) failed as infrastructure; its training decides "
                      "the suite", self.suite, len(tried) + 1, job, len(tried))

    def _reference_begun(self, context: Any) -> bool:
        """Whether an earlier training of this suite in this run already began its reference (a repeat's question:
        the first run's own reference, made when it ran to its end, is the one)."""
        if self.attempt == 0:
            return False
        dag_id = context["dag_run"].dag_id
        return any(record.get_json(context["run_id"], f"{self.suite}/{name}", dag_id=dag_id) is not None
                   for name in (bitwise_lane.CANDIDATE_FILE, "reference-run-1.json"))

    def on_kill(self) -> None:
        # Killed while launching (the worker phase lasts seconds); a deferred job is the trigger's.
        if self._launched is None:
            return
        conn, job_dir, marker, launcher = self._launched
        try:
            with ssh_client(conn) as client:
                _, out, _ = _run(client, launchers.launcher_for(launcher).stop(job_dir, marker))
            self.log.warning("Killed job %s: %s", marker, out.strip())
        except Exception as err:  # the DAG's cleanup task kills what is left
            self.log.warning("Could not kill job %s (%s); cleanup will", marker, err)

    def _launch_or_attach(self, context: Any) -> tuple[str, str, str, dict[str, Any]]:
        """Launch the suite's job, or find this run's; return (node, job dir, job marker, live check config)."""
        resolved: Resolved = self.resolved
        seed = resolved.get("seed") if self.attempt == 0 else repeat_seed(resolved["run_key"], self.attempt)
        # A retry trains the same run again (its seed too) in a job folder of its own.
        job = current_job(self.job_name, self._attempts(context))
        conn, job_dir, marker, work_dir, spec = self._start(context, job, self.spec, seed,
                                                            evidence=self._wants_evidence(context))
        version = (resolved.get("baselines") or {}).get(self.suite) or {}
        with ssh_client(conn) as client:
            live = live_check_config(spec, client, version, work_dir, bool(resolved.get("early_abort", True)), context,
                                self._confirms(context))
        return conn, job_dir, marker, live

    def _wants_evidence(self, context: Any) -> bool:
        """Whether this suite's full training records its executed lines (issue 44): when it may make the
        bitwise reference (its run, or a repeat when the first run did not make it) and the suite declares
        evidence."""
        entry = self._lane_entry(context, repeats_too=True)
        return bool(entry and entry.get("make_reference") and self.spec.evidence is not None
                    and not self._reference_begun(context))

    def _read_evidence(self, context: Any, job: str, which: str) -> None:
        """Keep what one job recorded of the checkout's executed lines in the run's record
        (``<suite>/evidence-<which>.json``); a reading that cannot be had is kept with its problem (no evidence)."""
        conn, folders = suite_node(self.resolved, self.suite)
        layout = remote.RunLayout(folders["run_dir"])
        python = self.spec.node.python or "python3"
        try:
            with ssh_client(conn) as client:
                reading = node.evidence_read(client, layout.evidence_dir(job), layout.worktree, python,
                                             evidence.COMPILED_BODY.pattern, layout.work_dir(job), self.spec.tracker,
                                             [(p.kind, p.runs) for p in self.spec.evidence.processes]
                                             if self.spec.evidence else ())
        except Exception as err:  # the evidence only ever saves a training: without it, today's rules
            reading = {"files": {}, "processes": 0, "problems": [f"the evidence could not be read: {err}"]}
        record.put_json(context["run_id"], f"{self.suite}/evidence-{which}.json", reading,
                        dag_id=context["dag_run"].dag_id)
        self.log.info("%s: executed-code evidence of the %s: %d process(es), %d file(s) of the checkout ran%s",
                      self.suite, which, reading.get("processes", 0), len(reading.get("files") or {}),
                      f"; problems: {'; '.join(reading['problems'])}" if reading.get("problems") else "")

    def _start(self, context: Any, job: str, spec: SuiteSpec, seed: int | None, once: bool = False,
               evidence: bool = False, stop_config: tuple[int, str, int] | None = None
               ) -> tuple[str, str, str, str, SuiteSpec]:
        """Launch job ``job`` of ``spec`` on the suite's node, or find this run's; return (node, job dir, job
        marker, WORK_DIR, the expanded spec). ``once`` (the lane's deterministic jobs): a job of this run that
        already ended raises ``_JobEnded`` (its reading was lost with an earlier try; it is not launched again).
        ``stop_config`` (the lane's evidence run, ``bitwise_lane.evidence_stop_config``): the launch argument that
        is the config replaced by a config written in the job's evidence folder that ends the run by itself."""
        resolved: Resolved = self.resolved
        if self.suite not in resolved["suites"]:
            raise AirflowSkipException(f"suite {self.suite} not selected for this run")
        conn, folders = suite_node(resolved, self.suite)
        values = node_settings(conn)
        launcher = node_launcher(conn)
        chosen = launchers.launcher_for(launcher)
        layout = remote.RunLayout(folders["run_dir"])
        spec = expanded_spec(spec, values, layout.worktree, resolved.get("baselines"))
        work_dir, job_dir = layout.work_dir(job), layout.job_dir(job)
        marker = remote.job_marker(resolved["run_key"], job)

        with ssh_client(conn) as client:
            state, said = job_state(client, job_dir, launcher)
            if state == "absent":
                if chosen.kind == launchers.SSH:  # on Slurm, placement is the scheduler's
                    _refuse_if_busy(client, values[settings.REMOTE_RUNS_DIR_KEY], resolved["run_key"], job)
                shares = {k: values[k] for k in settings.SHARE_ROOT_VARS}
                args = tuple(spec.args)
                env = remote.job_environment(spec.env, work_dir, resolved["run_key"], job, shares, seed)
                if evidence:  # coverage.py in every Python process of the job (issue 44)
                    env.update(node.evidence_setup(client, layout.evidence_dir(job), layout.worktree,
                                                   spec.node.python or "python3"))
                    self.log.info("%s: recording the checkout's executed lines in every process of %s (coverage.py, "
                                  "%s)", self.suite, job, layout.evidence_dir(job))
                    if stop_config is not None:  # issue 53: a config that ends the run after the lane's steps
                        index, attribute, value = stop_config
                        try:
                            given = node.evidence_config(client, layout.evidence_dir(job), layout.worktree,
                                                         args[index], attribute, value)
                        except node.NodeError as err:  # the evidence only ever saves a training: this run then
                            # goes past the lane's steps, and evidence_of marks its evidence incomplete
                            self.log.warning("%s: %s; %s runs the suite's config (its evidence will not count)",
                                             self.suite, err, job)
                        else:
                            self.log.info("%s: %s is given %s, which runs %s and sets %s = %d (it ends by itself "
                                          "after the lane's steps)", self.suite, job, given, args[index], attribute,
                                          value)
                            args = (*args[:index], given, *args[index + 1:])
                command = remote.job_command(layout.worktree, work_dir, spec.script, args, marker,
                                             settings.STALL_TIMEOUT_S, spec.tracker)
                self._launched = (conn, job_dir, marker, launcher)
                status, out, err = _run(client, chosen.run(job_dir, command, env, resolved["run_key"], job,
                                                           int(spec.node.gpus or 0)))
                if status == 5:  # sbatch's refusal: asking again is refused again
                    raise AirflowFailException(f"Slurm refused the {job} job: {err.strip()}")
                if status != 0:
                    raise RuntimeError(f"could not submit the {job} job (exit {status}): {err.strip()}")
                training = job in settings.attempt_jobs(self.job_name)
                self.log.info("Launched %s %s: job %s, WORK_DIR %s%s", self.suite,
                              "training" if training else f"deterministic job {job}", job_dir, work_dir,
                              f"; Slurm {out.strip()} in partition {launcher['partition']}"
                              if chosen.kind == launchers.SLURM else "")
            elif once and state in ("dead", "finished", "ended"):
                raise _JobEnded(f"the deterministic job {job} of this run already ended ({state}) in an earlier try")
            elif state in ("dead", "ended"):
                # Started, no exit code, no process: killed (or the node rebooted, or Slurm ended it). Waiting for it
                # would only run into the timeout; relaunching in its folder would be a second training (a retry
                # policy's new attempt has a folder of its own).
                raise (_TrainingLost if job in settings.attempt_jobs(self.job_name) else AirflowFailException)(
                    f"the {job} job of this run ({job_dir}) " + (
                    f"was ended by Slurm without an exit code ({launchers.end_class(said)}: {said})"
                    if state == "ended" else "died without an exit code (killed or node restarted)")
                    + "; not launching a second training in its folder")
            else:
                self.log.info("Re-attaching to the %s job of this run (%s)%s: no second training", state, job_dir,
                              f" ({said})" if said else "")
        return conn, job_dir, marker, work_dir, spec

    def _confirms(self, context: Any) -> dict[str, list[float]] | None:
        """A repeat's: what its gate wrote of the certain FAIL that may stop it early (``STOP_EARLY_FILE``,
        ``core.confirm.stop_early``); None for a first run."""
        if self.attempt == 0:
            return None
        return record.get_json(context["run_id"], f"{self.job_name}/{settings.STOP_EARLY_FILE}",
                               dag_id=context["dag_run"].dag_id) or None


class _TrainingLost(Exception):
    """The training's job of this attempt, launched by an earlier try, ended without an exit code."""


class _JobEnded(Exception):
    """A lane job of this run that an earlier try launched has ended: its reading cannot be had again."""


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


def job_state(client: Any, job_dir: str, launcher: dict[str, Any] | None = None) -> tuple[str, str]:
    """(state, what the scheduler said): "absent", "pending" (Slurm only), "running", "finished", "ended" (Slurm
    ended it without an exit code), "dead" (started, no exit code, process gone), or on Slurm "unknown" (Slurm did
    not answer) and "settling" (Slurm ended it, its exit code is awaited). A status script that fails or prints
    nothing raises: silence is no "absent" (that would launch a second training)."""
    status, out, err = _run(client, launchers.launcher_for(launcher).status(job_dir))
    if status != 0 or not out.strip():
        raise RuntimeError(f"the job's state could not be read ({job_dir}: exit {status}, "
                           f"{err.strip()[-300:] or 'nothing printed'}); nothing was launched")
    return launchers.parse_status(out.strip().splitlines()[-1])


def _refuse_if_busy(client: Any, runs_root: str, key: str, suite: str) -> None:
    status, out, err = _run(client, remote.prerequisites_script([], runs_root, key, own_suite=suite))
    busy = node.parse_prerequisites(out).busy
    if busy:  # the node's own state: asking again in seconds finds it busy again (core.retry: a node cause)
        raise AirflowFailException("; ".join(busy) + " — not launching a second training on this node")
