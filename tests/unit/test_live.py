"""Live checking: each certainty rule, the p80 count boundary, and agreement with the final comparison.

The equivalence cases feed a tracker row by row (as it grows on the node) and compare what the live
check concluded with the full comparison of the complete tracker: a run whose full comparison is
PASS is never doomed, and a doomed run's full comparison is FAIL on the metrics the live check named.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from conftest import dump_rows, grpo_rows, opd_rows

from rl_verify import engines
from rl_verify.core.live import LiveWatch
from rl_verify.core.livecheck import rebuild
from rl_verify.core.tracker import TrackerFeed, read_tracker
from rl_verify.engines import live_config, load_suite
from rl_verify.engines.grpo import GrpoLive, compare_grpo, percentile_fail_count
from rl_verify.engines.opd import OpdLive, compare_opd

GRPO = load_suite("grpo")
OPD = load_suite("opd")


# ----------------------------------------------------------------------------- the p80 count
@pytest.mark.parametrize("steps,q,count", [(45, 80, 10), (25, 80, 6), (10, 80, 3), (2, 80, 2), (101, 90, 11)])
def test_percentile_fail_count_follows_numpy_linear_percentile(steps, q, count):
    assert percentile_fail_count(steps, q) == count


@pytest.mark.parametrize("steps", range(2, 61))
@pytest.mark.parametrize("q", [50, 80, 90, 95])
def test_the_count_decides_whatever_the_rest_and_one_fewer_does_not(steps, q):
    thr, needed = 0.1, percentile_fail_count(steps, q)
    # ``needed`` steps at the bound (breaching "< 0.1"), the rest as large as a within error can be: FAIL.
    assert not np.percentile([0.0999999] * (steps - needed) + [0.1] * needed, q) < thr
    # One fewer breaching step: the other steps can still make the percentile hold.
    assert np.percentile([0.0] * (steps - needed + 1) + [0.1] * (needed - 1), q) < thr


# ----------------------------------------------------------------------------- GRPO rules
def _grpo_live(tmp_path) -> GrpoLive:
    """The grpo engine's live check, serialised and rebuilt as the triggerer rebuilds it."""
    base = dump_rows(tmp_path / "base.jsonl", grpo_rows()).read_bytes()
    return rebuild(engines.get("grpo").live(GRPO, base, None).serialize())


def _feed_rows(rows, steps: int | None = None):
    """A tracker fed with the rows up to step ``steps`` (all when None), line by line as it grows."""
    feed = TrackerFeed("tracker.jsonl")
    for row in rows:
        if steps is not None and row["step"] > steps:
            break
        feed.feed((json.dumps(row) + "\n").encode())
    return feed.tracker


def test_a_mismatch_breach_at_step_1_is_certain_at_step_1(tmp_path):
    rows = grpo_rows(mismatch=lambda i: 4e-4)
    result = _grpo_live(tmp_path).check(_feed_rows(rows, steps=1))
    assert [(c.metric, c.step, c.rule) for c in result.certain] == [("mismatch/mismatch_k3_kl", 1, "every-step")]


def test_a_nan_in_a_percentile_metric_is_certain(tmp_path):
    rows = grpo_rows(rewards=lambda i: math.nan if i == 3 else 0.5 + 0.005 * i)
    result = _grpo_live(tmp_path).check(_feed_rows(rows, steps=3))
    assert [(c.metric, c.rule) for c in result.certain] == [("response/rewards/mean", "non-finite")]


def test_p80_metric_is_certain_at_the_tenth_breaching_step_of_45_not_the_ninth(tmp_path):
    offset = {i: 0.2 for i in range(5, 15)}  # steps 5-14 outside 0.1
    rows = grpo_rows(rewards=lambda i: 0.5 + 0.005 * i + offset.get(i, 0.0))
    live = _grpo_live(tmp_path)
    ninth = live.check(_feed_rows(rows, steps=13))
    assert not ninth.certain and {s.metric: s.state for s in ninth.status}["response/rewards/mean"] == "warning"
    tenth = live.check(_feed_rows(rows, steps=14))
    assert [(c.metric, c.step, c.rule) for c in tenth.certain] == [("response/rewards/mean", 14, "percentile")]


