"""Pins the OPD rules: every golden eval point, eval vs training rows, missing -> FAIL,
baseline-only metrics, reference-only time/step, uncalibrated steps, golden file errors."""

from __future__ import annotations

import json

import pytest

from conftest import dump_rows, load_golden, opd_rows
from rl_verify.core.errors import InputError
from rl_verify.engines.opd import compare_opd

KL = "distillation/reduced_distillation_kl"
REWARDS = "response/rewards/mean"
GSM8K = "eval/gsm8k/acc"
LEN = "response/response_len/mean"


def run(tmp_path, rows, **kw):
    cur = dump_rows(tmp_path / "cur.jsonl", rows)
    return compare_opd(cur, tmp_path / "out", plot=kw.pop("plot", False), **kw)


def at(result, metric, step):
    return next(c for c in result.checks if c.metric == metric and c.step == step)


@pytest.mark.parametrize("separate", [True, False])
def test_run_matching_the_golden_table_passes_at_every_eval_point(tmp_path, separate):
    result = run(tmp_path, opd_rows(separate_eval_rows=separate))
    assert result.verdict == "PASS"
    golden = load_golden()
    for step, values in golden["golden"].items():
        for metric, value in values.items():
            row = at(result, metric, int(step))
            assert row.baseline == value and row.passed is True and row.source == "golden"


def test_step_0_compares_the_eval_only_row_and_has_no_training_metrics(tmp_path):
    result = run(tmp_path, opd_rows())
    step0 = {c.metric for c in result.checks if c.step == 0}
    assert step0 == {GSM8K, "eval/geo3k/acc"}


def test_breach_at_a_middle_eval_point_fails_only_there(tmp_path):
    rows = opd_rows(change=lambda m, s, v: v + 0.031 if (m == GSM8K and s == 15) else v)
    result = run(tmp_path, rows)
    assert at(result, GSM8K, 15).passed is False
    assert at(result, GSM8K, 10).passed is True and at(result, GSM8K, 20).passed is True
    assert result.verdict == "FAIL"


def test_error_equal_to_the_threshold_fails_strict_less_than(tmp_path):
    rows = opd_rows(change=lambda m, s, v: v + 0.08 if (m == REWARDS and s == 10) else v)
    result = run(tmp_path, rows)
    row = at(result, REWARDS, 10)
    assert row.error == pytest.approx(0.08) and row.passed is False


def test_training_metric_is_taken_from_summary_row_n_not_a_neighbour(tmp_path):
    rows = opd_rows(change=lambda m, s, v: v + 0.5 if (m == KL and s == 11) else v)
    assert run(tmp_path, rows).verdict == "PASS"


def test_missing_eval_point_is_a_fail_not_a_pass(tmp_path):
    rows = opd_rows(drop={(GSM8K, 20), ("eval/geo3k/acc", 20)})
    result = run(tmp_path, rows)
    row = at(result, GSM8K, 20)
    assert row.passed is False and row.current is None and "missing" in row.note
    assert result.verdict == "FAIL"


def test_short_run_misses_later_golden_points_and_fails(tmp_path):
    result = run(tmp_path, opd_rows(steps=12))
    assert at(result, KL, 15).passed is False and "missing" in at(result, KL, 15).note
    assert result.verdict == "FAIL"


def test_response_len_and_time_step_without_baseline_are_not_judged(tmp_path):
    result = run(tmp_path, opd_rows())
    for metric in (LEN, "time/step"):
        row = at(result, metric, 5)
        assert row.passed is None and row.baseline is None and "no reference baseline" in row.note
        assert "--baseline" not in row.note  # a CLI flag belongs to the CLI's own words only
    (finding,) = [a for a in result.abnormal if "not compared" in a]
    assert finding.startswith(f"{LEN}, time/step not compared") and "no reference baseline tracker was given" in finding


def test_response_len_uses_the_baseline_tracker_relative_18_percent(tmp_path):
    base = dump_rows(tmp_path / "base.jsonl", opd_rows(response_len=300.0))
    result = run(tmp_path, opd_rows(response_len=360.0), baseline=base)  # +20%
    row = at(result, LEN, 5)
    assert row.baseline == 300.0 and row.error == pytest.approx(0.2) and row.passed is False
    result = run(tmp_path, opd_rows(response_len=350.0), baseline=base)  # +16.7%
    assert at(result, LEN, 5).passed is True


