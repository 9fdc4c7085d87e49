"""Every reason a standing approval is refused, and the approval deadline/missed ticks of the schedule."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rl_verify import settings
from rl_verify.orchestration.standing import ApprovalRecord, Grant, MalformedGrant, parse_grant, refusals

FP = "0123456789abcdef"
AT = datetime(2026, 11, 28, 2, 5, tzinfo=timezone.utc)
NOW = AT + timedelta(days=2)


def grant(**kw):
    return Grant(**{"fingerprint": FP, "dag_id": "d", "dag_run_id": "scheduled__1", "task_id": "approve",
                    "granted_by": "alice", "granted_at": AT.isoformat(), **kw})


def record(**kw):
    return ApprovalRecord(**{"run_type": "scheduled", "responded_by": "alice", "responded_at": AT,
                             "chosen_options": ["Approve"], "params_input": {"standing_approval": True},
                             "body": f"... Experiment fingerprint: `{FP}` (suites ...)", **kw})


def test_a_grant_that_matches_its_record_is_accepted():
    assert refusals(grant(), record(), FP, NOW, approvers=["alice"]) == []


@pytest.mark.parametrize("changed_grant,changed_record,fingerprint,now,approvers,reason", [
    ({"revoked_by": "carol", "revoked_at": "t"}, {}, FP, NOW, None, "revoked by carol"),
    ({}, {}, "f" * 16, NOW, None, "the card changed"),
    ({}, {"run_type": "manual"}, FP, NOW, None, "only a scheduled run's approval grants one"),
    ({}, {"responded_by": None, "responded_at": None}, FP, NOW, None, "nobody answered"),
    ({"granted_by": "mallory"}, {}, FP, NOW, None, "the grant names mallory but alice answered"),
    ({"granted_at": (AT + timedelta(hours=1)).isoformat()}, {}, FP, NOW, None, "but the answer was given at"),
    ({}, {"chosen_options": ["Reject"]}, FP, NOW, None, "not Approve"),
    ({}, {"params_input": {"standing_approval": False}}, FP, NOW, None, "did not grant a standing approval"),
    ({}, {"body": "Experiment fingerprint: `ffffffffffffffff`"}, FP, NOW, None, "the approved card had fingerprint"),
    ({}, {}, FP, NOW, ["bob"], "alice is not an allowed approver"),
    ({}, {}, FP, AT + timedelta(days=14), None, "expired at"),
])
def test_every_refusal_reason(changed_grant, changed_record, fingerprint, now, approvers, reason):
    out = refusals(grant(**changed_grant), record(**changed_record), fingerprint, now, approvers=approvers)
    assert any(reason in r for r in out), out


def test_no_record_of_the_granting_response_is_refused():
    assert refusals(grant(), None, FP, NOW) == ["no approval record for d run scheduled__1 task approve"]


def test_every_reason_is_listed_at_once():
    assert len(refusals(grant(granted_by="mallory"), record(run_type="manual"), "f" * 16, NOW)) == 3


@pytest.mark.parametrize("raw", ["{not json", "[]", '{"fingerprint": "x"}', ""])
def test_a_hand_edited_variable_is_malformed(raw):
    with pytest.raises(MalformedGrant):
        parse_grant(raw)


def test_a_grant_round_trips_and_revocation_keeps_it():
    g = grant()
    assert parse_grant(g.to_json()) == g
    assert parse_grant(g.revoked("carol", "t").to_json()).revoked_by == "carol"


def test_approval_deadline_is_a_minute_before_the_next_tick(monkeypatch):
    monkeypatch.delenv("RL_VERIFY_APPROVAL_TIMEOUT_S", raising=False)
    now = datetime(2026, 11, 30, 18, 0, tzinfo=timezone.utc)  # 02:00 Asia/Shanghai is 18:00 UTC
    assert settings.approval_timeout(now, "0 2 * * *") == timedelta(hours=23, minutes=59)
    assert settings.approval_timeout(now + timedelta(seconds=30), "* * * * *") == timedelta(minutes=1)
    assert settings.approval_timeout(now, None) is None
    monkeypatch.setenv("RL_VERIFY_APPROVAL_TIMEOUT_S", "45")
    assert settings.approval_timeout(now, "0 2 * * *") == timedelta(seconds=45)


def test_missed_ticks_are_the_ticks_strictly_between_two_scheduled_runs():
    previous = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)
    ticks = settings.missed_ticks(previous, previous + timedelta(minutes=4), "* * * * *")
    assert [t.minute for t in ticks] == [1, 2, 3]
    assert settings.missed_ticks(previous, previous + timedelta(minutes=1), "* * * * *") == []
