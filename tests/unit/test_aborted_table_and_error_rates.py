"""Issue 35: an aborted run's table shows every judged metric (judged up to the stop, or "not reached"), and
the error rates a report states are the baseline version's and the rule's: two reports on the same version
state the same figures, whatever step their first run stopped at."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException
from conftest import dump_rows, opd_rows

from rl_verify import settings
from rl_verify.core import confirm
from rl_verify.core.live import LiveWatch, full_aborted_checks
from rl_verify.core.model import Check
from rl_verify.engines import engine_of, live_config, load_suite
from rl_verify.orchestration import comparison, confirmation
from rl_verify.store import record

OPD = load_suite("opd")
KL = "distillation/reduced_distillation_kl"


def _teacher_regression(metric, step, value):
    """The simulated teacher-path regression: the distillation KL far out from step 5."""
    return value * 3.0 + 0.5 if metric == KL and step >= 5 else value


def _aborted_record(run_dir, name="opd"):
    """A run of OPD the live check stopped at its first certain breach, in the record as fetch leaves it."""
    rows = opd_rows(change=_teacher_regression)
    config = json.loads(json.dumps(live_config(OPD, "/w", True, None, None, "/b.jsonl")))
    watch = LiveWatch({**config, "tracker_glob": "*/t.jsonl"})
    watch.start()
    fed = []
    for step in sorted({r["step"] for r in rows}):
        look = [r for r in rows if r["step"] == step]
        fed += look
        data = "".join(json.dumps(r) + "\n" for r in look).encode()
        watch.take(f"/w/1/t.jsonl {watch.offset} {watch.offset + len(data)}\n".encode() + data)
        watch.report(elapsed_s=None)
        if watch.doomed is not None:
            break
    assert watch.doomed is not None
    abort = json.loads(json.dumps({**watch.summary(), "applied": True}))
    folder = run_dir / name
    folder.mkdir(parents=True)
    dump_rows(folder / "tracker.jsonl", fed)
    record.write_json(folder / "fetch.json", {"problems": [], "early_abort": abort, "work_dir": "/w", "files": {},
                                               "steps": abort["step"], "expected_steps": 25})
    return abort


def test_an_aborted_runs_table_has_every_judged_metric_judged_up_to_the_stop_or_not_reached(tmp_path):
    run_dir = tmp_path / "run"
    abort = _aborted_record(run_dir)
    stop = abort["step"]
    with pytest.raises(AirflowFailException):  # a FAIL fails its compare task (after writing its result)
        comparison._compare_in(run_dir, "opd")
    result = json.loads((run_dir / "opd" / "result.json").read_text())
    checks = [Check.from_dict(c) for c in result["checks"]]
    assert result["verdict"] == "FAIL" and result["failure_class"] == "accuracy"
    golden = engine_of(OPD).load_data(engine_of(OPD).data_in_use(OPD, {}))
    judged = [m for m, r in golden.thresholds.items() if not r.reference_only]
    assert set(judged) <= {c.metric for c in checks}, sorted(set(judged) - {c.metric for c in checks})
    # every point up to the stop is judged (the rewards and the evals within, the KL breached) ...
    reached = [c for c in checks if c.step is not None and c.step <= stop and c.metric in judged
               and not c.note.startswith("not compared")]  # compared against a reference tracker, none here
    assert {"response/rewards/mean", "eval/gsm8k/acc", "eval/geo3k/acc", KL} <= {c.metric for c in reached}
    assert reached and all(c.passed is not None for c in reached), [(c.metric, c.step, c.note) for c in reached]
    assert any(c.metric == KL and c.step == stop and c.passed is False and "early abort" in c.note for c in checks)
    assert any(c.metric == "eval/gsm8k/acc" and c.step == 0 and c.passed is True for c in checks)
    # ... every point after it says "not reached", judged neither way and not counted as missing
    later = [c for c in checks if c.step is not None and c.step > stop and c.metric in judged]
    assert later and all(c.passed is None and not c.missing and c.note.startswith("not reached") for c in later)
    # one row per (metric, step): the live check's breach replaced the comparison's own row of it
    keys = [(c.metric, c.step) for c in checks]
    assert len(keys) == len(set(keys))


def test_the_history_keeps_an_aborted_runs_metrics_within_their_bounds(tmp_path, monkeypatch):
    from rl_verify.core import history
    from rl_verify.core.report import ReportMeta, write_report
    from rl_verify.core.model import SuiteResult

    run_dir = tmp_path / "run"
    _aborted_record(run_dir)
    with pytest.raises(AirflowFailException):  # a FAIL fails its compare task (after writing its result)
        comparison._compare_in(run_dir, "opd")
    result = SuiteResult.from_dict(json.loads((run_dir / "opd" / "result.json").read_text()))
    store = tmp_path / "records" / settings.DAG_ID / "manual__1"
    store.mkdir(parents=True)
    write_report(store, [result], ReportMeta(commit="c" * 40, dag_run_id="manual__1"))
    rows = history.rows(tmp_path / "records" / settings.DAG_ID, 10)
    metrics = {r["metric"] for r in rows}
    assert KL in metrics and "eval/gsm8k/acc" in metrics and "response/rewards/mean" in metrics, metrics


def test_full_aborted_checks_keeps_the_order_replaces_the_certain_row_and_adds_unjudged_metrics():
    def row(metric, step, passed, missing=False):
        return Check(metric=metric, step=step, baseline=1.0, current=None if missing else 1.0, error=0.0,
                     threshold=0.1, operator="<", method="absolute", passed=passed, source="golden",
                     missing=missing)

    certain = [Check(metric="kl", step=5, baseline=1.0, current=2.0, error=1.0, threshold=0.1, operator="<",
                     method="absolute", passed=False, source="live", note="early abort (point): kl")]
    compared = [row("kl", 0, True), row("kl", 5, False), row("kl", 10, None, missing=True), row("acc", 0, True),
                row("acc", 10, None, missing=True)]
    out = full_aborted_checks(certain, compared, ["kl", "acc", "len"], stop=5, expected=25)
    assert [(c.metric, c.step, c.passed) for c in out] == [("kl", 0, True), ("kl", 5, False), ("kl", 10, None),
                                                           ("acc", 0, True), ("acc", 10, None), ("len", None, None)]
    assert out[1].source == "live" and out[2].note == "not reached: the run was stopped at step 5 of 25"
    assert out[-1].note.startswith("not reached") and not any(c.missing for c in out)


def _first_run(run_dir, complete: bool):
    """The record a confirmation reads: the suite's version files and its first run's judged points."""
    folder = run_dir / "opd"
    folder.mkdir(parents=True, exist_ok=True)
    spec, engine = OPD, engine_of(OPD)
    steps = 25 if complete else 5
    rows = [r for r in opd_rows(change=_teacher_regression if not complete else None) if r["step"] <= steps]
    dump_rows(folder / "tracker.jsonl", rows)
    dump_rows(folder / "baseline.jsonl", opd_rows())  # the reference tracker a real run is fetched with
    from rl_verify.core.model import SuiteResult

    result = SuiteResult(suite="opd", verdict="PASS" if complete else "FAIL",
                         failure_class=None if complete else "accuracy")
    points = engine.run_points(spec, folder, result, {})
    points.complete = complete
    record.write_json(folder / confirmation.POINTS_FILE, {
        "verdict": points.verdict, "failure_class": points.failure_class, "breached": points.breached,
        "not_repeatable": points.not_repeatable, "complete": points.complete,
        "points": [p.__dict__ for p in points.points]})
    (folder / "baseline-version").mkdir(exist_ok=True)
    record.write_json(folder / "baseline-version" / "version.json", {"version": 1, "runs": 3, "statistics": {
        "measured_max_dev": {KL: 0.02, "eval/gsm8k/acc": 0.02}}})
    return points


def test_two_reports_on_the_same_version_state_the_same_error_rates_whatever_their_first_run_reached(
        tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path / "store"))
    asked = []

    def fake_estimate(layout, spread, budget):
        asked.append((dict(layout.thresholds), dict(layout.steps), dict(spread.sigma), budget))
        return {"single_run_false_alarm": len(asked), "layout": {m: list(s) for m, s in layout.steps.items()}}

    monkeypatch.setattr(confirmation, "estimate", fake_estimate)
    monkeypatch.setattr(confirmation, "_spread", lambda run_dir, spec: confirm.Spread(
        {KL: 0.01, "eval/gsm8k/acc": 0.01}, 3, "test"))
    passed, aborted = tmp_path / "pass", tmp_path / "fail"
    full = _first_run(passed, complete=True)
    short = _first_run(aborted, complete=False)
    assert {p.step for p in short.points} < {p.step for p in full.points}  # the FAIL stopped at step 5
    said_pass = confirmation._estimates(passed, OPD, 2)
    said_fail = confirmation._estimates(aborted, OPD, 2)
    # the same figures, computed once (the second report reads the first's from the store) ...
    assert said_pass == said_fail and len(asked) == 1
    # ... over every point a complete run is judged at against this version, not those the FAIL reached
    assert said_pass["layout"] == {m: list(s) for m, s in confirm.Layout.of(full.points).steps.items()}
    layout = engine_of(OPD).judged_layout(OPD, {})
    assert dict(layout.steps) == dict(confirm.Layout.of(full.points).steps)
    assert dict(layout.thresholds) == pytest.approx(dict(confirm.Layout.of(full.points).thresholds))


def test_the_reports_error_rates_say_they_do_not_depend_on_the_run():
    from rl_verify.core.report import estimates_sentence

    said = estimates_sentence({"simulated": "1000 healthy verifications", "spread": "shipped",
                               "single_run_false_alarm": 0.479, "false_alarm": 0.01, "inconclusive": 0.0,
                               "mean_runs": 1.5})
    assert "the same in every verification against it with this rule" in said
    assert "they do not depend on this run" in said and "47.9%" in said
