"""Pins the tracker reader's rules: row classification, partial last line, bad input, NaN/Inf."""

from __future__ import annotations

import json
import math
import tracemalloc

import pytest

from conftest import dump_rows, grpo_rows
from rl_verify.core.errors import InputError
from rl_verify.core.tracker import read_tracker, write_sanitised

WANTED = ["response/rewards/mean", "time/step", "eval/accuracy"]


def test_counts_only_rows_with_the_step_marker_as_steps(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", grpo_rows(steps=7, minibatch_rows=True))
    tracker = read_tracker(path, WANTED)
    assert tracker.steps == 7
    assert [r.step for r in tracker.rows] == list(range(1, 8))


def test_initial_eval_row_is_not_a_step_but_its_eval_values_are_kept(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [{"step": 0, "eval/accuracy": 0.61},
                                            {"step": 1, "response/rewards/mean": 0.5}])
    tracker = read_tracker(path, WANTED)
    assert tracker.steps == 1
    assert tracker.value_at("eval/accuracy", 0).value == 0.61


def test_eval_values_found_in_separate_rows_and_in_merged_summary_rows(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [
        {"step": 5, "response/rewards/mean": 0.5},
        {"eval/accuracy": 0.7, "step": 5},                                   # separate eval row
        {"step": 10, "eval/accuracy": 0.8, "response/rewards/mean": 0.6},   # merged into the summary row
    ])
    tracker = read_tracker(path, WANTED)
    assert tracker.value_at("eval/accuracy", 5).value == 0.7
    assert tracker.value_at("eval/accuracy", 10).value == 0.8
    assert tracker.last["eval/accuracy"].value == 0.8


def test_minibatch_rows_do_not_supply_training_metrics(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [{"step": 1, "time/step": 99.0},
                                            {"step": 1, "response/rewards/mean": 0.5, "time/step": 3.0}])
    tracker = read_tracker(path, WANTED)
    assert tracker.value_at("time/step", 1).value == 3.0


def test_key_order_extra_keys_ints_and_float_steps_are_tolerated(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [{"zzz": [1, 2], "response/rewards/mean": 1, "step": 1.0},
                                            {"response/rewards/mean": 0.25, "step": 2, "meta": {"a": "b"}}])
    tracker = read_tracker(path, WANTED)
    assert [(p.step, p.value) for p in tracker.series("response/rewards/mean")] == [(1, 1.0), (2, 0.25)]


def test_only_wanted_metrics_are_kept(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", grpo_rows(steps=3))
    tracker = read_tracker(path, ["time/step"])
    assert all(set(r.values) == {"time/step"} for r in tracker.rows)


def test_partial_last_line_is_dropped_and_reported(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", grpo_rows(steps=3), tail='{"step": 4, "response/rewards/me')
    tracker = read_tracker(path, WANTED)
    assert tracker.steps == 3
    assert tracker.partial_last_line
    assert any("partial last line dropped" in a and ":8:" in a for a in tracker.abnormal)


def test_unparseable_last_line_with_newline_is_also_treated_as_partial(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", grpo_rows(steps=2) + ['{"step": 3, "resp'])
    tracker = read_tracker(path, WANTED)
    assert tracker.steps == 2 and tracker.partial_last_line


def test_last_line_cut_inside_a_utf8_character_is_partial(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"step": 1, "response/rewards/mean": 0.5}\n{"step": 2, "note": "\xe4\xb8')
    tracker = read_tracker(path, WANTED)
    assert tracker.steps == 1 and tracker.partial_last_line


def test_complete_last_row_without_newline_is_kept(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [{"step": 1, "response/rewards/mean": 0.5}],
                     tail='{"step": 2, "response/rewards/mean": 0.6}')
    tracker = read_tracker(path, WANTED)
    assert tracker.steps == 2 and not tracker.partial_last_line
    assert any("no trailing newline" in a for a in tracker.abnormal)


def test_malformed_line_in_the_middle_is_an_input_error_naming_file_and_line(tmp_path):
    rows = grpo_rows(steps=3, minibatch_rows=False)
    path = dump_rows(tmp_path / "t.jsonl", rows[:2] + ['{"step": 2, "response/rewards/mean": 0.5'] + rows[2:])
    with pytest.raises(InputError) as err:
        read_tracker(path, WANTED)
    assert f"{path}:3" in str(err.value) and "Fix:" in str(err.value)


def test_empty_file_is_an_input_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("")
    with pytest.raises(InputError, match="empty"):
        read_tracker(path, WANTED)


def test_file_with_only_a_partial_line_is_an_input_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "resp')
    with pytest.raises(InputError, match="no complete row"):
        read_tracker(path, WANTED)


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_tracker(tmp_path / "absent.jsonl", WANTED)


def test_non_utf8_line_is_an_input_error_with_line_number(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"step": 1, "response/rewards/mean": 0.5}\n{"step": 2, "x": "\xff"}\n'
                     b'{"step": 3, "response/rewards/mean": 0.5}\n')
    with pytest.raises(InputError, match=r":2: line is not valid UTF-8"):
        read_tracker(path, WANTED)


def test_non_object_line_is_an_input_error(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", ["[1, 2]", {"step": 1, "response/rewards/mean": 0.5}])
    with pytest.raises(InputError, match=r":1: line is JSON but not an object"):
        read_tracker(path, WANTED)


def test_summary_row_without_integer_step_is_an_input_error(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [{"step": "one", "response/rewards/mean": 0.5}, {"step": 2}])
    with pytest.raises(InputError, match=r":1: step-summary row"):
        read_tracker(path, WANTED)


def test_nan_and_infinity_in_a_checked_metric_are_kept_and_reported(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "response/rewards/mean": NaN, "time/step": Infinity}\n'
                    '{"step": 2, "response/rewards/mean": 0.5, "time/step": 1}\n')
    tracker = read_tracker(path, WANTED)
    assert math.isnan(tracker.rows[0].values["response/rewards/mean"])
    assert math.isinf(tracker.rows[0].values["time/step"])
    assert any("response/rewards/mean is NaN at step 1" in a for a in tracker.abnormal)
    assert any("time/step is Infinity at step 1" in a for a in tracker.abnormal)


def test_nan_in_an_unchecked_metric_is_not_reported(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "response/rewards/mean": 0.5, "other": NaN}\n')
    assert read_tracker(path, WANTED).abnormal == []


def test_non_numeric_checked_value_becomes_nan_and_is_reported(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", [{"step": 1, "response/rewards/mean": None}])
    tracker = read_tracker(path, WANTED)
    assert math.isnan(tracker.rows[0].values["response/rewards/mean"])
    assert any("non-numeric" in a for a in tracker.abnormal)


def test_sanitised_copy_drops_partial_last_line_and_blank_lines_and_keeps_bytes(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text('{"step": 1, "response/rewards/mean": NaN}\n\n{"step": 2, "response/rewards/mean": 0.5}\n'
                   '{"step": 3, "resp')
    tracker = read_tracker(src, WANTED)
    copy = write_sanitised(tracker, tmp_path / "copy" / "t.jsonl")
    lines = copy.read_text().splitlines()
    assert lines == ['{"step": 1, "response/rewards/mean": NaN}', '{"step": 2, "response/rewards/mean": 0.5}']
    for line in lines:
        json.loads(line)  # what the checker does with every line


def test_memory_grows_with_checked_metrics_not_with_unchecked_columns(tmp_path):
    wide = [{"step": i, "response/rewards/mean": 0.5, **{f"noise/{k}": float(k) for k in range(200)}}
            for i in range(1, 301)]
    path = dump_rows(tmp_path / "wide.jsonl", wide)
    tracemalloc.start()
    tracker = read_tracker(path, ["response/rewards/mean"])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert tracker.steps == 300
    # 300 rows x 1 kept metric must not cost anything like the file (300 rows x 200 columns).
    assert peak < path.stat().st_size