def test_the_wall_time_budget_passed_is_certain(tmp_path):
    live, tracker = _grpo_live(tmp_path), _feed_rows(grpo_rows(), 5)
    assert [c.rule for c in live.check(tracker, elapsed_s=2400).certain] == ["wall-time"]
    assert not live.check(tracker, elapsed_s=2399).certain


def test_a_metric_near_its_bound_is_a_warning_not_an_abort(tmp_path):
    rows = grpo_rows(mismatch=lambda i: 9e-5)  # 90 % of the 1e-4 bound
    result = _grpo_live(tmp_path).check(_feed_rows(rows, 10))
    assert not result.certain
    assert {s.metric: s.state for s in result.status}["mismatch/mismatch_k3_kl"] == "warning"


# ----------------------------------------------------------------------------- OPD rules
def _opd_live() -> OpdLive:
    """The opd engine's live check against the shipped golden table, serialised and rebuilt."""
    return rebuild(engines.get("opd").live(OPD, None, None).serialize())


def test_an_opd_eval_point_breach_is_certain_once_its_rows_are_in():
    kl = "distillation/reduced_distillation_kl"
    rows = opd_rows(change=lambda m, s, v: v + 0.1 if m == kl and s >= 5 else v)
    live = _opd_live()
    assert not live.check(_feed_rows(rows, 4)).certain
    result = live.check(_feed_rows(rows, 5))
    assert [(c.metric, c.step, c.rule) for c in result.certain] == [(kl, 5, "eval-point")]


def test_a_nan_between_opd_eval_points_is_a_warning_only():
    kl = "distillation/reduced_distillation_kl"
    rows = opd_rows(change=lambda m, s, v: math.nan if m == kl and s == 7 else v)
    result = _opd_live().check(_feed_rows(rows, 9))
    assert not result.certain and {s.metric: s.state for s in result.status}[kl] == "warning"


def test_time_step_is_reference_only_and_never_decides():
    rows = opd_rows(change=lambda m, s, v: v * 3 if m == "time/step" else v)
    assert not _opd_live().check(_feed_rows(rows)).certain


# ----------------------------------------------------------------------------- the growing file
def test_a_partial_last_line_waits_for_its_end_and_bytes_are_read_once(tmp_path):
    path = dump_rows(tmp_path / "t.jsonl", grpo_rows(steps=5))
    data = path.read_bytes()
    feed = TrackerFeed(path, None)
    taken = 0
    for i in range(0, len(data), 7):  # 7-byte reads cut lines and characters anywhere
        taken += feed.feed(data[i:i + 7])
    whole = read_tracker(path)
    assert taken == 5 and feed.offset == len(data) and feed.waiting == 0
    assert [r.values for r in feed.tracker.rows] == [r.values for r in whole.rows]
    assert feed.tracker.evals == whole.evals


# ----------------------------------------------------------------------------- equivalence
def _grpo_cases():
    """(name, rows, the step the live check dooms the run at, or None)."""
    rng = random.Random(7)
    noisy = set(rng.sample(range(1, 46), 9))  # 9 breaching steps: the p80 still holds
    return [
        ("healthy", grpo_rows(), None),
        ("noisy rewards, p80 within", grpo_rows(rewards=lambda i: 0.5 + 0.005 * i + (0.15 if i in noisy else 0)),
         None),
        ("noisy length, p80 within", grpo_rows(length=lambda i: 300.0 + i + (120 if i in noisy else 0)), None),
        ("mismatch from step 1", grpo_rows(mismatch=lambda i: 4e-4), 1),
        ("mismatch at step 30", grpo_rows(mismatch=lambda i: 4e-4 if i == 30 else 1e-5), 30),
        ("rewards diverge from step 20", grpo_rows(rewards=lambda i: 0.5 + 0.005 * i + (0.3 if i >= 20 else 0)), 29),
        ("time/step slow at step 40", grpo_rows(time_step=lambda i: 55.0 if i == 40 else 40.0), 40),
        ("final accuracy only (decided at the end)", grpo_rows(final_acc=0.7), None),
    ]


def _first_doomed(live, rows, steps):
    for n in steps:
        result = live.check(_feed_rows(rows, n))
        if result.certain:
            return n, result
    return None, None


