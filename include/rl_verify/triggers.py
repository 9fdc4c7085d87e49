"""The trigger that watches one training job on the node while its task is deferred.

Owned outright on the SSH provider's public async hook (``SSHHookAsync.get_conn``) and Airflow's
public ``BaseTrigger`` interface: no provider class is subclassed, no private member is used
(``tests/unit/test_provider_contract.py`` pins what is relied on). Imported by the triggerer and
by the DAG file at parse time, so only Airflow itself is imported at module level.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: The task states after which a user's "kill" really means stop the job (a cleared task comes back).
ENDED_STATES = ("failed", "success", "skipped", "upstream_failed", "removed")


def reconnect_delay(attempt: int) -> float:
    """Seconds before reconnect ``attempt`` (1-based): 1, 2, 4, 8, then 10, plus up to 1 s of jitter.

    Capped at 10 s so the monitor is back within ~10 s of the node after an outage; the outage a
    job survives is set by the number of attempts (``settings.SSH_RECONNECT_ATTEMPTS``).
    """
    return min(2 ** (attempt - 1), 10) + random.uniform(0, 1)


def parse_poll(output: bytes) -> tuple[int | None, int, int, str, int]:
    """Split the output of the ``job_poll`` script: (exit code, start offset, log size, text, new offset).

    The first line is ``<exit code or -> <start offset> <log size> [<seconds since start>]``; the rest
    is the log's bytes from the start offset (see :func:`poll_elapsed` for the fourth field). While
    the job runs only whole lines are taken (a partial last line, or a UTF-8 character cut by the
    chunk limit, waits for the next poll); once it has exited, all.
    """
    head, _, chunk = output.partition(b"\n")
    fields = head.decode(errors="replace").split()
    if len(fields) not in (3, 4) or not (fields[1].isdigit() and fields[2].isdigit()):
        raise ValueError(f"unexpected job poll output: {head[:200]!r}")
    exit_code = None if fields[0] == "-" else int(fields[0])
    start, size = int(fields[1]), int(fields[2])
    if exit_code is None or start + len(chunk) < size:
        whole_lines = chunk[: chunk.rfind(b"\n") + 1]
        # A line longer than a whole chunk is passed on in pieces (never cutting a character).
        chunk = whole_lines or (_utf8_prefix(chunk) if start + len(chunk) < size else b"")
    return exit_code, start, size, chunk.decode("utf-8", errors="replace"), start + len(chunk)


def poll_elapsed(output: bytes) -> float | None:
    """Seconds since the job started, from the ``job_poll`` header (None when absent)."""
    fields = output.partition(b"\n")[0].split()
    return float(fields[3]) if len(fields) == 4 and fields[3].lstrip(b"-").isdigit() else None


def _utf8_prefix(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end."""
    for cut in range(min(4, len(data)) + 1):
        try:
            (data[: len(data) - cut]).decode("utf-8")
            return data[: len(data) - cut]
        except UnicodeDecodeError:
            continue
    return data


