"""Which verification a suite gets (core.lane.choose): the cheap answer only when nothing says it may be wrong."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rl_verify.core import lane

NOW = datetime(2026, 12, 5, 3, 0, tzinfo=timezone.utc)
PASS = "a" * 40


def _choose(**change):
    facts = dict(requested="auto", scheduled=False, verified_pass=PASS, affecting=["xtuner/v1/rl/loss.py"],
                 has_lane=True, lane_disabling=[], reference="trusted", last_full_at=NOW - timedelta(days=1),
                 now=NOW, full_every_days=7)
    return lane.choose(**{**facts, **change})


def test_a_diff_touching_no_affecting_path_since_a_verified_pass_needs_no_training():
    got = _choose(affecting=[], scheduled=True)
    assert got.choice == "unchanged" and "aaaaaaaaaaaa" in got.why


def test_full_asked_or_a_scheduled_full_due_trains_even_an_unchanged_suite():
    assert _choose(affecting=[], requested="full").choice == "full"
    due = _choose(affecting=[], scheduled=True, last_full_at=NOW - timedelta(days=8))
    assert due.choice == "full" and "8.0 days ago" in due.why


def test_without_a_verified_pass_nothing_is_skipped():
    assert _choose(affecting=[], verified_pass=None).choice == "bitwise"


def test_a_trusted_reference_and_an_untouched_lane_give_the_bitwise_lane():
    assert _choose().choice == "bitwise"


@pytest.mark.parametrize(("change", "said"), [
    ({"requested": "full"}, "lane = full"),
    ({"has_lane": False}, "declares no bitwise lane"),
    ({"lane_disabling": ["xtuner/v1/ray/rollout/lmdeploy/worker.py"]}, "lmdeploy/worker.py"),
    ({"reference": "absent"}, "no bitwise reference for this environment yet"),
    ({"reference": "not reproducible"}, "not reproducible on this environment"),
    ({"scheduled": True, "last_full_at": NOW - timedelta(days=7)}, "the last one was 7.0 days ago"),
    ({"scheduled": True, "last_full_at": None}, "there was none"),
])
def test_every_doubt_gives_the_full_verification_and_says_why(change, said):
    got = _choose(**change)
    assert got.choice == "full" and said in got.why, got


def test_the_full_every_policy_binds_scheduled_runs_only():
    assert _choose(scheduled=False, last_full_at=NOW - timedelta(days=30)).choice == "bitwise"
    assert _choose(scheduled=True, last_full_at=NOW - timedelta(days=6, hours=23)).choice == "bitwise"
    assert _choose(scheduled=True, last_full_at=NOW - timedelta(days=2), full_every_days=1).choice == "full"


def test_many_disabling_files_are_named_five_then_counted():
    got = _choose(lane_disabling=[f"xtuner/v1/ops/fa3_{i}.py" for i in range(8)])
    assert got.why.endswith("fa3_4.py and 3 more")


def test_an_unknown_lane_request_is_refused_with_the_values_it_can_take():
    with pytest.raises(ValueError, match="lane 'fast' is not one of auto, skip, full"):
        _choose(requested="fast")


def test_a_bisection_uses_the_lane_only_when_the_regression_shows_within_its_steps():
    assert lane.for_bisection(0, [3, 3])[0] == "auto"
    assert lane.for_bisection(2, [3])[0] == "auto"
    skip, why = lane.for_bisection(10, [3, 3])
    assert skip == "full" and "step 10, not within the lane's 3 steps" in why and "blind spot" in why
    assert lane.for_bisection(None, [3])[0] == "full"  # a bisection started by hand: onset unknown
    assert lane.for_bisection(0, []) == ("full", "no suite of the bisection declares a bitwise lane")


def test_lane_skip_keeps_the_path_aware_skip_and_turns_the_bitwise_lane_off():
    kw = dict(scheduled=False, has_lane=True, lane_disabling=[], reference="trusted", last_full_at=None,
              now=datetime(2026, 12, 5, tzinfo=timezone.utc), full_every_days=7)
    assert lane.choose(requested="skip", verified_pass="a" * 40, affecting=[], **kw).choice == "unchanged"
    assert lane.choose(requested="skip", verified_pass="a" * 40, affecting=["x.py"], **kw).choice == "full"
    assert lane.choose(requested="auto", verified_pass="a" * 40, affecting=["x.py"], **kw).choice == "bitwise"
