"""One number style (issue 23 item 5): digits per metric, units on times, relative thresholds as
percentages, UTC times, and an error the checker rounded away said to be rounded."""

from __future__ import annotations

from rl_verify.core import numbers
from rl_verify.suites.card import threshold_text
from rl_verify.core.thresholds import Rule


def test_every_value_of_a_metric_has_the_digits_its_threshold_calls_for():
    st = numbers.style("eval/gsm8k/acc", "absolute", 0.03)
    assert [st.value(v) for v in (0.901058, 0.0225315, 0.5)] == ["0.9011", "0.0225", "0.5000"]
    assert numbers.style("mismatch/mismatch_k3_kl", "absolute", 0.0001).value(1.26294e-05) == "0.000013"


def test_an_error_rounded_away_is_not_shown_as_zero():
    st = numbers.style("mismatch/mismatch_k3_kl", "absolute", 0.0001)
    assert st.error(0.0, baseline=1.0e-5, current=1.2e-6) == "< 0.00001 (rounded)"
    assert st.error(0.0, baseline=0.5, current=0.5) == "0.000000"  # equal values: a true zero


def test_times_carry_units_and_budgets_read_in_minutes():
    assert numbers.style("time/step", "absolute", 10).threshold("<", 10) == "< 10 s"
    wall = numbers.style("e2e wall time", "value", 2400)
    assert wall.threshold("<", 2400) == "< 40 min" and wall.value(46.2) == "46 s"
    assert numbers.duration(725) == "12 min 5 s"


def test_relative_thresholds_are_percentages_in_the_report_and_the_card():
    st = numbers.style("response/rewards/mean", "relative", 0.12, [0.5])
    assert st.threshold("<", 0.12) == "< 12%" and st.error(0.031) == "3.1%"  # 3 digits at the scale of 12%
    assert threshold_text(Rule(metric="response/rewards/mean", method="relative", threshold=0.12)) == "< 12%"


def test_times_are_utc_to_the_second():
    assert numbers.utc("2026-12-02T02:04:56.123456+00:00") == "2026-12-02 02:04:56 UTC"
    assert numbers.utc("2026-12-02T10:04:56+08:00") == "2026-12-02 02:04:56 UTC"
    assert numbers.utc("not a time") == "not a time"