def _load_data(engine: Any, name: str, blob: bytes) -> Any:
    """The engine's data model from a baseline version's file (validated like the packaged one)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="rl-verify-live-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(blob)
        return engine.load_data(path)


class LiveWatch:
    """The live check of one training as the trigger runs it: tracker bytes in, log lines out.

    ``config``: ``suite`` (a spec name), ``work_dir`` and ``tracker_glob`` (remote, expanded),
    ``baseline`` (remote path of the tracker the engine compares against, or None) and
    ``early_abort`` (end the job once its FAIL is certain; off: only say where it would have).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        from rl_verify.suite import load_suite

        self.spec = load_suite(config["suite"])
        self.work_dir, self.tracker_glob = config["work_dir"], config["tracker_glob"]
        self.baseline_path: str | None = config.get("baseline")
        #: The files of the run's baseline version (read from the run's record), and its label.
        self.run_id: str | None = config.get("run_id")
        self.dag_id: str | None = config.get("dag_id")  # the record's DAG folder (None: the verification DAG)
        self.version_files: list[str] = list(config.get("version_files") or [])
        self.version_label: str | None = config.get("version_label")
        self.early_abort = bool(config.get("early_abort", True))
        self.checker: Any = None
        self.feed: Any = None
        self.tracker_path = ""
        self.offset = 0
        self.reported_steps = -1
        self.doomed: Any = None   # the first LiveResult with a certain FAIL
        self.last: Any = None
        self.started = False
        self.off = False  # switched off after an error of its own
        self.stopped = False  # the job was killed by the live check
        self.log_hits: list[dict[str, Any]] = []
        self._open_block: dict[str, Any] | None = None  # an ``exit`` rule's match awaiting its block's end

    def start(self, baseline: bytes | None) -> str:
        """Build the checker (``baseline``: the baseline tracker's bytes, None if unreadable); say so."""
        from rl_verify.engines import engine_of
        from rl_verify.tracker import TrackerFeed

        self.started = True
        engine = engine_of(self.spec)
        data = None
        try:
            blob = self._version_file(engine.baseline_file)
            if blob is not None and engine.baseline_is_data:
                data = _load_data(engine, engine.baseline_file, blob)
            elif blob is not None:
                baseline, self.baseline_path = blob, f"baseline {self.version_label or engine.baseline_file}"
            base = None
            if baseline is not None:
                feed = TrackerFeed(self.baseline_path or "baseline")
                feed.feed(baseline + (b"" if baseline.endswith(b"\n") else b"\n"))
                base = feed.tracker
            self.checker = engine.live(self.spec, base, data)
        except Exception as err:  # bad data must never stop a training: the final comparison judges it
            return f"Live check off for {self.spec.name}: {err}"
        if self.checker is None:
            return (f"Live check off for {self.spec.name}: no baseline tracker at {self.baseline_path} to compare "
                    "against (the final comparison reports it)")
        mode = "aborts the run as soon as its FAIL is certain" if self.early_abort else \
            "reports where it would abort (early_abort off)"
        return f"Live check on for {self.spec.name}: every new step is checked with the final rules; {mode}"

    def _version_file(self, name: str) -> bytes | None:
        """A file of the run's baseline version from its record, or None when the version has none."""
        if name not in self.version_files or not self.run_id:
            return None
        from rl_verify import record
        from rl_verify.baselines import RECORD_FOLDER

        return (record.run_store(self.run_id, dag_id=self.dag_id) / self.spec.name / RECORD_FOLDER / name).read_bytes()

    def log_hit(self, text: str) -> dict[str, Any] | None:
        """Scan new log lines: record every log-rule match; return the first of a ``seen`` rule.

        A match of an ``exit`` rule waits for the end of its block (the first later line that is
        not indented, possibly in a later chunk) and quotes that line; it is acted on at exit only.
        """
        first = None
        for line in text.splitlines():
            if self._open_block is not None and line.strip() and not line[0].isspace():
                self._open_block["line"] = line.strip()[:500]
                self._open_block = None
            rule = next((r for r in self.spec.log_rules if r.match(line)), None)
            if rule is None:
                continue
            hit = {"pattern": rule.pattern, "means": rule.means, "line": line.strip()[:500], "when": rule.when}
            self.log_hits.append(hit)
            if rule.when == "exit":
                self._open_block = hit
            elif first is None:
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
        if steps is None or steps >= self.spec.expected_steps:
            return None
        return {**self.log_hits[0], "at_exit": True, "steps": steps}

    def take(self, output: bytes) -> bool:
        """Feed one ``tracker_poll`` output; True when the tracker has more bytes to read now."""
        from rl_verify.tracker import TrackerFeed

        head, _, chunk = output.partition(b"\n")
        fields = head.decode(errors="replace").split()
        if len(fields) != 3 or fields[0] == "-":
            return False
        path, start, size = fields[0], int(fields[1]), int(fields[2])
        if path != self.tracker_path or self.feed is None:
            self.tracker_path, self.offset, self.feed = path, 0, TrackerFeed(path)
            if start != 0:
                return True  # a new file: read it from its start
        self.feed.feed(chunk)
        self.offset = start + len(chunk)
        return self.offset < size

    def report(self, elapsed_s: float | None) -> list[str]:
        """Lines for the task log when a new step came in (and the verdict once it is certain)."""
        from rl_verify.live import progress

        if self.feed is None:
            return []
        tracker = self.feed.tracker
        if tracker.steps == self.reported_steps:
            return []
        self.reported_steps = tracker.steps
        result = self.checker.check(tracker, elapsed_s)
        self.last = result
        lines = [progress(result, self.spec.expected_steps, elapsed_s)]
        if result.certain and self.doomed is None:
            self.doomed = result
            lines.append("FAIL is certain at step %d of %d: %s" % (
                result.steps, self.spec.expected_steps, "; ".join(f"[{c.rule}] {c.text}" for c in result.certain)))
            if not self.early_abort:
                lines.append("early_abort is off: the run goes on to its end; it would have been aborted here")
        return lines

    def abort_message(self) -> str:
        return f"aborted at step {self.doomed.steps} of {self.spec.expected_steps}: " + "; ".join(
            c.text for c in self.doomed.certain)

    def summary(self) -> dict[str, Any]:
        """What the live check saw, for the operator (JSON)."""
        from dataclasses import asdict

        out: dict[str, Any] = {"expected_steps": self.spec.expected_steps, "early_abort": self.early_abort,
                               "checked": self.checker is not None}
        if self.doomed is not None:
            out.update(step=self.doomed.steps, certain=[_json_safe(asdict(c)) for c in self.doomed.certain])
        if self.last is not None:
            out["warnings"] = [f"{s.metric}: {s.text}" for s in self.last.status if s.state == "warning"]
        if self.log_hits:
            out["log_rule"] = self.log_hits[0]
        return out


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    """NaN/Infinity as text: event payloads and XCom are JSON."""
    return {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


class RLJobTrigger(BaseTrigger):
    """Poll a detached training job: stream its log, end with its exit code, kill it on a user's kill.

    One SSH connection is held for the whole watch and re-opened after a drop, with at most
    ``max_reconnect_attempts`` failures in a row: the job itself runs on the node, so an outage
    shorter than that budget costs nothing. The streamed offset is recorded beside the job, so a
    retried task or a restarted triggerer resumes the log where the last monitor stopped.
    """

    def __init__(self, *, ssh_conn_id: str, job_dir: str, job_marker: str, poll_interval: float = 5,
                 log_chunk_size: int = 65536, log_offset: int = 0, command_timeout: float = 30.0,
                 max_reconnect_attempts: int = 12, live: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.ssh_conn_id = ssh_conn_id
        self.job_dir = job_dir
        self.job_marker = job_marker
        self.poll_interval = poll_interval
        self.log_chunk_size = log_chunk_size
        self.log_offset = log_offset
        self.command_timeout = command_timeout
        self.max_reconnect_attempts = max_reconnect_attempts
        #: The live check of the training (see :class:`LiveWatch`): suite, work_dir, tracker_glob,
        #: baseline (remote path or None), early_abort. None: the job is only watched.
        self.live = live
        self._watch: LiveWatch | None = None
        self._elapsed: float | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "ssh_conn_id": self.ssh_conn_id, "job_dir": self.job_dir, "job_marker": self.job_marker,
            "poll_interval": self.poll_interval, "log_chunk_size": self.log_chunk_size,
            "log_offset": self.log_offset, "command_timeout": self.command_timeout,
            "max_reconnect_attempts": self.max_reconnect_attempts, "live": self.live})

    def _event(self, exit_code: int | None, chunk: str, message: str) -> TriggerEvent:
        status = "error" if exit_code is None else "success" if exit_code == 0 else "failed"
        return TriggerEvent({"status": status, "done": True, "exit_code": exit_code, "log_chunk": chunk,
                             "log_offset": self.log_offset, "job_dir": self.job_dir, "job_marker": self.job_marker,
                             "message": message})

    async def _connect(self) -> Any:
        import asyncssh

        from airflow.providers.ssh.hooks.ssh import SSHHookAsync

        # The library logs every channel it opens at INFO; in a task log that is most of the lines.
        asyncssh.set_log_level("WARNING")
        return await SSHHookAsync(ssh_conn_id=self.ssh_conn_id).get_conn()

    async def _script(self, conn: Any, script: str) -> tuple[int, bytes]:
        """Run ``script`` with ``bash -s`` (script on stdin); return (exit status, raw stdout)."""
        result = await conn.run("bash -s", input=script.encode(), encoding=None, check=False,
                                timeout=self.command_timeout)
        out = result.stdout or b""
        return result.exit_status or 0, out if isinstance(out, bytes) else out.encode()

    async def _poll(self, conn: Any) -> tuple[int | None, str, bool]:
        """One look at the job: (exit code, new log text, whether the log has been read to its end).

        Sets ``self._elapsed`` to the seconds since the job started (node clock).
        """
        from rl_verify import remote

        status, out = await self._script(conn, remote.job_poll_script(self.job_dir, self.log_offset,
                                                                      self.log_chunk_size))
        if status != 0:
            raise ValueError(f"job poll exited {status}: {out[-300:]!r}")
        exit_code, start, size, text, offset = parse_poll(out)
        self._elapsed = poll_elapsed(out)
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
                done = exit_code is not None and read_all
                if text and not done:
                    self.log.info("%s", text.rstrip("\n"))  # the last chunk goes with the event instead
                try:
                    ended = await self._live(conn, exit_code, text) if self.live else None
                except connection_errors:
                    continue  # the next poll reconnects (and counts the failure)
                if ended is not None:
                    yield ended
                    return
                if done:
                    event = self._event(exit_code, text, f"job exited {exit_code}")
                    if self._watch is not None:
                        event.payload["live"] = self._watch.summary()
                        hit = self._watch.ended_short()
                        if hit is not None:
                            # The job ended by itself short of its steps after a log rule matched:
                            # an infrastructure failure quoting the line, whatever its exit code.
                            event.payload["live"]["log_rule"] = hit
                            event.payload.update(status="log_rule", message=(
                                f"ended at step {hit['steps']} of {self._watch.spec.expected_steps} "
                                f"(exit code {exit_code}) after {hit['means']}: {hit['line']}"))
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

    async def _live(self, conn: Any, exit_code: int | None, text: str) -> TriggerEvent | None:
        """The live check of one poll: log rules on the new lines, then the tracker's new rows.

        Returns the event that ends the watch (the job was stopped), else None. Anything but a lost
        connection switches the live check off with a warning: it must never end a healthy training.
        """
        import asyncssh

        if self._watch is None:
            # The first use loads the spec, its data and the engine (numpy, pandas): in a thread,
            # so the triggerer's event loop (every other watch) is not held up by the imports.
            self._watch = await asyncio.to_thread(LiveWatch, self.live or {})
        watch = self._watch
        if watch.off:
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
        from rl_verify import remote

        watch = self._live_watch()
        hit = watch.log_hit(text)
        if hit is None:
            return None
        self.log.warning("Log rule matched: %s: %s", hit["means"], hit["line"])
        if not watch.early_abort:
            self.log.warning("early_abort is off: the run goes on (it would have been stopped here)")
            return None
        _, killed = await self._script(conn, remote.kill_job_script(self.job_dir, self.job_marker))
        self.log.warning("Stopped job %s: %s", self.job_marker, killed.decode(errors="replace").strip())
        event = self._event(None, "", f"stopped: {hit['means']}: {hit['line']}")
        event.payload.update(status="log_rule", live=watch.summary())
        return event

    async def _watch_training(self, conn: Any) -> TriggerEvent | None:
        """Read the tracker's new bytes, log progress, and end the job when its FAIL is certain.

        Returns the event that ends the watch after an early abort, else None. A live check that
        cannot run (no baseline, unreadable data) is said once and the job is only watched.
        """
        from rl_verify import remote

        watch = self._live_watch()
        if not watch.started:
            baseline = watch.baseline_path
            data = None
            if baseline:
                status, out = await self._script(conn, remote.read_file_script(baseline, 64 << 20))
                data = out if status == 0 else None
            self.log.info("%s", await asyncio.to_thread(watch.start, data))
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
        for line in watch.report(self._elapsed):
            self.log.info("%s", line)
        if watch.doomed is None or not watch.early_abort or watch.stopped:
            return None
        watch.stopped = True
        _, killed = await self._script(conn, remote.kill_job_script(self.job_dir, self.job_marker))
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

    async def on_kill(self) -> None:
        """Stop every process of the job (group, teachers, Ray) when a user ended the task.

        Airflow calls this for "clear" as well as "mark failed/success". A cleared task comes back
        and re-attaches to the live job, so only a task that ended is killed; when the state cannot
        be read, the DAG's cleanup task (``one_failed``) does the kill.
        """
        from rl_verify import remote

        state = await self._task_state()
        if state not in ENDED_STATES:
            self.log.info("Task state is %s (cleared or rescheduled): the job keeps running for re-attach", state)
            return
        conn = await self._connect()
        try:
            _, out = await self._script(conn, remote.kill_job_script(self.job_dir, self.job_marker))
            self.log.warning("Killed job %s on user request: %s", self.job_marker, out.decode(errors="replace").strip())
        finally:
            conn.close()
