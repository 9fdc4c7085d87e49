"""The bitwise lane's watch of a growing tracker (core.bitwise.LaneWatch), its reference store (store.references)
and the pieces of orchestration.bitwise_lane that need no Airflow."""

from __future__ import annotations

import json
import math
import re

import pytest

from rl_verify.core import bitwise
from rl_verify.engines import load_suite
from rl_verify.orchestration import bitwise_lane
from rl_verify.store import references

EXCLUDE = ("time/*",)


def _rows(values: dict[int, float], nan_at: int | None = None) -> list[dict]:
    """A tracker's rows: the step-0 eval row, then per step a mini-batch row and its summary row."""
    out = [{"step": 0, "eval/accuracy": 0.5, "time/step": 1.0}]
    for step, loss in values.items():
        out.append({"step": step, "mini_batch": 0, "loss": loss + 1.0})
        out.append({"step": step, "loss": math.nan if step == nan_at else loss, "reward": loss / 2,
                    "time/step": 1.0 + step})
    return out


def _poll(path: str, start: int, data: bytes, size: int | None = None) -> bytes:
    return f"{path} {start} {start + len(data) if size is None else size}\n".encode() + data


def _jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _watch(reference: list[dict] | None, steps: int = 3) -> bitwise.LaneWatch:
    return bitwise.LaneWatch({"work_dir": "/w", "tracker_glob": "*/t.jsonl", "steps": steps, "exclude": EXCLUDE,
                              "reference": reference})


def _reference(values: dict[int, float]) -> list[dict]:
    feed = bitwise.LaneFeed(EXCLUDE)
    feed.feed(_jsonl(_rows(values)))
    return feed.rows()


def test_the_same_bits_over_k_steps_read_as_identical_once_the_step_after_them_began():
    values = {1: 0.25, 2: 0.125, 3: 0.0625}
    watch = _watch(_reference(values))
    data = _jsonl(_rows(values))
    first_of_3 = data.index(b"\n", data.index(b'"step": 3')) + 1  # step 3's mini-batch row: step 2 is complete
    watch.take(_poll("/w/x/t.jsonl", 0, data[:data.index(b'"step": 3')]))
    assert not watch.reading().done  # step 2 may still be missing its summary row
    watch = _watch(watch.reference)
    watch.take(_poll("/w/x/t.jsonl", 0, data[:first_of_3]))
    reading = watch.reading()
    assert reading.identical and reading.done and reading.steps_seen == 3
    assert [r["step"] for r in watch.summary()["rows"]] == [0, 1, 2]
    assert "time/step" not in watch.summary()["rows"][1]  # excluded fields are not compared, nor kept


def test_half_a_step_read_before_its_summary_row_is_never_a_difference():
    values = {1: 0.25, 2: 0.125}
    watch = _watch(_reference(values))
    data = _jsonl(_rows(values))
    cut = data.index(b'"loss": 0.125')  # step 2's mini-batch row read, its summary row not yet
    watch.take(_poll("/w/x/t.jsonl", 0, data[:cut - 20]))
    reading = watch.reading()
    assert reading.difference is None and not reading.done


def test_a_differing_value_stops_the_lane_at_its_step_with_both_values():
    watch = _watch(_reference({1: 0.25, 2: 0.125, 3: 0.0}))
    watch.take(_poll("/w/x/t.jsonl", 0, _jsonl(_rows({1: 0.25, 2: 0.12500000000000003, 3: 0.0}))))
    found = watch.summary()
    assert found["done"] and not found["identical"]
    assert (found["difference"]["step"], found["difference"]["metric"]) == (2, "loss")
    assert "0.125" in found["difference"]["line"] and "0.12500000000000003" in found["difference"]["line"]


def test_a_nan_against_a_number_differs_and_two_nans_do_not():
    ref = _reference({1: 0.25, 2: 0.5})
    differs = _watch(ref)
    rows = _rows({1: 0.25, 2: 0.5}, nan_at=1)
    differs.take(_poll("/w/x/t.jsonl", 0, _jsonl(rows)))
    assert differs.reading(ended=True).difference.step == 1
    same = _watch(differs.feed.rows())
    same.take(_poll("/w/x/t.jsonl", 0, _jsonl(rows)))
    assert same.reading(ended=True).identical


