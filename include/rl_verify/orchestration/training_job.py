"""What the training task hands its trigger and what a watched job's end means for the task
(``operators.SuiteTrainingOperator``): the live check's config with its baseline read in the worker, the exception a
job's end raises, the live check's finding kept in the run's record, and the training's attempts after
infrastructure failures (issue 55: ``core.retry``'s policy, every attempt kept in ``<folder>/attempts.json``)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from rl_verify import settings
from rl_verify.core import launch, retry
from rl_verify.engines import engine_of, live_config
from rl_verify.node import launcher as launchers
from rl_verify.node import ops as node
from rl_verify.store import record
from rl_verify.store.baselines import RECORD_FOLDER
from rl_verify.suites.spec import SuiteSpec

#: The most of a baseline tracker on the node's share read for the live check.
LIVE_BASELINE_MAX_BYTES = 64 << 20
#: A training's attempts (issue 55), in its record folder: one entry per attempt that failed, then the last.
ATTEMPTS_FILE = "attempts.json"
#: The job's last log lines kept with a failed attempt.
ATTEMPT_LOG_LINES = 40


@functools.cache
def retry_policy() -> retry.Policy:
    """The infrastructure retry policy: ``settings.INFRA_RETRY_FILE``, its count replaced by
    RL_VERIFY_INFRA_RETRIES; a malformed file raises ValueError naming the field."""
    data = json.loads(settings.INFRA_RETRY_FILE.read_text())
    policy = retry.Policy.from_dict(data, settings.INFRA_RETRIES)
    if policy.retries > settings.MAX_INFRA_RETRIES:
        raise ValueError(f"{settings.INFRA_RETRY_FILE}: retries {policy.retries}: give 0..{settings.MAX_INFRA_RETRIES}")
    return policy


def attempts(run_id: str, folder: str, dag_id: str | None = None) -> list[dict[str, Any]]:
    """The training's attempts so far (``<folder>/attempts.json`` in the run's record; [] before any failed)."""
    return list(record.get_json(run_id, f"{folder}/{ATTEMPTS_FILE}", dag_id=dag_id) or [])


def current_job(name: str, tried: list[dict[str, Any]]) -> str:
    """The job the training ``name`` runs now: the next attempt's after each attempt that was tried again."""
    return settings.retry_job(name, 1 + sum(1 for a in tried if a.get("retried")))


def cause_of(spec: SuiteSpec, event: dict[str, Any], failure: BaseException) -> retry.Cause:
    """The cause of a failed attempt (``core.retry.classify``): the log rule that ended it (its own ``retry``
    kind), Slurm's end of the job, else the failure's words and the job's last lines."""
    hit = (event.get("live") or {}).get("log_rule") or {}
    kind = hit.get("retry") or next((r.retry for r in spec.log_rules if r.pattern == hit.get("pattern")), None)
    said = event.get("scheduler") if isinstance(event.get("scheduler"), dict) else {}
    words = launchers.end_class(said["detail"]) if said.get("state") == "ended" and said.get("detail") else None
    message = str(failure)
    last = launch.last_lines(event.get("log_chunk") or "", 1)
    if last and "see the [remote] lines" in message:  # the job's own last words say more than its exit code
        message = message.replace("see the [remote] lines below", f"its last line: {last[0][:200]}")
    if words is None and event.get("status") == "scheduler":
        words = next((w for w in retry_policy().scheduler_ends if w in message), None)
    return retry.classify(retry_policy(), message, event.get("log_chunk") or "", kind, words)


def log_tail(event: dict[str, Any]) -> list[str]:
    """The job's last log lines of a trigger's event, kept with its attempt."""
    return (event.get("log_chunk") or "").splitlines()[-ATTEMPT_LOG_LINES:]


def live_check_config(spec: SuiteSpec, client: Any, version: dict[str, Any], work_dir: str, early_abort: bool,
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


def training_failure(suite: str, event: dict[str, Any]) -> AirflowException | None:
    """The exception a watched job's end raises, or None when the training task succeeds: the job exited 0, or
    the live check stopped it on purpose because its FAIL was certain (fetch and compare judge what it wrote; the
    grid's red is then the comparison's, not a crash's). A log rule's stop (the run cannot finish), a stall or a
    non-zero exit fail the task; a watch that lost the job raises a retryable error (a retry re-attaches)."""
    status, exit_code = event.get("status"), event.get("exit_code")
    if status == "aborted":
        return None
    if status == "log_rule":
        return AirflowFailException(f"{suite} {event.get('message')}")
    if status == "scheduler":  # Slurm ended it, or it never left the queue: a retry would find it ended
        return AirflowFailException(f"the {suite} job: {event.get('message')}")
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


def record_early_abort(context: Any, folder: str, live: dict[str, Any], applied: bool) -> None:
    """Keep what the live check found in the run's record (``<folder>/abort.json``, the suite's folder) for
    fetch, compare, report."""
    record.put_json(context["run_id"], f"{folder}/abort.json", {**live, "applied": applied},
                    dag_id=context["dag_run"].dag_id)
