"""The trigger that watches one training job on the node while its task is deferred.

It only watches: it polls the job, tails its log, reconnects after a drop and kills the job when the
live check (a ``core.live.LiveWatch`` built from the JSON the operator hands it, with the engine's
check in serialised form) says its FAIL is certain or a log rule matched. It reads nothing but the
node: no record store, no suite spec, no engine module by name.

Owned outright on the SSH provider's public async hook (``SSHHookAsync.get_conn``) and Airflow's
public ``BaseTrigger`` interface: no provider class is subclassed, no private member is used
(``tests/unit/test_provider_contract.py`` pins what is relied on). Imported by the triggerer and
by the DAG file at parse time, so only Airflow and the package's pure modules are imported at module
level. Its serialised class path ``rl_verify.triggers.RLJobTrigger`` (what earlier versions stored for
a deferred task) stays importable: ``rl_verify/triggers.py``.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from rl_verify import settings
from rl_verify.core.bitwise import LaneWatch
from rl_verify.core.live import LiveWatch, describe_hit
from rl_verify.node import launcher as launchers
from rl_verify.node import remote
from rl_verify.node.poll import parse_poll, pending_too_long, poll_elapsed, poll_scheduler
# Its serialised path in earlier versions was this module's: it stays importable from here.
from rl_verify.orchestration.probe_trigger import ProbesTrigger

__all__ = ["ProbesTrigger", "RLJobTrigger", "parse_poll", "reconnect_delay"]

#: The task states after which a user's "kill" really means stop the job (a cleared task comes back).
ENDED_STATES = ("failed", "success", "skipped", "upstream_failed", "removed")


def reconnect_delay(attempt: int) -> float:
    """Seconds before reconnect ``attempt`` (1-based): 1, 2, 4, 8, then 10, plus up to 1 s of jitter.

    Capped at 10 s so the monitor is back within ~10 s of the node after an outage; the outage a
    job survives is set by the number of attempts (``settings.SSH_RECONNECT_ATTEMPTS``).
    """
    return min(2 ** (attempt - 1), 10) + random.uniform(0, 1)


class RLJobTrigger(BaseTrigger):
    """Poll a detached training job: stream its log, end with its exit code, kill it on a user's kill.

    One SSH connection is held for the whole watch and re-opened after a drop, with at most
    ``max_reconnect_attempts`` failures in a row: the job itself runs on the node, so an outage
    shorter than that budget costs nothing. The streamed offset is recorded beside the job, so a
    retried task or a restarted triggerer resumes the log where the last monitor stopped.
    """

    def __init__(self, *, ssh_conn_id: str, job_dir: str, job_marker: str, poll_interval: float = 5,
                 log_chunk_size: int = 65536, log_offset: int = 0, command_timeout: float = 30.0,
                 max_reconnect_attempts: int = 12, live: dict[str, Any] | None = None,
                 lane: dict[str, Any] | None = None, launcher: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.ssh_conn_id = ssh_conn_id
        self.job_dir = job_dir
        self.job_marker = job_marker
        self.poll_interval = poll_interval
        self.log_chunk_size = log_chunk_size
        self.log_offset = log_offset
        self.command_timeout = command_timeout
        self.max_reconnect_attempts = max_reconnect_attempts
        #: The live check of the training (``core.live.LiveWatch``'s config, built by the operator).
        #: None: the job is only watched.
        self.live = live
        #: The bitwise lane's watch of a deterministic job (``core.bitwise.LaneWatch``'s config): the job is
        #: stopped once its k steps are read or one differs from the reference. None: not a lane job.
        self.lane = lane
        #: How the job was launched (``node.launcher.launcher_config``'s dict; None: over SSH, as before issue 45).
        self.launcher = launcher
        self._launcher = launchers.launcher_for(launcher)
        #: What the scheduler said at the last poll, and since when (monotonic) the job has waited in its queue.
        self._scheduler: dict[str, str] | None = None
        self._pending_since: float | None = None
        self._unknown_since: float | None = None  # monotonic: since when Slurm has not answered
        self._watch: LiveWatch | None = None
        self._lane_watch: LaneWatch | None = None
        self._lane_read_at: float | None = None  # monotonic: when the lane's k steps were first read
        self._elapsed: float | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "ssh_conn_id": self.ssh_conn_id, "job_dir": self.job_dir, "job_marker": self.job_marker,
            "poll_interval": self.poll_interval, "log_chunk_size": self.log_chunk_size,
            "log_offset": self.log_offset, "command_timeout": self.command_timeout,
            "max_reconnect_attempts": self.max_reconnect_attempts, "live": self.live, "lane": self.lane,
            "launcher": self.launcher})

    def _event(self, exit_code: int | None, chunk: str, message: str) -> TriggerEvent:
        status = "error" if exit_code is None else "success" if exit_code == 0 else "failed"
        return TriggerEvent({"status": status, "done": True, "exit_code": exit_code, "log_chunk": chunk,
                             "log_offset": self.log_offset, "job_dir": self.job_dir, "job_marker": self.job_marker,
                             "message": message, "scheduler": self._scheduler})

    async def _connect(self) -> Any:
        import asyncssh

        from airflow.providers.ssh.hooks.ssh import SSHHookAsync

        # The library logs every channel it opens at INFO; in a task log that is most of the lines.
        asyncssh.set_log_level("WARNING")
        return await SSHHookAsync(ssh_conn_id=self.ssh_conn_id).get_conn()

    async def _script(self, conn: Any, script: str) -> tuple[int, bytes]:
        """Run ``script`` with ``bash -s`` (script on stdin); return (exit status, raw stdout)."""
        # A Slurm script may wait on squeue and sacct, each bounded on the node (a frozen slurmctld answers late), and
        # a stop waits up to SLURM_STOP_WAIT_S for its jobs to leave, one more bounded squeue past that deadline.
        slurm_wait = 2 * settings.SLURM_ASK_TIMEOUT_S + settings.SLURM_STOP_WAIT_S \
            if self._launcher.kind == launchers.SLURM else 0
        result = await conn.run("bash -s", input=script.encode(), encoding=None, check=False,
                                timeout=self.command_timeout + slurm_wait)
        out = result.stdout or b""
        return result.exit_status or 0, out if isinstance(out, bytes) else out.encode()

    async def _poll(self, conn: Any) -> tuple[int | None, str, bool]:
        """One look at the job: (exit code, new log text, whether the log has been read to its end).

        Sets ``self._elapsed`` to the seconds since the job started (node clock).
        """
        status, out = await self._script(conn, self._launcher.log(self.job_dir, self.log_offset,
                                                                  self.log_chunk_size))
        if not out:
            # The poll script always prints its header line: nothing at all means the session was cut
            # (sshd going down mid-command), a lost connection to reconnect after, not a broken job.
            raise ConnectionError("the job poll printed nothing: the SSH session ended before the command did")
        if status != 0:
            raise ValueError(f"job poll exited {status}: {out[-300:]!r}")
        exit_code, start, size, text, offset = parse_poll(out)
        self._elapsed = poll_elapsed(out)
        self._note_scheduler(poll_scheduler(out))
        if self.log_offset == 0 and start > 0:
            self.log.info("Resuming the remote log at byte %d (streamed by an earlier monitor)", start)
        self.log_offset = offset
        return exit_code, text, offset >= size

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import asyncssh

        connection_errors = (OSError, asyncssh.Error, TimeoutError)
        conn: Any = None
        failures = 0
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._connect()
                    exit_code, text, read_all = await self._poll(conn)
                except connection_errors as err:
                    failures += 1
                    if conn is not None:
                        conn.close()
                        conn = None
                    if failures > self.max_reconnect_attempts:
                        yield self._event(None, "", f"the node was unreachable for {failures} attempts in a row "
                                                    f"(reconnect budget {self.max_reconnect_attempts}): {err}")
                        return
                    delay = reconnect_delay(failures)
                    self.log.warning("SSH to the node failed (%s); reconnect attempt %d/%d in %.1f s",
                                     err, failures, self.max_reconnect_attempts, delay)
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                ended_by = await self._scheduler_end(conn, exit_code)
                if ended_by is not None:
                    yield ended_by
                    return
                done = exit_code is not None and read_all
                if text and not done:
                    self.log.info("%s", text.rstrip("\n"))  # the last chunk goes with the event instead
                try:
                    ended = await self._lane(conn, exit_code is not None and read_all) if self.lane else None
                    if ended is None:
                        ended = await self._live(conn, exit_code, text) if self.live else None
                except connection_errors:
                    continue  # the next poll reconnects (and counts the failure)
                if ended is not None:
                    yield ended
                    return
                if done:
                    event = self._event(exit_code, text, f"job exited {exit_code}")
                    if self._lane_watch is not None:  # ended by itself before the lane was decided
                        event.payload["lane"] = self._lane_watch.summary(ended=True)
                    if self._watch is not None:
                        event.payload["live"] = self._watch.summary()
                        hit = self._watch.ended_short()
                        if hit is not None:
                            # The job ended by itself short of its steps after a log rule matched:
                            # an infrastructure failure quoting the line, whatever its exit code.
                            event.payload["live"]["log_rule"] = hit
                            event.payload.update(status="log_rule", message=(
                                f"ended at step {hit['steps']} of {self._watch.expected_steps} "
                                f"(exit code {exit_code}) after {describe_hit(hit)}"))
                    yield event
                    return
                if exit_code is None:
                    await asyncio.sleep(self.poll_interval)
        except Exception as err:  # anything else ends the watch with a readable event, not a silent hang
            self.log.exception("Watching job %s failed", self.job_marker)
            yield self._event(None, "", f"watching the job failed: {err}")
        finally:
            if conn is not None:
                conn.close()

    def _note_scheduler(self, said: dict[str, str] | None) -> None:
        """Keep what the scheduler says of the job; log each change (a pending job's reason goes to the task log)."""
        if said is None:
            return
        if said["state"] == "unknown":
            # Silence is no answer: the job is taken as it was last seen until Slurm answers or the limit passes.
            if self._unknown_since is None:
                self._unknown_since = asyncio.get_running_loop().time()
                self.log.warning("Slurm does not answer (%s): the job is taken as still %s; given up after %d s "
                                 "of silence", said["detail"], (self._scheduler or {}).get("state", "submitted"),
                                 self._unreachable_s())
            return
        if self._unknown_since is not None:
            self.log.info("Slurm answers again after %.0f s: the job is %s",
                          asyncio.get_running_loop().time() - self._unknown_since, said["state"])
            self._unknown_since = None
        if said["state"] == "settling":
            if (self._scheduler or {}).get("state") != "settling":
                self.log.info("Slurm shows the job %s; its exit code is awaited (up to %d s)", said["detail"],
                              settings.SLURM_SETTLE_S)
            self._scheduler = said
            return
        if said != self._scheduler:
            if said["state"] == "pending":
                self.log.info("Slurm holds the job in its queue: reason %s", said["detail"] or "None")
            elif said["state"] == "running" and (self._scheduler or {}).get("state") in (None, "pending"):
                self.log.info("Slurm started the job")
            elif said["state"] == "finished" and self._scheduler is None:
                # A short job can end before a busy triggerer's first look: the log still says Slurm ran it.
                self.log.info("Slurm ran the job: its batch step had finished by the watch's first look")
        if said["state"] == "pending":
            self._pending_since = self._pending_since or asyncio.get_running_loop().time()
        else:
            self._pending_since = None
        self._scheduler = said

    async def _scheduler_end(self, conn: Any, exit_code: int | None) -> TriggerEvent | None:
        """The event that ends the watch because of the scheduler (issue 45), else None: a job Slurm ended without
        its exit code (cancelled outside rl-verify, preempted, timed out, out of memory, node failure), or one that
        waited in the queue past the target's limit (cancelled here; Slurm's reason named)."""
        said = self._scheduler
        if said is None or exit_code is not None:
            return None
        if self._unknown_since is not None:
            silent = asyncio.get_running_loop().time() - self._unknown_since
            if silent <= self._unreachable_s():
                return None
            _, out = await self._script(conn, self._launcher.stop(self.job_dir, self.job_marker))
            self.log.error("Slurm did not answer for %.0f s (limit %d s): the job was given up and its cancel "
                           "tried (%s)", silent, self._unreachable_s(), out.decode(errors="replace").strip())
            event = self._event(None, "", f"Slurm did not answer for {silent:.0f} s (limit {self._unreachable_s()} "
                                          "s, the connection's extra slurm_unreachable_s): the job's end is unknown; "
                                          "its cancel was tried")
            event.payload["status"] = "scheduler"
            return event
        if said["state"] in ("ended", "dead"):
            what = launchers.end_class(said["detail"]) if said["state"] == "ended" else said["detail"]
            event = self._event(None, "", f"Slurm ended the job before the training did: {what} ({said['detail']})")
            event.payload["status"] = "scheduler"
            return event
        limit = int((self.launcher or {}).get("pending_limit_s") or 0)
        waited = asyncio.get_running_loop().time() - self._pending_since if self._pending_since else 0.0
        if not pending_too_long(said, waited, limit):
            return None
        reason = re.sub(r"[^A-Za-z0-9_ ().,:-]", "_", said["detail"] or "None")[:150]
        _, out = await self._script(conn, self._launcher.stop(self.job_dir, self.job_marker,
                                                              ended_as=f"PENDING {reason}"))
        self.log.error("The job waited %.0f s in Slurm's queue (limit %d s), reason %s: cancelled (%s)", waited,
                       limit, said["detail"], out.decode(errors="replace").strip())
        event = self._event(None, "", f"pending in Slurm's queue for {waited:.0f} s (limit {limit} s): Slurm's reason "
                                      f"{said['detail'] or 'None'}; the job was cancelled")
        event.payload["status"] = "scheduler"
        return event

    def _unreachable_s(self) -> int:
        return int((self.launcher or {}).get("unreachable_s", settings.SLURM_UNREACHABLE_S))

    async def _lane(self, conn: Any, ended: bool) -> TriggerEvent | None:
        """The bitwise lane's look at the tracker: once k steps are read (or one differs from the reference),
        the job is stopped and the watch ends with the reading (``status`` ``lane``). A job that ended by
        itself is left to the caller (its exit event carries the reading)."""
        if self._lane_watch is None:
            self._lane_watch = LaneWatch(self.lane or {})
        watch = self._lane_watch
        while True:
            status, out = await self._script(conn, remote.tracker_poll_script(
                watch.work_dir, watch.tracker_glob, watch.tracker_path, watch.offset, 1 << 20))
            if status != 0:
                raise ValueError(f"tracker poll exited {status}")
            if not watch.take(out):
                break
        reading = watch.reading(ended)
        if not reading.done or ended:
            return None
        if self._lane_read_at is None:
            self._lane_read_at = time.monotonic()
        ends_itself = float((self.lane or {}).get("ends_itself_s") or 0)
        if time.monotonic() - self._lane_read_at < ends_itself:
            return None  # a job that stops itself after its steps ends on its own: its exit event carries the reading
        what = "identical to the reference" if watch.reference is not None else "recorded"
        self.log.info("Bitwise lane: %s", f"{reading.steps_seen} of {reading.steps} steps {what}"
                      if reading.difference is None else f"differs at {reading.difference.line()}")
        _, killed = await self._script(conn, self._launcher.stop(self.job_dir, self.job_marker))
        self.log.info("Stopped the lane job %s: %s", self.job_marker, killed.decode(errors="replace").strip())
        event = self._event(None, "", "lane decided")
        event.payload.update(status="lane", lane=watch.summary())
        return event

    async def _live(self, conn: Any, exit_code: int | None, text: str) -> TriggerEvent | None:
        """The live check of one poll: log rules on the new lines, then the tracker's new rows.

        Returns the event that ends the watch (the job was stopped), else None. Anything but a lost
        connection switches the live check off with a warning: it must never end a healthy training.
        """
        import asyncssh

        watch = self._live_watch()
        if watch.off:
            if not watch.started:  # said once
                watch.started = True
                self.log.warning("Live check off: this job was deferred by an earlier version of rl-verify, whose "
                                 "live check config this version does not read; the job is watched to its end and "
                                 "the final comparison judges it")
            return None
        try:
            if exit_code is None and text:
                stopped = await self._check_log(conn, text)
                if stopped is not None:
                    return stopped
            elif text:
                watch.log_hit(text)  # the job has ended: nothing to stop, the hits classify its end
            aborted = await self._watch_training(conn)
            return aborted if exit_code is None else None
        except (OSError, TimeoutError, asyncssh.Error):
            raise  # a lost connection: the caller's reconnect path
        except Exception as err:
            watch.off = True
            self.log.warning("Live check switched off for this run (the final comparison still judges it): %s", err)
            return None

    def _live_watch(self) -> "LiveWatch":
        if self._watch is None:
            self._watch = LiveWatch(self.live or {})
        return self._watch

    async def _check_log(self, conn: Any, text: str) -> TriggerEvent | None:
        """Apply the suite's log rules to new log lines; end the job on a match (early_abort on)."""
        watch = self._live_watch()
        hit = watch.log_hit(text)
        if hit is None:
            return None
        self.log.warning("Log rule matched: %s", describe_hit(hit))
        if not watch.early_abort and hit.get("stop") != "always":
            self.log.warning("early_abort is off: the run goes on (it would have been stopped here)")
            return None
        _, killed = await self._script(conn, self._launcher.stop(self.job_dir, self.job_marker))
        self.log.warning("Stopped job %s: %s", self.job_marker, killed.decode(errors="replace").strip())
        event = self._event(None, "", f"stopped: {describe_hit(hit)}")
        event.payload.update(status="log_rule", live=watch.summary())
        return event

    async def _watch_training(self, conn: Any) -> TriggerEvent | None:
        """Read the tracker's new bytes, log progress, and end the job when its FAIL is certain.

        Returns the event that ends the watch after an early abort, else None. A live check that
        cannot run (no baseline, unreadable data) is said once and the job is only watched.
        """
        watch = self._live_watch()
        if not watch.started:
            # Rebuilding the engine's check imports its module: in a thread, so the triggerer's event
            # loop (every other watch) is not held up by the imports.
            self.log.info("%s", await asyncio.to_thread(watch.start))
            if watch.off:
                return None
        if watch.checker is None:
            return None
        while True:
            status, out = await self._script(conn, remote.tracker_poll_script(
                watch.work_dir, watch.tracker_glob, watch.tracker_path, watch.offset, 1 << 20))
            if status != 0:
                raise ValueError(f"tracker poll exited {status}")
            more = watch.take(out)
            if not more:
                break
        # Off the event loop like watch.start: a look that read many steps replays them (~0.14 s for 44 GRPO steps).
        for line in await asyncio.to_thread(watch.report, self._elapsed):
            self.log.info("%s", line)
        if watch.doomed is None or not watch.early_abort or watch.stopped:
            return None
        watch.stopped = True
        _, killed = await self._script(conn, self._launcher.stop(self.job_dir, self.job_marker))
        self.log.warning("Early abort: killed job %s: %s", self.job_marker, killed.decode(errors="replace").strip())
        event = self._event(None, "", watch.abort_message())
        event.payload.update(status="aborted", live=watch.summary())
        return event

    async def _task_state(self) -> str | None:
        """The task's state as Airflow now records it, or None when it cannot be read."""
        ti = self.task_instance
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

    async def _run_state(self) -> str | None:
        """The DAG run's state as Airflow records it (a run marked failed or cancelled ends its jobs, and no cleanup
        task of it will run), or None when it cannot be read."""
        ti = self.task_instance
        if ti is None:
            return None
        try:
            from asgiref.sync import sync_to_async
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

            state = await sync_to_async(RuntimeTaskInstance.get_dagrun_state)(dag_id=ti.dag_id, run_id=ti.run_id)
        except Exception as err:
            self.log.warning("Could not read the DAG run's state: %s", err)
            return None
        return str(getattr(state, "value", state))

    async def on_kill(self) -> None:
        """Stop every process of the job (group, teachers, Ray; a Slurm job: ``scancel``) when a user ended the task
        or its DAG run.

        Airflow calls this for "clear" as well as "mark failed/success". A cleared task comes back
        and re-attaches to the live job, so only a task that ended (or whose DAG run ended: no cleanup task of it
        will run) is killed; when the state cannot be read, the DAG's cleanup task (``one_failed``) does the kill.
        The work is shielded: the triggerer may cancel this coroutine again while it waits on Airflow and the node
        (a DAG run marked failed was seen to), and a stop cut short would leave the job running.
        """
        self._kill = asyncio.ensure_future(self._kill_if_ended())  # held: a shielded task must not be collected
        await asyncio.shield(self._kill)

    async def _kill_if_ended(self) -> None:
        state = await self._task_state()
        run_state = await self._run_state() if state not in ENDED_STATES else None
        if state not in ENDED_STATES and run_state not in ("failed", "success"):
            self.log.info("Task state is %s, DAG run %s (cleared or rescheduled): the job keeps running for re-attach",
                          state, run_state)
            return
        self.log.warning("Task %s, DAG run %s: stopping the job", state, run_state or "running")
        try:
            conn = await self._connect()
            try:
                _, out = await self._script(conn, self._launcher.stop(self.job_dir, self.job_marker))
                self.log.warning("Killed job %s on user request: %s", self.job_marker,
                                 out.decode(errors="replace").strip())
            finally:
                conn.close()
        except Exception:  # said in the task log; the run's cleanup (when it runs) stops what is left
            self.log.exception("Could not stop job %s", self.job_marker)