def test_a_job_that_ended_short_of_k_steps_is_not_identical():
    watch = _watch(_reference({1: 0.25, 2: 0.125}))
    watch.take(_poll("/w/x/t.jsonl", 0, _jsonl(_rows({1: 0.25}))))
    reading = watch.reading(ended=True)
    assert not reading.identical and not reading.done and reading.steps_seen == 2


def test_recording_without_a_reference_is_done_when_k_steps_are_in():
    watch = _watch(None, steps=2)
    watch.take(_poll("/w/x/t.jsonl", 0, _jsonl(_rows({1: 0.25, 2: 0.125}))))
    found = watch.summary()
    assert found["identical"] and [r["step"] for r in found["rows"]] == [0, 1]


def test_a_new_tracker_file_is_read_from_its_start():
    watch = _watch(None, steps=1)
    assert watch.take(_poll("/w/new/t.jsonl", 100, b"", size=300)) is True  # re-read from 0
    assert watch.offset == 0 and watch.tracker_path == "/w/new/t.jsonl"


def test_a_reference_is_kept_and_found_by_its_key_only(tmp_path):
    root = str(tmp_path)
    key = bitwise.reference_key("grpo", "exp1", "env1", {"steps": 3})
    assert references.get(key, root) is None and references.state(None) == "absent"
    references.put(key, {"state": references.TRUSTED, "rows": [{"step": 0, "x": 0.1}]}, root)
    assert references.get(key, root)["rows"][0]["x"] == 0.1
    assert references.state(references.get(key, root)) == "trusted"
    assert references.get(bitwise.reference_key("grpo", "exp1", "env2", {"steps": 3}), root) is None
    with pytest.raises(ValueError, match="state"):
        references.put(key, {"state": "maybe"}, root)
    with pytest.raises(ValueError, match="fingerprint"):
        references.get("../x", root)


def test_the_lane_spec_launches_deterministically_with_its_own_backend():
    spec = load_suite("grpo")
    lane = bitwise_lane.lane_spec(spec)
    assert lane.env["XTUNER_DETERMINISTIC"] == "true" and lane.args[1] == "sglang"
    assert spec.args[1] == "lmdeploy"  # the full verification's launch is unchanged
    opd = bitwise_lane.lane_spec(load_suite("opd"))
    assert opd.env["XTUNER_USE_LMDEPLOY"] == "0" and opd.env["MODEL_PATH"]  # the suite's own env kept
    assert bitwise_lane.lane_config(spec)["steps"] == 3


def test_a_candidate_is_trusted_only_when_its_two_runs_agree():
    entry = {"key": "k", "environment": "e"}
    first = {"steps": 3, "rows": [{"step": 0, "x": 1.0}]}
    trusted = bitwise_lane.candidate(first, {"identical": True}, entry)
    assert trusted["state"] == "trusted" and trusted["rows"] == first["rows"]
    off = bitwise_lane.candidate(first, {"identical": False, "difference": {"line": "step 1, loss: ..."}}, entry)
    assert off["state"] == "not reproducible" and off["rows"] == [] and "step 1, loss" in off["self_check"]


# --- which suites run the lane (bitwise_lane.decide) and what the card and the report say ---------------------

def _resolved(**change) -> dict:
    return {"suites": ["grpo", "opd"], "node": "n1", "run_dir": "/r", "worktree": "/w", "sha": "b" * 40,
            "suite_fingerprints": {"grpo": "fg", "opd": "fo"}, "lane": "auto", **change}


ENV = {"n1": {"fingerprint": "env1"}}


def _keep(suite: str, state: str, environment: str = "env1") -> None:
    spec = load_suite(suite)
    key = bitwise.reference_key(suite, "fg" if suite == "grpo" else "fo", environment, bitwise_lane.lane_config(spec))
    references.put(key, {"state": state, "sha": "a" * 40, "rows": [], "self_check": "2 deterministic runs agreed"})


@pytest.fixture()
def store(tmp_path, monkeypatch):
    from rl_verify import settings

    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    # the diff: SSH
    monkeypatch.setattr(bitwise_lane, "_changed_since", lambda conn, spec, key, kept, head: ([], "", None, ""))
    return tmp_path