@pytest.mark.parametrize("name,rows,doomed_at", _grpo_cases(), ids=[c[0] for c in _grpo_cases()])
def test_grpo_live_never_dooms_a_passing_run_and_agrees_on_the_metrics(name, rows, doomed_at, tmp_path,
                                                                       checker_dir):
    base = dump_rows(tmp_path / "base.jsonl", grpo_rows())
    final = compare_grpo(base, dump_rows(tmp_path / "cur.jsonl", rows), checker_dir, tmp_path / "out", plot=False)
    step, doomed = _first_doomed(_grpo_live(tmp_path), rows, range(1, 46))
    _assert_agrees(name, final, step, doomed, doomed_at)


def _assert_agrees(name, final, step, doomed, doomed_at):
    """The live check doomed the run where expected, never a passing run, and on the metrics the full
    comparison finds breached."""
    assert step == doomed_at, name
    if final.verdict == "PASS":
        assert doomed is None, f"{name}: aborted a run that passes ({doomed.certain})"
    if doomed is not None:
        breached = {c.metric for c in final.checks if c.breached}
        assert final.verdict == "FAIL" and {c.metric for c in doomed.certain} <= breached, name


def _opd_cases():
    kl, gsm = "distillation/reduced_distillation_kl", "eval/gsm8k/acc"
    return [
        ("healthy", opd_rows(), None),
        ("teacher path from step 5", opd_rows(change=lambda m, s, v: v + 0.1 if m == kl and s >= 5 else v), 5),
        ("gsm8k drops at 20", opd_rows(change=lambda m, s, v: v - 0.1 if m == gsm and s >= 20 else v), 20),
        ("noise between eval points", opd_rows(change=lambda m, s, v: v + 0.5 if m == kl and s % 5 else v), None),
        ("slow steps (reference only)", opd_rows(time_step=90.0), None),
    ]


@pytest.mark.parametrize("name,rows,doomed_at", _opd_cases(), ids=[c[0] for c in _opd_cases()])
def test_opd_live_never_dooms_a_passing_run_and_agrees_on_the_metrics(name, rows, doomed_at, tmp_path):
    final = compare_opd(dump_rows(tmp_path / "cur.jsonl", rows), tmp_path / "out", plot=False)
    step, doomed = _first_doomed(_opd_live(), rows, range(0, 26))
    _assert_agrees(name, final, step, doomed, doomed_at)


# ----------------------------------------------------------------------------- the trigger's side
def _poll_output(path: str, rows, start: int = 0) -> bytes:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return f"{path} {start} {start + len(data)}\n".encode() + data


def _baseline_bytes() -> bytes:
    return "".join(json.dumps(r) + "\n" for r in grpo_rows()).encode()


def _watch(spec, baseline: bytes | None = None, early_abort: bool = True) -> LiveWatch:
    """The trigger's watch of ``spec``'s training, from the config the operator hands the trigger."""
    config = json.loads(json.dumps(live_config(spec, "/w", early_abort, baseline, None, "/b.jsonl")))
    return LiveWatch({**config, "tracker_glob": "*/t.jsonl"})


def test_the_watch_logs_progress_per_new_step_and_records_where_the_fail_became_certain():
    watch = _watch(GRPO, _baseline_bytes())
    assert "Live check on for grpo" in watch.start()
    rows = grpo_rows(mismatch=lambda i: 4e-4 if i >= 3 else 1e-5)
    upto = [r for r in rows if r["step"] <= 2]
    assert watch.take(_poll_output("/w/1/t.jsonl", upto)) is False
    (line,) = watch.report(elapsed_s=80.0)
    assert line.startswith("step 2/45, ETA 28.7 min (40.0 s/step observed) | ") and "mismatch" in line
    assert watch.report(elapsed_s=81.0) == []  # no new step, no new line
    more = [r for r in rows if 2 < r["step"] <= 3]
    watch.take(_poll_output("/w/1/t.jsonl", more, start=watch.offset))
    lines = watch.report(elapsed_s=120.0)
    assert lines[1].startswith("FAIL is certain at step 3 of 45: [every-step] mismatch/mismatch_k3_kl")
    assert watch.abort_message().startswith("aborted at step 3 of 45: mismatch/mismatch_k3_kl error 0.00039")
    summary = watch.summary()
    assert summary["step"] == 3 and summary["certain"][0]["metric"] == "mismatch/mismatch_k3_kl"
    json.dumps(summary)  # goes into a trigger event and the record


