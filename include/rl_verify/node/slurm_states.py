"""Slurm's job states, once (issue 54): what each means for a job rl-verify watches.

The table is the one source: ``lib_slurm.sh`` is rendered with its lists (:func:`shell_lists`), the launcher names
an end with its words (:func:`end_words`) and the test harness imports it. States are squeue's ``%T`` and sacct's
``State`` names (Slurm's ``job_state_string``); a state not listed here is ended by Slurm under its own name.

Kinds:

- ``pending``: waiting for resources or held; the job has not started (or was requeued and waits again);
- ``running``: holds its resources, its body may be running; ``COMPLETING`` included (Slurm is still ending it);
- ``by_slurm``: Slurm ended the job (cancel, preemption, time limit, node failure...): the batch step writes no exit
  code, and an exit code its body wrote after Slurm's signal (128 + n) does not count as the body's own end;
- ``by_body``: the batch step ended (``COMPLETED``, ``FAILED``): its exit code file is expected.
"""

from __future__ import annotations

from typing import Final

PENDING, RUNNING, BY_SLURM, BY_BODY = "pending", "running", "by_slurm", "by_body"

#: state -> (kind, the words a person reads for a job that ended so, "" where it did not end)
STATES: Final[dict[str, tuple[str, str]]] = {
    "PENDING": (PENDING, ""),
    "CONFIGURING": (PENDING, ""),
    "REQUEUED": (PENDING, ""),
    "REQUEUE_HOLD": (PENDING, ""),
    "REQUEUE_FED": (PENDING, ""),
    "RESV_DEL_HOLD": (PENDING, ""),
    "RUNNING": (RUNNING, ""),
    "COMPLETING": (RUNNING, ""),
    "SUSPENDED": (RUNNING, ""),
    "STAGE_OUT": (RUNNING, ""),
    "SIGNALING": (RUNNING, ""),
    "RESIZING": (RUNNING, ""),
    "STOPPED": (RUNNING, ""),
    "UPDATE_DB": (RUNNING, ""),
    "POWER_UP_NODE": (PENDING, ""),
    "CANCELLED": (BY_SLURM, "cancelled outside rl-verify"),
    "PREEMPTED": (BY_SLURM, "preempted"),
    "TIMEOUT": (BY_SLURM, "time limit"),
    "DEADLINE": (BY_SLURM, "time limit"),
    "OUT_OF_MEMORY": (BY_SLURM, "out of memory"),
    "NODE_FAIL": (BY_SLURM, "node failure"),
    "BOOT_FAIL": (BY_SLURM, "node failure"),
    "REVOKED": (BY_SLURM, "revoked by a federated cluster"),
    "SPECIAL_EXIT": (BY_SLURM, "held by Slurm after a special exit"),
    "COMPLETED": (BY_BODY, "completed in Slurm without its exit code"),
    "FAILED": (BY_BODY, "failed in Slurm"),
}

#: Ends rl-verify itself records in a job's ``scheduler_end`` (no Slurm state of that meaning exists).
RECORDED_ENDS: Final[dict[str, str]] = {
    "PENDING": "never scheduled",  # the run gave up on the queue (the pending limit)
    "REQUEUED": "requeued by Slurm: not rerun",  # the batch step refused a second start in its folder
}


def kind_of(state: str) -> str:
    """The kind of a Slurm state; a state this table does not know is taken as ended by Slurm."""
    return STATES.get(state, (BY_SLURM, ""))[0]


def states_of(kind: str) -> tuple[str, ...]:
    """Every state of one kind, in the table's order."""
    return tuple(name for name, (k, _) in STATES.items() if k == kind)


#: States in which Slurm still holds or waits for the job's resources (not yet ended).
ACTIVE: Final[frozenset[str]] = frozenset(states_of(PENDING) + states_of(RUNNING))


def end_words(state: str, who: str = "") -> str:
    """What a job that ended in ``state`` without its exit code is called; ``who`` ``ours``: rl-verify's own stop."""
    if state == "CANCELLED" and who == "ours":
        return "stopped by rl-verify"
    if state in RECORDED_ENDS:
        return RECORDED_ENDS[state]
    words = STATES.get(state, (BY_SLURM, ""))[1]
    return words or f"ended {state} in Slurm"


def shell_lists() -> dict[str, list[str]]:
    """The arrays ``lib_slurm.sh`` is rendered with (``remote.render`` values), one per kind."""
    return {f"slurm_{kind}_states": list(states_of(kind)) for kind in (PENDING, RUNNING, BY_SLURM, BY_BODY)}