def test_without_a_reference_the_suite_is_verified_in_full_and_its_pass_makes_one(store):
    lanes = bitwise_lane.decide(_resolved(), ENV)
    assert {s: e["choice"] for s, e in lanes.items()} == {"grpo": "full", "opd": "full"}
    assert all(e["make_reference"] for e in lanes.values())
    assert "no bitwise reference for this environment yet" in lanes["grpo"]["why"]
    assert "A bitwise reference is made after its PASS" in " ".join(bitwise_lane.card_notes({"lanes": lanes}))


def test_a_trusted_reference_of_this_environment_sends_the_suite_to_the_lane(store):
    _keep("grpo", "trusted")
    lanes = bitwise_lane.decide(_resolved(), ENV)
    assert lanes["grpo"]["choice"] == "bitwise" and lanes["grpo"]["reference"]["sha"] == "a" * 40
    assert lanes["opd"]["choice"] == "full"  # its own key: no reference
    line = bitwise_lane.card_notes({"lanes": lanes})[0]
    assert line.startswith("grpo: bitwise lane first: 3 deterministic steps") and line.endswith(
        "(a trusted reference exists for this environment and the diff touches no path that turns the lane off).")


def test_no_card_line_about_the_lane_shows_a_placeholder(store):
    """Issue 42: a string without its f showed the approver a raw "({entry['why']})"."""
    _keep("grpo", "trusted")
    lanes = bitwise_lane.decide(_resolved(), ENV)
    read = bitwise_lane.decide(_resolved(contradicted={"grpo": "grpo ended FAIL (reproduced) at this commit"}), ENV)
    for entries in (lanes, read):
        for line in bitwise_lane.card_notes({"lanes": entries}):
            assert not re.search(r"\{[^}]*\}", line), line


def test_a_fail_of_this_commit_in_the_record_sends_the_suite_to_the_full_check_and_reads_its_bits(store):
    _keep("grpo", "trusted")
    why = "grpo ended FAIL (reproduced), accuracy at this commit in run manual__f (its report: /r)"
    entry = bitwise_lane.decide(_resolved(contradicted={"grpo": why}), ENV)["grpo"]
    assert entry["choice"] == "full" and entry["why"] == f"the record contradicts a shortcut: {why}"
    assert entry["read_lane"]  # the lane job reads its bits (never a verdict): a FAIL then marks the reference blind
    (line,) = [n for n in bitwise_lane.card_notes({"lanes": {"grpo": entry}})]
    assert "the record contradicts a shortcut" in line and "never a verdict" in line
    # Without a trusted reference there are no bits to read.
    assert not bitwise_lane.decide(_resolved(suites=["opd"], contradicted={"opd": why}), ENV)["opd"]["read_lane"]


def test_a_disabled_by_pattern_that_names_no_file_turns_the_lane_off_naming_it_and_the_fix(store):
    _keep("grpo", "trusted")
    stale = {"grpo": {"disabled_by": ["xtuner/v1/rl/rollout/lmdeploy.py"]}}
    entry = bitwise_lane.decide(_resolved(stale=stale), ENV)["grpo"]
    assert entry["choice"] == "full" and "'xtuner/v1/rl/rollout/lmdeploy.py' match no file of the checkout" in \
        entry["why"] and "fix: name the checkout's current paths" in entry["why"]


