"""Pins the breach shapes the next-step rules are chosen by (tracker step numbers throughout)."""

from __future__ import annotations

import math

import pytest

from rl_verify.core.shapes import JUMP_RATIO, ComparedPoint, classify

THRESHOLD = 0.1


def series(errors: list[float], first_step: int = 1, every: int = 1, currents: list[float] | None = None):
    currents = currents or [0.5] * len(errors)
    return [ComparedPoint(first_step + i * every, cur, err, not err < THRESHOLD)
            for i, (err, cur) in enumerate(zip(errors, currents))]


def test_no_breach_has_no_shape():
    assert classify(series([0.01, 0.02, 0.09]), THRESHOLD) is None


def test_breach_at_the_first_compared_step_is_from_start_and_says_whether_it_stays():
    stays = classify(series([0.2, 0.3, 0.2]), THRESHOLD)
    assert stays.kind == "from-start" and stays.first_step == 1 and "stays outside to step 3" in stays.text
    once = classify(series([0.2, 0.01, 0.01]), THRESHOLD)
    assert once.kind == "from-start" and "1 of 3 compared points outside" in once.text


def test_first_eval_point_of_an_opd_series_counts_as_the_start():
    shape = classify(series([0.05, 0.05], first_step=0, every=5) + series([0.2], first_step=10), THRESHOLD)
    assert shape.kind == "isolated" and shape.first_step == 10
    assert classify(series([0.2, 0.01], first_step=5, every=5), THRESHOLD).kind == "from-start"


def test_single_breach_later_is_isolated_and_names_the_last_point():
    last = classify(series([0.01, 0.02, 0.01, 0.2], first_step=5, every=5), THRESHOLD)
    assert last.kind == "isolated" and last.first_step == 20 and "last compared point" in last.text
    middle = classify(series([0.01, 0.2, 0.01]), THRESHOLD)
    assert middle.kind == "isolated" and "around it are inside" in middle.text


def test_breaches_with_inside_points_between_are_intermittent():
    shape = classify(series([0.01, 0.2, 0.01, 0.2, 0.01]), THRESHOLD)
    assert shape.kind == "intermittent" and shape.first_step == 2


def test_leap_from_well_inside_to_outside_that_stays_is_a_jump():
    shape = classify(series([0.01, 0.01, 0.3, 0.3, 0.3]), THRESHOLD)
    assert shape.kind == "jump" and shape.first_step == 3
    assert shape.text.startswith("jump at step 3") and "stays outside to step 5" in shape.text


def test_growth_into_the_bound_that_stays_is_gradual():
    shape = classify(series([0.02, 0.05, 0.08, 0.11, 0.14]), THRESHOLD)
    assert shape.kind == "gradual" and shape.first_step == 4 and "outside from step 4" in shape.text


@pytest.mark.parametrize("before,kind", [(THRESHOLD * JUMP_RATIO - 1e-9, "jump"), (THRESHOLD * JUMP_RATIO, "gradual")])
def test_jump_ratio_boundary(before, kind):
    assert classify(series([0.0, before, 0.2, 0.2]), THRESHOLD).kind == kind


def test_non_finite_value_wins_over_every_other_reading():
    shape = classify(series([0.01, math.nan, 0.01], currents=[0.5, math.nan, 0.5]), THRESHOLD)
    assert shape.kind == "non-finite" and shape.first_step == 2 and "only at step 2" in shape.text


def test_a_metric_compared_once_has_a_single_point_shape():
    shape = classify([ComparedPoint(45, 0.8, 0.1, True)], THRESHOLD)
    assert shape.kind == "single-point" and "step 45 only" in shape.text


def test_a_run_stopped_at_its_first_point_reads_from_start_as_the_runbook_says_not_single_point():
    for step in (0, 1):  # OPD's first eval point (step 0), a tracker's first step (1)
        shape = classify(series([0.2], first_step=step), THRESHOLD)
        assert shape.kind == "from-start" and f"first compared step {step}" in shape.text
    assert classify(series([0.2], first_step=2), THRESHOLD).kind == "single-point"


def test_breaching_steps_are_written_as_ranges_of_consecutive_compared_points():
    from rl_verify.core.shapes import step_ranges

    assert step_ranges(range(1, 46)) == "1-45"
    assert step_ranges([3, 7, 8, 9]) == "3, 7-9"
    # OPD eval points 0/5/10/...: consecutive compared points make a range, a gap does not.
    assert step_ranges([5, 10, 15, 25], [0, 5, 10, 15, 20, 25]) == "5-15, 25"


def test_error_growing_at_every_point_into_a_breach_at_the_last_compared_point_is_gradual():
    """A run stopped by the early abort at the eval point where its error crossed the bound (or a breach at
    the final eval point): the points before it show the growth, though no later point shows it stays."""
    shape = classify(series([0.01, 0.025, 0.04, 0.06, 0.11], first_step=0, every=5), THRESHOLD)
    assert shape.kind == "gradual" and shape.first_step == 20 and shape.steps == "20"
    assert "grows into the bound over 5 compared points" in shape.text
    assert "error at 10%, 25%, 40%, 60% of the threshold at steps 0, 5, 10, 15" in shape.text
    assert "outside from step 20, the last compared point" in shape.text


@pytest.mark.parametrize("errors", [[0.01, 0.07, 0.06, 0.11], [0.01, 0.02, 0.04, 0.11]],
                         ids=["fell-before-the-breach", "far-from-the-bound-before"])
def test_a_last_point_breach_that_did_not_grow_into_the_bound_stays_isolated(errors):
    shape = classify(series(errors, first_step=0, every=5), THRESHOLD)
    assert shape.kind == "isolated" and "the last compared point" in shape.text


def test_a_long_series_is_quoted_by_its_first_and_last_points():
    shape = classify(series([0.01 * i for i in range(1, 10)] + [0.2, 0.2]), THRESHOLD)
    assert shape.kind == "gradual" and shape.first_step == 10
    assert "error at 10%, 20%, ..., 70%, 80%, 90% of the threshold at steps 1, 2, ..., 7, 8, 9" in shape.text
