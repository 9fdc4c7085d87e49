"""Whether a training that failed as infrastructure is tried again (issue 55), pure.

A failed training's cause is one of four kinds:

* ``transient``: says nothing about the commit or the node's setup (a crash at launch, a teacher that did not come
  up, a stall, Slurm's preemption): tried again, up to the policy's ``retries``, in a new job folder once the
  failed attempt's processes are proven gone;
* ``node``: the node's own fault (its GPUs held by another process, Ray's ports taken, a driver or PATH problem):
  never a second time on the same node; with no other node to go to, the suite ends with the fix named;
* ``input``: bad input (a missing model or dataset, a config the scheduler refuses): asking again gives the same
  answer, so never retried;
* ``never``: someone ended it on purpose (a cancel outside rl-verify, a queue the run gave up on): not retried.

An accuracy FAIL never reaches here: the training task fails only when the job could not train (the live check's
certain FAIL stops a job on purpose and its task succeeds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

TRANSIENT, NODE, INPUT, NEVER = "transient", "node", "input", "never"
KINDS = (TRANSIENT, NODE, INPUT, NEVER)


@dataclass(frozen=True)
class Policy:
    """The retry policy (``suites/data/infra_retry.json``): how many more attempts a transient failure gets, the
    wait before one, and how a cause's kind is read from its words."""

    retries: int = 1
    delay_s: int = 5
    #: (pattern, kind) tried in order over the failure's words and the job's last log lines
    patterns: tuple[tuple[str, str], ...] = ()
    #: Slurm's end of a job in words (``slurm_states.end_words``) -> kind
    scheduler_ends: Mapping[str, str] = field(default_factory=dict)
    #: the kind of a cause no pattern names
    default: str = TRANSIENT

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], retries: int | None = None) -> "Policy":
        """The policy of the data file's ``data``; ``retries`` (a deployment's setting) replaces its count."""
        problems = []
        patterns = []
        for i, item in enumerate(data.get("patterns") or []):
            kind = item.get("kind")
            try:
                re.compile(str(item.get("pattern")))
            except re.error as err:
                problems.append(f"patterns[{i}].pattern does not compile ({err})")
            if kind not in KINDS:
                problems.append(f"patterns[{i}].kind {kind!r}: give one of {', '.join(KINDS)}")
            patterns.append((str(item.get("pattern")), str(kind)))
        ends = dict(data.get("scheduler_ends") or {})
        problems += [f"scheduler_ends[{k!r}] {v!r}: give one of {', '.join(KINDS)}" for k, v in ends.items()
                     if v not in KINDS]
        count = int(data.get("retries", 1) if retries is None else retries)
        if count < 0:
            problems.append(f"retries {count}: give 0 or more")
        default = data.get("default", TRANSIENT)
        if default not in KINDS:
            problems.append(f"default {default!r}: give one of {', '.join(KINDS)}")
        if problems:
            raise ValueError("the infrastructure retry policy: " + "; ".join(problems))
        return cls(retries=count, delay_s=int(data.get("delay_s", 5)), patterns=tuple(patterns),
                   scheduler_ends=ends, default=default)


@dataclass(frozen=True)
class Cause:
    """Why one attempt failed: its kind and its first line in words."""

    kind: str
    why: str


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, at most 300 characters."""
    line = next((part.strip() for part in str(text or "").splitlines() if part.strip()), "")
    return line[:300]


def classify(policy: Policy, why: str, log_tail: str = "", rule_kind: str | None = None,
             scheduler_end: str | None = None) -> Cause:
    """The cause of a failed attempt: a matched log rule's own ``retry`` kind first, then Slurm's end of the job,
    then the first policy pattern found in the failure's words or the job's last lines, else the default."""
    if rule_kind in KINDS:
        return Cause(str(rule_kind), first_line(why))
    if scheduler_end and scheduler_end in policy.scheduler_ends:
        return Cause(policy.scheduler_ends[scheduler_end], first_line(why))
    text = f"{why}\n{log_tail}"
    for pattern, kind in policy.patterns:
        if re.search(pattern, text, re.MULTILINE):
            return Cause(kind, first_line(why))
    return Cause(policy.default, first_line(why))


def decide(policy: Policy, earlier: Sequence[Mapping[str, Any]], cause: Cause, node: str,
           other_nodes: Sequence[str] = ()) -> tuple[bool, str]:
    """(retry?, why) for an attempt that failed with ``cause`` on ``node`` after ``earlier`` failed attempts (each a
    mapping with ``kind`` and ``node``). A node's own fault goes to another node when one is given, never to the
    same node twice; a transient one is tried again while attempts are left."""
    attempts = len(earlier) + 1
    if cause.kind == INPUT:
        return False, "bad input: asking again gives the same answer (fix it, then run again)"
    if cause.kind == NEVER:
        return False, "ended on purpose outside rl-verify: not tried again"
    if attempts > policy.retries:
        return False, (f"{attempts} attempt(s) failed as infrastructure: the policy's {policy.retries} retr"
                       f"{'y is' if policy.retries == 1 else 'ies are'} spent")
    if cause.kind == NODE:
        tried = {a.get("node") for a in earlier if a.get("kind") == NODE} | {node}
        free = [n for n in other_nodes if n not in tried]
        if not free:
            return False, (f"the node's own fault on {node}: not tried there again, and this run has no other "
                           "eligible node")
        return True, f"the node's own fault on {node}: tried again on {free[0]}"
    return True, f"a transient infrastructure failure (attempt {attempts + 1} of {policy.retries + 1} follows)"


def describe(attempts: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per attempt: its number, node, job, kind, the first line of why and what followed."""
    lines = []
    for a in attempts:
        head = f"attempt {a.get('attempt')} on {a.get('node') or '?'} (job {a.get('job') or '?'})"
        if not a.get("kind"):
            lines.append(f"{head}: ran; its training decides the suite")
            continue
        what = "tried again" if a.get("retried") else "final"
        lines.append(f"{head}: infrastructure ({a['kind']}): {a.get('why') or '?'}; {what}: "
                     f"{a.get('decision') or '-'}")
    return lines