def test_a_reference_a_failing_commit_shared_bits_with_is_blind_until_a_new_full_pass(store):
    from rl_verify.store import record

    _keep("grpo", "trusted")
    entry = bitwise_lane.decide(_resolved(suites=["grpo"]), ENV)["grpo"]
    kept = references.get(entry["key"])
    run_id = "manual__fail-again"
    record.put_json(run_id, "grpo/lane.json", {"key": entry["key"], "identical": True, "steps": 3,
                                               "reference": {"sha": "a" * 40, "made_at": kept.get("made_at")}})
    outcome = {"outcome": "FAIL (reproduced)", "runs": [{"failure_class": "accuracy"}]}
    # An infrastructure FAIL says nothing of the numbers; a PASS marks nothing.
    assert bitwise_lane.mark_blind(run_id, {"grpo": {**outcome, "runs": [{"failure_class": "infrastructure"}]}},
                                   "b" * 40, "/r") == []
    assert bitwise_lane.mark_blind(run_id, {"grpo": {"outcome": "PASS", "runs": [{}]}}, "b" * 40, "/r") == []
    (line,) = bitwise_lane.mark_blind(run_id, {"grpo": outcome}, "b" * 40, "/r")
    assert "blind to this regression" in line
    later = bitwise_lane.decide(_resolved(suites=["grpo"], sha="c" * 40), ENV)["grpo"]
    assert later["choice"] == "full" and "blind to a regression the record knows (bbbbbbbbb has its first 3 " \
        "steps' bits and ended FAIL (reproduced)" in later["why"]
    assert later["make_reference"]  # a new full PASS makes a new, seeing reference


def test_a_changed_environment_finds_no_reference_and_the_lane_is_not_applicable(store):
    _keep("grpo", "trusted", environment="env-before-the-driver-upgrade")
    lanes = bitwise_lane.decide(_resolved(), ENV)
    assert lanes["grpo"]["choice"] == "full" and "no bitwise reference for this environment" in lanes["grpo"]["why"]


BEFORE = {"gpu": "NVIDIA H200", "gpu_count": 8, "driver": "580.159.04", "cuda": "13.0",
          "packages": {"torch": "2.8.0", "sglang": "0.5.3", "ray": None}}


def _environments(facts: dict) -> dict:
    return {"n1": {**facts, "fingerprint": bitwise.fingerprint(facts)}}


def test_a_changed_environment_names_what_changed_since_the_last_reference(store):
    # A full PASS on the old environment kept its reference through candidate and promote, as the DAG does.
    entry = bitwise_lane.decide(_resolved(suites=["grpo"]), _environments(BEFORE))["grpo"]
    made = bitwise_lane.candidate({"steps": 3, "rows": [{"step": 0, "x": 1.0}]}, {"identical": True}, entry)
    references.put(entry["key"], {**made, "suite": "grpo", "sha": "a" * 40, "made_at": "2026-12-01T00:00:00+00:00"})
    assert bitwise_lane.decide(_resolved(suites=["grpo"]), _environments(BEFORE))["grpo"]["choice"] == "bitwise"

    after = {**BEFORE, "driver": "580.200.01", "packages": {**BEFORE["packages"], "sglang": "0.5.4"}}
    moved = bitwise_lane.decide(_resolved(suites=["grpo"]), _environments(after))["grpo"]
    assert moved["choice"] == "full" and moved["make_reference"]
    assert moved["why"].startswith("the environment changed since the reference of aaaaaaaaaaaa (driver 580.159.04 "
                                   "-> 580.200.01; sglang 0.5.3 -> 0.5.4): no bitwise reference for this environment")
    # Another experiment (a new baseline) has no reference of its own to compare with: no environment named.
    fresh = bitwise_lane.decide(_resolved(suites=["grpo"], suite_fingerprints={"grpo": "other"}),
                                _environments(after))["grpo"]
    assert fresh["why"].startswith("no bitwise reference for this environment yet")


def test_environment_changes_names_each_fact_and_package_that_differs():
    after = {**BEFORE, "gpu_count": 4, "packages": {"torch": "2.9.0", "sglang": "0.5.3", "triton": "3.4.0"}}
    assert bitwise.environment_changes(BEFORE, after) == ["gpu_count 8 -> 4", "torch 2.8.0 -> 2.9.0",
                                                          "triton (none) -> 3.4.0"]
    assert bitwise.environment_changes(BEFORE, {**BEFORE, "fingerprint": "x"}) == []


def test_a_failed_self_check_turns_the_lane_off_for_its_key_and_makes_no_new_reference(store):
    _keep("grpo", "not reproducible")
    entry = bitwise_lane.decide(_resolved(), ENV)["grpo"]
    assert entry["choice"] == "full" and "not reproducible on this environment" in entry["why"]
    assert not entry["make_reference"]


