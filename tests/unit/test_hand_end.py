"""A DAG run ended by hand: told apart from the runs Airflow ends itself, and never read as a success."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from rl_verify.orchestration import hand_end, verification

NEVER = verification.NEVER_SKIPPED


def test_a_run_marked_failed_while_it_trains_is_ended_by_hand_and_its_final_state_fails_naming_the_task():
    states = {"approve": "success", "run_grpo": "failed", "fetch_grpo": "skipped", "cleanup": "running",
              "report": "skipped", "verdict": "skipped", "announce_verified": "skipped"}
    assert hand_end.ended_by_hand(states, NEVER)
    with pytest.raises(AirflowFailException, match=r"ended by hand before its verdict \(failed: run_grpo\)"):
        hand_end.final_state(states, NEVER)


def test_a_run_marked_while_its_tasks_only_wait_in_a_queue_is_ended_by_hand_too():
    states = {"run_grpo": "skipped", "report": "skipped", "verdict": "skipped"}
    with pytest.raises(AirflowFailException, match="its unfinished tasks skipped"):
        hand_end.final_state(states, NEVER)


@pytest.mark.parametrize("states", [
    # a normal run: the teardown runs beside the report, before the verdict has a state
    {"run_grpo": "success", "cleanup": "success", "report": "running", "verdict": None},
    # an infrastructure FAIL: the training failed on its own, the report and verdict still run
    {"run_grpo": "failed", "fetch_grpo": "success", "report": None, "verdict": None},
    # a rejected card skips the trainings, never the report
    {"approve": "success", "run_grpo": "skipped", "report": "success", "verdict": "failed"},
])
def test_runs_airflow_ends_itself_are_not_ended_by_hand(states):
    assert not hand_end.ended_by_hand(states, NEVER)
    assert "not ended by hand" in hand_end.final_state(states, NEVER)


def test_a_calibration_marked_while_its_approval_waits_is_told_from_a_rejection():
    pair = [("approve_promotion", "promote")]
    never = ("fetch_runs", "propose", "approve_promotion")
    marked = {"fetch_runs": "success", "propose": "success", "approve_promotion": "failed", "promote": "skipped"}
    rejected = {"fetch_runs": "success", "propose": "success", "approve_promotion": "success", "promote": "skipped"}
    timed_out = {"fetch_runs": "success", "propose": "success", "approve_promotion": "failed",
                 "promote": "upstream_failed"}
    assert hand_end.ended_by_hand(marked, never, pair)
    assert not hand_end.ended_by_hand(rejected, never, pair) and not hand_end.ended_by_hand(timed_out, never, pair)
    assert hand_end.ended_by_hand({"train": "failed", "fetch_runs": "skipped"}, never, pair)


class _TI:
    dag_id, run_id = "d", "r"

    def __init__(self, states):
        self.states = states

    def get_task_states(self, dag_id, run_ids):
        assert (dag_id, run_ids) == ("d", ["r"])
        return {"r": self.states}


def test_task_states_are_read_as_plain_words_whatever_airflow_returns():
    class State:
        value = "skipped"

    assert hand_end.run_task_states(_TI({"report": State(), "verdict": "failed"})) == \
        {"report": "skipped", "verdict": "failed"}
