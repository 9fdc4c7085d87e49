"""Standing approvals for scheduled runs, trusted only when a recorded human response backs them.

A standing approval is granted when a person approves a *scheduled* run's card with the "standing
approval" box ticked. It is stored (an Airflow Variable) as a ``Grant`` that names the run and the
approval task whose response granted it. Before a later scheduled run proceeds on it, the grant is
checked against Airflow's own record of that response (``ApprovalRecord``, read through the REST
API): who answered, when, what they chose, whether they ticked the box, which card they saw
(the fingerprint in the card body), whether the granting run was scheduled, whether the responder
may approve, and the grant's age. Every reason to refuse is collected (``refusals``); any reason
means the run waits for a person. Nothing here imports Airflow.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

APPROVE = "Approve"
#: How long a standing approval lasts unless configured (RL_VERIFY_STANDING_APPROVAL_DAYS).
DEFAULT_MAX_AGE = timedelta(days=14)
_FINGERPRINT_IN_CARD = re.compile(r"Experiment fingerprint: `([0-9a-f]{16})`")
_REQUIRED = ("fingerprint", "dag_id", "dag_run_id", "task_id", "granted_by", "granted_at")


@dataclass(frozen=True)
class Grant:
    """What the Variable holds: which card, and which recorded response granted it."""

    fingerprint: str
    dag_id: str
    dag_run_id: str
    task_id: str
    granted_by: str
    granted_at: str
    revoked_by: str | None = None
    revoked_at: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    def revoked(self, by: str, at: str) -> "Grant":
        """The same grant, marked revoked (kept, so the history stays readable)."""
        return Grant(**{**asdict(self), "revoked_by": by, "revoked_at": at})


@dataclass(frozen=True)
class ApprovalRecord:
    """Airflow's record of the granting response (HITL detail of the approval task + its run type)."""

    run_type: str
    responded_by: str | None
    responded_at: datetime | None
    chosen_options: list[str] = field(default_factory=list)
    params_input: dict[str, Any] = field(default_factory=dict)
    body: str = ""


class MalformedGrant(ValueError):
    """The stored grant cannot be read (edited by hand, or written by something else)."""


def parse_grant(raw: str) -> Grant:
    """The grant stored in the Variable; raises ``MalformedGrant`` naming what is wrong."""
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise MalformedGrant(f"not JSON ({err})") from err
    if not isinstance(data, dict):
        raise MalformedGrant("not a JSON object")
    missing = [k for k in _REQUIRED if not isinstance(data.get(k), str) or not data.get(k)]
    if missing:
        raise MalformedGrant(f"lacks {', '.join(missing)}")
    known = set(Grant.__dataclass_fields__)
    return Grant(**{k: v for k, v in data.items() if k in known})


def parse_time(text: str | None) -> datetime | None:
    """An ISO-8601 timestamp (``Z`` accepted; naive means UTC) as an aware datetime, or None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)  # Airflow stores UTC


def card_fingerprint(body: str) -> str | None:
    """The experiment fingerprint printed at the end of a card body."""
    match = _FINGERPRINT_IN_CARD.search(body or "")
    return match.group(1) if match else None


def refusals(grant: Grant, record: ApprovalRecord | None, fingerprint: str, now: datetime,
             max_age: timedelta = DEFAULT_MAX_AGE, approvers: list[str] | None = None) -> list[str]:
    """Every reason not to proceed on ``grant`` for a card with ``fingerprint``; empty = proceed.

    ``approvers``: user names allowed to approve (None or empty: any user allowed by Airflow).
    """
    out: list[str] = []
    if grant.revoked_by:
        out.append(f"revoked by {grant.revoked_by} at {grant.revoked_at}")
    if grant.fingerprint != fingerprint:
        out.append(f"granted for card {grant.fingerprint}, this run's card is {fingerprint} (the card changed)")
    if record is None:
        out.append(f"no approval record for {grant.dag_id} run {grant.dag_run_id} task {grant.task_id}")
        return out
    if record.run_type != "scheduled":
        out.append(f"run {grant.dag_run_id} is a {record.run_type} run; only a scheduled run's approval grants one")
    if record.responded_by is None or record.responded_at is None:
        out.append(f"nobody answered the approval of run {grant.dag_run_id}")
        return out
    if record.responded_by != grant.granted_by:
        out.append(f"the grant names {grant.granted_by} but {record.responded_by} answered")
    granted_at = parse_time(grant.granted_at)
    if granted_at is None or abs((granted_at - record.responded_at).total_seconds()) > 1:
        out.append(f"the grant says {grant.granted_at} but the answer was given at {record.responded_at.isoformat()}")
    if APPROVE not in record.chosen_options:
        out.append(f"the recorded answer was {record.chosen_options}, not {APPROVE}")
    if record.params_input.get("standing_approval") is not True:
        out.append("the recorded answer did not grant a standing approval")
    approved_card = card_fingerprint(record.body)
    if approved_card != grant.fingerprint:
        out.append(f"the approved card had fingerprint {approved_card}, the grant names {grant.fingerprint}")
    if approvers and record.responded_by not in approvers:
        out.append(f"{record.responded_by} is not an allowed approver ({', '.join(approvers)})")
    expires = record.responded_at + max_age
    if now >= expires:
        out.append(f"expired at {expires.isoformat()} ({max_age.days} days after it was granted)")
    return out