def test_lane_full_and_unchanged_suites_get_no_lane(store):
    _keep("grpo", "trusted")
    assert bitwise_lane.decide(_resolved(lane="full"), ENV) == {}
    assert "grpo" not in bitwise_lane.decide(_resolved(unchanged={"grpo": {}}), ENV)


def test_a_diff_touching_code_the_deterministic_mode_bypasses_turns_the_lane_off(store, monkeypatch):
    _keep("grpo", "trusted")
    monkeypatch.setattr(bitwise_lane, "_changed_since", lambda conn, spec, key, kept, head: (
        ["docs/a.md", "xtuner/v1/rl/rollout/lmdeploy.py"], "", None, ""))
    entry = bitwise_lane.decide(_resolved(), ENV)["grpo"]
    assert entry["choice"] == "full" and "bypasses: xtuner/v1/rl/rollout/lmdeploy.py" in entry["why"]
    assert entry["make_reference"]  # its full PASS makes the next reference: the lane is off for this commit only


def test_a_scheduled_run_verifies_in_full_when_the_last_full_verification_is_too_old(store):
    import time

    _keep("grpo", "trusted")
    old = time.time() - 8 * 86400
    entry = bitwise_lane.decide(_resolved(scheduled=True, last_full={"grpo": old}), ENV)["grpo"]
    assert entry["choice"] == "full" and "every 7 days" in entry["why"]
    fresh = bitwise_lane.decide(_resolved(scheduled=True, last_full={"grpo": time.time() - 86400}), ENV)["grpo"]
    assert fresh["choice"] == "bitwise"


def test_the_report_says_why_the_lane_was_not_used_and_where_a_lane_parted(tmp_path):
    from rl_verify.store import record

    record.write_json(tmp_path / bitwise_lane.LANES_FILE, {
        "grpo": {"choice": "bitwise", "why": "-"},
        "opd": {"choice": "full", "why": "the bitwise lane is off: not reproducible on this environment"}})
    record.write_json(tmp_path / "grpo" / bitwise_lane.LANE_FILE, {
        "identical": False, "reference": {"sha": "a" * 40},
        "difference": {"line": "step 0, loss: reference 0.5, this run 0.25"}})
    lines = bitwise_lane.report_notes(tmp_path, ["grpo", "opd"])
    assert "not the same bits as the reference of aaaaaaaaaaaa: step 0, loss" in lines[0]
    assert "verified in full instead" in lines[0]
    assert lines[1] == "opd: bitwise lane not applicable: the bitwise lane is off: not reproducible on this " \
                       "environment."


def test_a_step_whose_summary_row_was_read_counts_without_waiting_for_the_next_step():
    from rl_verify.core.tracker import MARKER

    assert bitwise.SUMMARY_FIELD == MARKER  # the tracker's own summary-row marker
    rows = [{"step": 0, "eval/accuracy": 0.5}, {"step": 1, "loss": 0.3},
            {"step": 1, "loss": 0.25, MARKER: 0.4}]
    watch = _watch(None, steps=2)
    watch.take(_poll("/w/x/t.jsonl", 0, _jsonl(rows[:2])))
    assert watch.reading().steps_seen == 1  # step 1's mini-batch row only: not yet
    watch.take(_poll("/w/x/t.jsonl", watch.offset, _jsonl(rows[2:])))
    assert watch.reading().identical and watch.summary()["rows"][1]["loss"] == 0.25


def test_a_pass_message_says_which_suites_had_no_full_training_and_what_their_pass_rests_on():
    from rl_verify.orchestration import notify

    reason = ("its first 3 deterministic steps are the same bits as the reference of the verified commit "
              "aaaaaaaaaaaa on this environment (75d428d93aefbbc2)")
    summary = {"verdict": "PASS", "suites": [
        {"suite": "grpo", "verdict": "PASS", "outcome": "PASS (bitwise)", "runs": 0, "outcome_reason": reason},
        {"suite": "opd", "verdict": "PASS", "outcome": "PASS", "runs": 1, "outcome_reason": ""}]}
    _, body = notify.verdict(summary, "main (abc)", "manual__1", None)
    assert f"grpo PASS (bitwise), no full training: {reason}" in body.splitlines()
    assert not any(line.startswith("opd") for line in body.splitlines())
