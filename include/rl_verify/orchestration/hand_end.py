"""A DAG run ended by hand (marked failed or success in the UI or the API) while its jobs may still train.

Marking a run skips every task that has not started and fails (or succeeds) the running ones, but leaves its
teardowns to run and the run itself running until they end; Airflow then decides the run's state from its leaves,
which are skipped, and calls it a success. The cleanup teardown stops the jobs; a last teardown that counts for the
run's state (``final_state``) keeps a run ended before its verdict from ever reading success.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from airflow.sdk.exceptions import AirflowFailException

log = logging.getLogger(__name__)


def run_task_states(ti: Any) -> dict[str, str]:
    """Every task's state in ``ti``'s run, as Airflow records them; raises when they cannot be read."""
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id])
    by_task = states.get(ti.run_id, states)
    return {t: str(getattr(s, "value", s)) for t, s in by_task.items()}


def ended_by_hand(states: Mapping[str, str], never_skipped: Iterable[str],
                  approvals: Iterable[tuple[str, str]] = ()) -> bool:
    """Whether the run was ended by hand before ``never_skipped`` ran.

    ``never_skipped``: tasks Airflow itself never skips in this DAG (e.g. all_done tasks, or all_success tasks
    whose upstreams are never skipped), so a skipped one was skipped by the marking. ``approvals``: (approval,
    next) pairs where a rejection skips ``next`` but a marking fails the approval that waited and skips ``next``."""
    return any(states.get(t) == "skipped" for t in never_skipped) or \
        any(states.get(a) == "failed" and states.get(n) == "skipped" for a, n in approvals)


def final_state(states: Mapping[str, str], never_skipped: Iterable[str],
                 approvals: Iterable[tuple[str, str]] = ()) -> str:
    """The last teardown's answer: a run ended by hand before its verdict has none, so it never ends a success:
    raise, naming what failed. Otherwise the line to log (the run's state is then its leaves')."""
    if ended_by_hand(states, never_skipped, approvals):
        failed = sorted(t for t, s in states.items() if s == "failed")
        why = ("This run was ended by hand before its verdict ("
               + (f"failed: {', '.join(failed)}" if failed else "its unfinished tasks skipped")
               + "): it has no verdict, so it does not end as a success. The cleanup stopped its jobs on the node(s) "
               "(see its log). Trigger a new run for a verdict.")
        log.error("%s", why)  # a log line a person reads first, above the exception's traceback
        raise AirflowFailException(why)
    return "The run was not ended by hand: its state is its verdict's"
