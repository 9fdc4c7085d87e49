"""The calibration DAG's params: N per suite from the runbook unless given, every problem named at once."""

from __future__ import annotations

import pytest

from rl_verify import calibrate
from rl_verify.remote import BadInput


def test_empty_runs_take_the_runbooks_n_per_suite():
    p = calibrate.validated_params({"commit": "main", "suites": ["grpo", "opd"], "nodes": "a,b", "runs": None})
    assert p["runs"] == {"grpo": 5, "opd": 3} and p["nodes"] == ["a", "b"] and p["commit"] == "main"
    assert calibrate.validated_params({"commit": "main", "suites": ["opd"], "nodes": "a", "runs": 4})["runs"] == \
        {"opd": 4}


@pytest.mark.parametrize("runs", [1, 0, -3, 21, True, "3"])
def test_fewer_than_two_runs_or_not_a_number_is_refused_naming_n_and_the_fix(runs):
    with pytest.raises(BadInput) as err:
        calibrate.validated_params({"commit": "main", "suites": ["opd"], "nodes": "a", "runs": runs})
    text = str(err.value)
    assert f"param 'runs': N = {runs!r} for opd" in text and "at least 2 runs" in text
    assert "leave it empty for the runbook's N (grpo 5, opd 3)" in text


def test_every_bad_param_is_listed_in_one_error():
    with pytest.raises(BadInput) as err:
        calibrate.validated_params({"commit": "main; id", "suites": ["opd"], "nodes": "a b", "runs": 1})
    text = str(err.value)
    assert text.startswith("3 problem(s) with the calibration's params; nothing was launched")
    assert "param 'nodes'" in text and "param 'runs'" in text and "commit" in text


def test_each_run_has_its_own_record_folder():
    assert calibrate.run_folder("opd", 2) == "calibration/opd/run2"
