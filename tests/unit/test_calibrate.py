"""The calibration DAG's params: N per suite from the runbook unless given, every problem named at once."""

from __future__ import annotations

import json

import pytest

from rl_verify.orchestration import calibration as calibrate
from rl_verify.node.remote import BadInput


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
    assert "leave it empty for the runbook's N, that of each suite's shipped baseline (opd 3)" in text


def test_every_bad_param_is_listed_in_one_error():
    with pytest.raises(BadInput) as err:
        calibrate.validated_params({"commit": "main; id", "suites": ["opd"], "nodes": "a b", "runs": 1})
    text = str(err.value)
    assert text.startswith("3 problem(s) with the calibration's params; nothing was launched")
    assert "param 'nodes'" in text and "param 'runs'" in text and "commit" in text


def test_each_run_has_its_own_record_folder():
    assert calibrate.run_folder("opd", 2) == "calibration/opd/run2"


def _run_folder(run_dir, index, tracker_rows):
    from conftest import dump_rows

    from rl_verify.store import record

    folder = run_dir / calibrate.run_folder("opd", index)
    folder.mkdir(parents=True)
    tracker = dump_rows(folder / "tracker.jsonl", tracker_rows)
    record.write_json(folder / "fetch.json", {"files": {"tracker": {"local": str(tracker)}}, "problems": []})
    return {"suite": "opd", "record_as": calibrate.run_folder("opd", index), "resolved": {"node": "gpu_a"}}


def test_a_proposal_its_own_runs_fail_is_refused_naming_each_run_and_metric(tmp_path):
    from airflow.sdk.exceptions import AirflowFailException
    from conftest import GOLDEN, opd_rows

    from rl_verify.engines import load_suite

    run_dir = tmp_path / "rl_accuracy_verification" / "run-1"
    runs = [_run_folder(run_dir, i, opd_rows()) for i in (1, 2)]
    agreeing = tmp_path / "golden.json"
    agreeing.write_text(GOLDEN.read_text())
    calibrate._verify_own_runs(load_suite("opd"), run_dir, runs, {"golden.json": agreeing})  # no error
    data = json.loads(GOLDEN.read_text())
    data["golden"]["25"]["eval/gsm8k/acc"] += 0.2  # a table these runs are far from
    far = tmp_path / "far.json"
    far.write_text(json.dumps(data))
    with pytest.raises(AirflowFailException) as err:
        calibrate._verify_own_runs(load_suite("opd"), run_dir, runs, {"golden.json": far})
    text = str(err.value)
    assert "the reference commit fails its own verification against the opd proposal" in text
    assert "calibration/opd/run1: FAIL (accuracy): eval/gsm8k/acc" in text and "calibration/opd/run2" in text


def test_the_grpo_plot_draws_the_current_baseline_tracker_beside_the_runs(tmp_path):
    from tests.unit.conftest import dump_rows, grpo_rows

    from rl_verify.suites.spec import data_file

    from rl_verify.engines import load_suite

    spec = load_suite("grpo")
    runs = {str(i): dump_rows(tmp_path / f"run{i}.jsonl", grpo_rows(rewards=lambda s, i=i: 0.5 + 0.005 * s + 0.002 * i))
            for i in (1, 2)}
    baseline = dump_rows(tmp_path / "baseline.jsonl", grpo_rows(rewards=lambda s: 0.2))
    drawn = calibrate._plot("grpo", runs, tmp_path / "with.png", data_file(spec.data), baseline, spec).read_bytes()
    bare = calibrate._plot("grpo", runs, tmp_path / "without.png", data_file(spec.data), None, spec).read_bytes()
    assert drawn.startswith(b"\x89PNG") and bare.startswith(b"\x89PNG")
    assert drawn != bare  # the baseline's curve (rewards far below the runs) is on the plot


def test_the_approvers_threshold_choice_picks_the_versions_golden_table_and_keeps_the_other():
    info = {"files": ["golden.json", "golden-false-alarm.json"],
            "choices": {"runbook: max deviation x 1.5": {}, "5% false alarm per verification":
                        {"golden.json": "golden-false-alarm.json"}}}
    label, files = calibrate.chosen_files(info, "5% false alarm per verification")
    assert label == "5% false alarm per verification"
    assert files == {"golden.json": "golden-false-alarm.json", "golden-runbook.json": "golden.json"}
    label, files = calibrate.chosen_files(info, None)  # nobody picked: the runbook's, the first
    assert label == "runbook: max deviation x 1.5" and files["golden.json"] == "golden.json"
    assert calibrate.chosen_files({"files": ["baseline.jsonl"], "choices": {}}, "anything") == \
        ("", {"baseline.jsonl": "baseline.jsonl"})