def test_time_step_is_reference_only_and_never_fails(tmp_path):
    base = dump_rows(tmp_path / "base.jsonl", opd_rows(time_step=30.0))
    result = run(tmp_path, opd_rows(time_step=60.0), baseline=base)
    row = at(result, "time/step", 5)
    assert row.passed is None and "reference only" in row.note and "would fail" in row.note
    assert result.verdict == "PASS"


def test_steps_beyond_the_golden_table_are_listed_as_not_calibrated(tmp_path):
    rows = opd_rows(steps=50, change=lambda m, s, v: v + 1.0 if s > 25 else v)
    result = run(tmp_path, rows)
    later = [c for c in result.checks if c.step is not None and c.step > 25]
    assert {c.step for c in later} == {30, 35, 40, 45, 50}
    assert all(c.passed is None and "not calibrated" in c.note for c in later)
    assert result.verdict == "PASS"


def test_nan_at_an_eval_point_fails(tmp_path):
    lines = [json.dumps(r) for r in opd_rows()]
    idx = next(i for i, line in enumerate(lines) if '"step": 10' in line and KL in line)
    row = json.loads(lines[idx])
    lines[idx] = json.dumps(row).replace(json.dumps(row[KL]), "NaN", 1)
    result = run(tmp_path, lines)
    assert at(result, KL, 10).passed is False
    assert any("is NaN at step 10" in a for a in result.abnormal)


def test_other_golden_file_of_same_format_is_used(tmp_path):
    golden = load_golden()
    golden["golden"]["5"][REWARDS] = 0.9
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(golden))
    result = run(tmp_path, opd_rows(), golden=path)
    assert at(result, REWARDS, 5).passed is False and result.trackers["golden"] == str(path.resolve())


@pytest.mark.parametrize("content", ["{not json", json.dumps({"eval_points": [0]}), ""])
def test_malformed_golden_file_is_an_input_error(tmp_path, content):
    path = tmp_path / "golden.json"
    path.write_text(content)
    with pytest.raises(InputError):
        run(tmp_path, opd_rows(), golden=path)


def test_distill_kl_breach_with_healthy_rewards_points_at_the_teacher_path(tmp_path):
    rows = opd_rows(change=lambda m, s, v: v + 0.05 if (m == KL and s >= 15) else v)
    result = run(tmp_path, rows)
    assert any("teacher path" in s for s in result.next_steps)
    # +0.05 from step 15 on, exact before: a jump that stays, not a gradual divergence.
    assert any("jump at step 15" in s for s in result.next_steps)
    assert not any("gradual" in s for s in result.next_steps)


def test_missing_reference_is_said_in_the_callers_words(tmp_path):
    result = run(tmp_path, opd_rows(), missing_reference="there is no reference baseline at /share/x on node n1")
    assert any(a.endswith("there is no reference baseline at /share/x on node n1.") for a in result.abnormal)


def test_missing_eval_rows_are_an_infrastructure_failure_not_a_breach(tmp_path):
    rows = opd_rows(drop={(GSM8K, 20), ("eval/geo3k/acc", 20)})
    result = run(tmp_path, rows)
    assert result.verdict == "FAIL" and result.failure_class == "infrastructure"
    row = at(result, GSM8K, 20)
    assert row.missing and row.passed is False and not row.breached
    assert any(a.startswith("Missing data: eval/geo3k/acc not measured at step(s) 20") for a in result.abnormal)
    assert any(a.startswith("Missing data: eval/gsm8k/acc not measured at step(s) 20") for a in result.abnormal)
    assert "not measured" in result.next_steps[0]


def test_only_a_time_check_cannot_fail_opd_so_a_breach_is_accuracy(tmp_path):
    rows = opd_rows(change=lambda m, s, v: v + 0.2 if (m == REWARDS and s >= 5) else v)
    result = run(tmp_path, rows)
    assert result.failure_class == "accuracy"
    assert any("from the first compared step 5" in s and "initialisation or config" in s for s in result.next_steps)


def test_plot_is_written(tmp_path):
    result = run(tmp_path, opd_rows(), plot=True)
    assert (tmp_path / "out" / "opd_metrics.png").is_file() and len(result.plots) == 1