def _watch_in_looks(spec, baseline, rows, batch: int, early_abort: bool = True, confirms=None) -> LiveWatch:
    """A watch that reads ``rows`` ``batch`` steps per look (a slow poll against short steps), until doomed."""
    config = json.loads(json.dumps(live_config(spec, "/w", early_abort, baseline, None, "/b.jsonl", confirms)))
    watch = LiveWatch({**config, "tracker_glob": "*/t.jsonl"})
    watch.start()
    steps = sorted({r["step"] for r in rows})
    for first in range(0, len(steps), batch):
        look = [r for r in rows if r["step"] in steps[first:first + batch]]
        watch.take(_poll_output("/w/1/t.jsonl", look, start=watch.offset))
        watch.report(elapsed_s=None)
        if watch.doomed is not None:
            break
    return watch


GSM8K_DRIFT = {0: 0.003, 5: 0.008, 10: 0.014, 15: 0.021, 20: 0.033}


@pytest.mark.parametrize("suite, certain_at", [("grpo", 3), ("opd", 20)])
@pytest.mark.parametrize("batch", [2, 3, 7, 25, 45])
def test_the_step_a_fail_became_certain_is_the_trainings_not_how_many_steps_a_look_read(suite, certain_at, batch):
    """The live check's step (the report's "aborted at step N" / "would have been aborted at step N") was the
    tracker's length at the look that saw the FAIL: with 0.1 s simulated steps and 1 s polls two galleries of
    one commit said 11 and 20. Whatever a look reads, the step is the one a look after every step would give."""
    if suite == "grpo":
        spec, baseline = GRPO, _baseline_bytes()
        rows = grpo_rows(mismatch=lambda i: 4e-4 if i >= 3 else 1e-5)
    else:
        spec, baseline = OPD, None
        rows = opd_rows(change=lambda m, s, v: v - GSM8K_DRIFT.get(s, 0.033) if m == "eval/gsm8k/acc" else v)
    one_by_one = _watch_in_looks(spec, baseline, rows, 1)
    in_looks = _watch_in_looks(spec, baseline, rows, batch, early_abort=False)
    assert one_by_one.doomed is not None and one_by_one.doomed.steps == certain_at
    assert in_looks.summary()["step"] == certain_at
    assert in_looks.summary()["certain"] == one_by_one.summary()["certain"]
    assert in_looks.abort_message() == one_by_one.abort_message()


def test_the_certain_line_says_when_its_look_read_several_steps_at_once():
    watch = _watch(GRPO, _baseline_bytes())
    watch.start()
    rows = [r for r in grpo_rows(mismatch=lambda i: 4e-4 if i >= 3 else 1e-5) if r["step"] <= 10]
    watch.take(_poll_output("/w/1/t.jsonl", rows))
    lines = watch.report(elapsed_s=400.0)
    assert lines[0].startswith("step 10/45")  # progress: where the training is now
    assert lines[1].startswith("FAIL is certain at step 3 of 45 (this look read steps 1-10 at once): [every-step] "
                               "mismatch/mismatch_k3_kl")


@pytest.mark.parametrize("least, stopped_at", [(3e-4, 3), (1.0, None)])
def test_a_repeats_watch_that_read_several_steps_stops_only_where_its_confirmation_is_decided(least, stopped_at):
    rows = grpo_rows(mismatch=lambda i: 4e-4 if i >= 3 else 1e-5)
    watch = _watch_in_looks(GRPO, _baseline_bytes(), rows, 10, confirms={"mismatch/mismatch_k3_kl": [1, least]})
    assert (watch.doomed.steps if watch.doomed else None) == stopped_at


@pytest.mark.parametrize("least, stopped", [(3e-4, True), (1.0, False)])
def test_a_repeats_watch_stops_only_on_a_certain_fail_that_decides_its_confirmation(least, stopped):
    config = json.loads(json.dumps(live_config(GRPO, "/w", True, _baseline_bytes(), None, "/b.jsonl",
                                               {"mismatch/mismatch_k3_kl": [1, least]})))
    watch = LiveWatch({**config, "tracker_glob": "*/t.jsonl"})
    watch.start()
    rows = [r for r in grpo_rows(mismatch=lambda i: 4e-4 if i >= 3 else 1e-5) if r["step"] <= 3]
    watch.take(_poll_output("/w/1/t.jsonl", rows))
    lines = watch.report(elapsed_s=120.0)
    assert (watch.doomed is not None) is stopped
    if not stopped:
        assert "not by enough to decide the confirmation: it goes on" in lines[1]


