"""Pins the failure classes: each names a different next step, and missing data is never a breach."""

from __future__ import annotations

import pytest

from rl_verify.core.model import STEP_COUNT, Check, failure_class_of, missing_findings


def check(metric, passed=False, missing=False, step=5):
    return Check(metric=metric, step=step, baseline=1.0, current=None if missing else 2.0,
                 error=None if missing else 1.0,
                 threshold=0.1, operator="<", method="absolute", passed=passed, source="golden", missing=missing,
                 note="missing: no value in a current eval row at step 5" if missing else "")


@pytest.mark.parametrize("checks,expected", [
    ([check("eval/gsm8k/acc", passed=True)], None),
    ([check("eval/gsm8k/acc")], "accuracy"),
    ([check("time/step")], "performance"),
    ([check("e2e wall time", step=None)], "performance"),
    ([check("time/step"), check("response/rewards/mean")], "accuracy"),
    ([check("eval/gsm8k/acc", missing=True)], "infrastructure"),
    ([check("eval/gsm8k/acc", missing=True), check("time/step")], "infrastructure"),
    ([check("eval/gsm8k/acc", missing=True), check("eval/geo3k/acc")], "accuracy"),
    ([check(STEP_COUNT, step=None), check("eval/geo3k/acc")], "infrastructure"),
])
def test_failure_class_matches_the_next_step(checks, expected):
    verdict = "FAIL" if any(c.passed is False for c in checks) else "PASS"
    assert failure_class_of(checks, verdict) == expected


def test_a_fail_that_names_nothing_is_infrastructure():
    assert failure_class_of([], "FAIL") == "infrastructure"


def test_missing_values_are_abnormal_findings_and_not_breaches():
    row = check("eval/gsm8k/acc", missing=True)
    assert row.passed is False and not row.breached
    (finding,) = missing_findings([row, check("eval/geo3k/acc")])
    assert finding.startswith("Missing data: eval/gsm8k/acc not measured at step(s) 5") and "not a breach" in finding
