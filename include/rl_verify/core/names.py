"""Names derived from a DAG run id: the same on the node, in the record store and in the UI plugin."""

from __future__ import annotations

import hashlib
import re

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def run_key(dag_run_id: str) -> str:
    """A remote-safe, deterministic folder name for a DAG run (same run id -> same key)."""
    readable = _KEY_UNSAFE.sub("_", dag_run_id)[:80].strip("._-") or "run"
    digest = hashlib.sha256(dag_run_id.encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


def repeat_seed(run_key: str, attempt: int) -> int:
    """The seed of a suite's repeat (``RL_VERIFY_SEED`` in its job's environment): new for each repeat of
    each run, the same for a retried task."""
    return int(hashlib.sha256(f"{run_key}/repeat{attempt}".encode()).hexdigest()[:8], 16)


#: How many hex digits of a commit SHA a person is shown (logs, reports, notifications, probe names).
SHORT_SHA = 12


def short_sha(sha: str | None) -> str:
    """The commit as a person reads it: its first SHORT_SHA characters ("" for none)."""
    return (sha or "")[:SHORT_SHA]
