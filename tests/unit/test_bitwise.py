"""The bitwise lane's comparison (core.bitwise): identity only where the bits are the same, every doubt a
difference (a difference sends the suite to the full check; it never FAILs)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from rl_verify.core import bitwise

EXCLUDE = ("time/*", "*throughput*", "memory/*")


def _row(step, **metrics):
    return {"step": step, **{k.replace("__", "/"): v for k, v in metrics.items()}}


def test_values_read_back_from_the_trackers_json_are_compared_by_their_bits():
    value = 0.1 + 0.2  # 0.30000000000000004: repr round-trips every float64
    written = json.loads(json.dumps({"x": value}))["x"]
    assert bitwise.same_bits(value, written) is None
    assert bitwise.same_bits(value, 0.3) == "different bits"
    assert bitwise.same_bits(math.nextafter(1.0, 2.0), 1.0) == "different bits"  # one ulp is a difference


def test_minus_zero_int_against_float_and_absent_values_are_differences():
    assert bitwise.same_bits(-0.0, 0.0) == "different bits"
    assert bitwise.same_bits(1, 1.0) == "int against float"
    assert bitwise.same_bits(None, 1.0) == "absent in the reference"
    assert bitwise.same_bits(1.0, None) == "absent in this run"
    assert bitwise.same_bits(7, 7) is None


def test_a_nan_equals_only_a_nan_with_the_same_bits():
    nan = float("nan")
    other = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    assert math.isnan(other)
    assert bitwise.same_bits(nan, float("nan")) is None
    assert bitwise.same_bits(nan, json.loads(json.dumps(nan))) is None  # Python's json writes and reads NaN
    assert bitwise.same_bits(nan, other) == "different bits"
    assert bitwise.same_bits(nan, 0.0) == "different bits"


def test_only_numeric_fields_not_excluded_are_compared():
    row = _row(3, loss=0.5, time__step=12.3, rollout__throughput=99.0, memory__max_gib=40.1, tag="x", flag=True)
    assert bitwise.compared_fields(row, EXCLUDE) == {"loss": 0.5}
    assert set(bitwise.compared_fields(row)) == {"loss", "time/step", "rollout/throughput", "memory/max_gib"}


def test_a_step_differs_at_its_first_metric_in_sorted_order_whatever_the_key_order():
    ref = _row(2, b=1.0, a=2.0, c=3.0)
    cur = {"c": 3.5, "b": 1.5, "a": 2.0, "step": 2}
    diff = bitwise.step_difference(2, ref, cur, EXCLUDE)
    assert (diff.step, diff.metric, diff.reference, diff.current) == (2, "b", 1.0, 1.5)
    assert diff.line().startswith("step 2, b: reference 1.0 (0x1.0000000000000p+0), this run 1.5")


def test_missing_and_extra_metrics_are_differences_but_excluded_ones_are_not():
    ref = _row(1, loss=0.5, time__step=10.0)
    assert bitwise.step_difference(1, ref, _row(1, loss=0.5, time__step=11.0), EXCLUDE) is None
    missing = bitwise.step_difference(1, ref, _row(1, time__step=10.0), EXCLUDE)
    assert (missing.metric, missing.why) == ("loss", "absent in this run")
    extra = bitwise.step_difference(1, ref, _row(1, loss=0.5, grad_norm=1.0), EXCLUDE)
    assert (extra.metric, extra.why) == ("grad_norm", "absent in the reference")


def _run(n, **changed_at):
    return [_row(s, loss=1.0 / (s + 1), reward=0.1 * s + (changed_at.get("reward") == s) * 1e-12,
                 time__step=5.0 + s) for s in range(n)]


def test_k_identical_steps_make_the_lane_identical_and_done():
    reading = bitwise.read_lane(_run(10), _run(4), steps=4, exclude=EXCLUDE)
    assert (reading.identical, reading.done, reading.steps_seen, reading.difference) == (True, True, 4, None)


def test_a_run_still_training_is_read_as_far_as_it_has_come():
    reading = bitwise.read_lane(_run(10), _run(2), steps=4, exclude=EXCLUDE)
    assert (reading.identical, reading.done, reading.steps_seen) == (False, False, 2)


def test_the_first_differing_step_ends_the_lane_even_if_later_steps_agree():
    reading = bitwise.read_lane(_run(10), _run(10, reward=2), steps=6, exclude=EXCLUDE)
    assert reading.done and not reading.identical and reading.steps_seen == 2
    assert (reading.difference.step, reading.difference.metric) == (2, "reward")


def test_a_difference_after_the_lanes_steps_is_not_seen_the_blind_spot():
    reading = bitwise.read_lane(_run(10), _run(10, reward=7), steps=5, exclude=EXCLUDE)
    assert reading.identical


def test_a_reference_shorter_than_the_lane_is_a_difference_not_an_identity():
    reading = bitwise.read_lane(_run(3), _run(5), steps=5, exclude=EXCLUDE)
    assert reading.done and not reading.identical
    assert (reading.difference.step, reading.difference.why) == (3, "step absent in the reference")


def test_rows_without_an_integer_step_are_not_steps_and_a_resumed_steps_last_row_counts():
    rows = [{"loss": 1.0}, {"step": True, "loss": 2.0}, _row(0, loss=3.0), _row(0, loss=4.0)]
    assert bitwise.by_step(rows) == {0: _row(0, loss=4.0)}


def test_fingerprints_ignore_key_order_and_change_with_any_fact():
    env = {"gpu": "NVIDIA H200", "count": 8, "driver": "580.159.04", "packages": {"torch": "2.8.0"}}
    same = {"packages": {"torch": "2.8.0"}, "driver": "580.159.04", "count": 8, "gpu": "NVIDIA H200"}
    assert bitwise.fingerprint(env) == bitwise.fingerprint(same)
    assert bitwise.fingerprint(env) != bitwise.fingerprint({**env, "driver": "580.159.05"})
    assert len(bitwise.fingerprint(env)) == 16


@pytest.mark.parametrize("changed", ["suite", "experiment", "environment", "lane"])
def test_a_reference_key_changes_with_its_suite_experiment_environment_or_lane_config(changed):
    parts = {"suite": "opd", "experiment": "e1", "environment": "f1", "lane": {"steps": 6, "env": {"A": "1"}}}
    key = bitwise.reference_key(**parts)
    parts[changed] = {"steps": 7, "env": {"A": "1"}} if changed == "lane" else parts[changed] + "x"
    assert bitwise.reference_key(**parts) != key