def test_without_its_baseline_the_grpo_watch_is_off_and_says_why():
    watch = _watch(GRPO, None)
    assert watch.start().startswith("Live check off for grpo: no baseline tracker at /b.jsonl")
    assert watch.checker is None


def test_a_watch_config_from_an_earlier_version_only_watches_the_job():
    # What a trigger deferred before the upgrade stored: no step count, no serialised check.
    watch = LiveWatch({"suite": "grpo", "work_dir": "/w", "tracker_glob": "*/t.jsonl", "baseline": "/b.jsonl",
                       "early_abort": True, "run_id": "r", "version_files": []})
    assert watch.off and watch.checker is None and watch.ended_short() is None


def test_only_a_live_check_of_an_engine_module_is_rebuilt():
    with pytest.raises(ValueError, match="not a live check of an engine"):
        rebuild(["os.system", {"command": "true"}])
    with pytest.raises(ValueError, match="not a live check"):
        rebuild(["rl_verify.engines.grpo.compare_grpo", {}])


def test_an_aborted_suite_is_an_accuracy_fail_naming_the_step_the_rule_and_the_runbook_step():
    from rl_verify.core.live import aborted_result
    from rl_verify.engines.grpo import GRPO_RULES

    watch = _watch(GRPO, _baseline_bytes())
    watch.start()
    watch.take(_poll_output("/w/1/t.jsonl", grpo_rows(steps=45, mismatch=lambda i: 4e-4)[:4]))
    watch.report(elapsed_s=60.0)
    abort = json.loads(json.dumps({**watch.summary(), "applied": True}))
    result = aborted_result("grpo", abort, GRPO_RULES)
    assert (result.verdict, result.failure_class) == ("FAIL", "accuracy")
    assert result.abnormal[0].startswith("Aborted at step 1 of 45: the final verdict could no longer be PASS "
                                         "(mismatch/mismatch_k3_kl (every-step, step 1))")
    (row,) = result.checks
    assert row.passed is False and row.step == 1 and row.error == pytest.approx(3.9e-4)
    assert any("train/inference" in s for s in result.next_steps)


def test_the_partial_curves_of_an_aborted_suite_are_plotted(tmp_path):
    from rl_verify.core.live import partial_plot

    cur = dump_rows(tmp_path / "cur.jsonl", grpo_rows(steps=45, mismatch=lambda i: 4e-4)[:8])
    base = dump_rows(tmp_path / "base.jsonl", grpo_rows())
    certain = [{"metric": "mismatch/mismatch_k3_kl", "step": 1, "current": 4e-4, "threshold": 1e-4,
                "method": "absolute"}]
    png = partial_plot("grpo", certain, cur, base, None, tmp_path)
    assert png is not None and png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_a_live_check_error_switches_the_check_off_and_never_ends_the_watch():
    import asyncio

    from rl_verify.orchestration.triggers import RLJobTrigger

    config = {**live_config(GRPO, "/r/k/work/grpo", True, _baseline_bytes(), None, "/b.jsonl"),
              "tracker_glob": "*/t.jsonl"}
    trigger = RLJobTrigger(ssh_conn_id="n", job_dir="/r/k/jobs/grpo", job_marker="k/grpo", live=config)
    broken = b"/r/k/work/grpo/1/t.jsonl 0 20\n{not json at all}\n"

    async def script(conn, text):
        return 0, broken

    trigger._script = script
    assert asyncio.run(trigger._live(None, None, "")) is None
    assert trigger._watch.off  # the final comparison still judges the run


def _opd_watch():
    watch = _watch(OPD)
    watch.start()
    return watch


def test_an_out_of_memory_line_is_acted_on_as_soon_as_it_is_seen():
    watch = _opd_watch()
    hit = watch.log_hit("step 3/25\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert hit and hit["when"] == "seen" and hit["line"].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_a_traceback_is_not_acted_on_while_the_job_runs_and_quotes_its_exception_line_at_a_short_exit():
    watch = _opd_watch()
    # The block's end arrives in a later chunk: the quote follows it there.
    assert watch.log_hit("step 7/25\nTraceback (most recent call last):\n  File \"rl_trainer.py\", line 1\n") is None
    assert watch.log_hit("    fit()\nValueError: bad batch\n[teacher] stopped\n") is None
    watch.take(_poll_output("/w/1/t.jsonl", [r for r in opd_rows(steps=25) if r["step"] <= 7]))
    hit = watch.ended_short()
    assert hit == {"pattern": r"^Traceback \(most recent call last\):", "means": "the trainer raised an exception",
                   "line": "ValueError: bad batch", "when": "exit", "at_exit": True, "steps": 7,
                   "fix": "", "seen": 1, "stop": "early_abort", "retry": None}


def test_a_traceback_the_run_survives_is_no_failure_at_its_full_exit():
    watch = _opd_watch()
    watch.log_hit("Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'tok'\n")
    watch.take(_poll_output("/w/1/t.jsonl", opd_rows(steps=25)))
    assert watch.feed.tracker.steps == 25 and watch.ended_short() is None


def test_a_log_rule_with_an_unknown_when_is_refused_naming_the_field(tmp_path):
    from rl_verify.suites.spec import LogRule

    with pytest.raises(ValueError, match="when"):
        LogRule(pattern="x", means="y", when="later")


def test_an_eval_metric_growing_into_its_bound_and_aborted_at_its_first_breach_is_gradual_the_training_loop():
    """issue 23: an OPD eval metric whose error grows point by point (inside its bound at 0/5/10/15) and
    breaks it at 20, so the run is aborted there (the look that read it had step 21 too). Its shape is read from
    the five compared points the live check saw, not from the one breached row: gradual, so the runbook's
    training-loop rule comes first."""
    from rl_verify.core.live import aborted_result
    from rl_verify.engines.opd import OPD_RULES

    gsm8k = "eval/gsm8k/acc"  # threshold < 0.03: errors 0.003, 0.008, 0.014, 0.021 inside, 0.033 outside
    drift = {0: 0.003, 5: 0.008, 10: 0.014, 15: 0.021, 20: 0.033}
    rows = opd_rows(change=lambda m, s, v: v - drift.get(s, 0.033) if m == gsm8k else v)
    watch = _watch(OPD)
    watch.start()
    watch.take(_poll_output("/w/1/t.jsonl", [r for r in rows if r["step"] <= 21]))
    watch.report(elapsed_s=600.0)
    assert watch.doomed is not None and watch.doomed.steps == 20
    abort = json.loads(json.dumps({**watch.summary(), "applied": True}))  # as abort.json holds it
    result = aborted_result("opd", abort, OPD_RULES)
    (row,) = [c for c in result.checks if c.metric == gsm8k]
    assert row.step == 20 and row.shape == "gradual", row.shape_text
    assert "over 5 compared points" in row.shape_text and "the run was stopped there" in row.shape_text
    assert "steps 0, 5, 10, 15" in row.shape_text and "only" not in row.shape_text
    first = result.next_steps[0]
    assert first.startswith("Inference: first, look at the training loop") and "diverges gradually" in first
    assert not any("has no shape to read" in s or "initialisation" in s for s in result.next_steps)


def test_an_aborted_record_written_before_points_were_kept_still_reads_its_breach():
    """abort.json of an earlier version (no compared points): the row keeps the live check's own shape."""
    from rl_verify.core.live import aborted_result
    from rl_verify.engines.grpo import GRPO_RULES

    abort = {"step": 1, "expected_steps": 45, "applied": True, "certain": [
        {"metric": "mismatch/mismatch_k3_kl", "step": 1, "rule": "every-step", "text": "error 0.00039 at step 1",
         "baseline": 1e-5, "current": 4e-4, "error": 3.9e-4, "threshold": 1e-4, "operator": "<=",
         "method": "absolute", "shape": "from-start"}]}
    (row,) = aborted_result("grpo", abort, GRPO_RULES).checks
    assert row.shape == "from-start" and "first compared step 1" in row.shape_text
