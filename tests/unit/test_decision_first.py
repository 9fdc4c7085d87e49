"""Issue 35: a FAIL report reads top-down as a decision, the statistics and the rule (once) are one click
away, a PASS report is short; the verdict is the verdict task's first log line; the Bisection tab of a
verification run is a page, never the API's JSON; one run's report links back to the verification's."""

from __future__ import annotations

import html
import json
import logging

import pytest

from rl_verify import settings
from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.names import run_key
from rl_verify.core.report import RULE_IN_WORDS, ReportMeta, render_html, render_markdown
from rl_verify.orchestration import links, views
from rl_verify.orchestration import reporting

RUN = "manual__2026-12-03T06:00:00+00:00"
RULE = "repeat a FAIL that noise can produce ... Stouffer z ... Sidak bound"
ESTIMATES = {"simulated": "1000 healthy verifications", "spread": "shipped", "false_alarm": 0.01,
             "single_run_false_alarm": 0.479, "inconclusive": 0.005, "mean_runs": 1.5,
             "metrics": {"distillation/reduced_distillation_kl": {"sigma": 0.01, "threshold": 0.03,
                                                                  "healthy_breach": 0.077,
                                                                  "min_detectable_shift": 0.02}}}


def _check(metric, step, error, passed, breach_steps=""):
    return Check(metric=metric, step=step, baseline=0.5, current=0.5 + error, error=error, threshold=0.03,
                 operator="<", method="absolute", passed=passed, source="golden", note="current line 7",
                 first_breach_step=step if passed is False else None, breach_steps=breach_steps)


def _suites():
    grpo = SuiteResult(suite="grpo", verdict="PASS", failure_class=None,
                       checks=[_check("eval/accuracy", 45, 0.001, True)],
                       next_steps=["Inference: no action needed; every checked metric is within its threshold."])
    opd = SuiteResult(suite="opd", verdict="FAIL", failure_class="accuracy",
                      checks=[_check("eval/gsm8k/acc", 0, 0.001, True), _check("eval/gsm8k/acc", 5, 0.002, True),
                              _check("distillation/reduced_distillation_kl", 5, 0.09, False),
                              _check("distillation/reduced_distillation_kl", 10, 0.12, False)],
                      abnormal=["Live check: aborted at step 10 of 25"],
                      next_steps=["Inference: first, suspect the teacher path (teacher server, its checkpoint). "
                                  "Why: the distillation KL left its bound at step 5; jump at step 5.",
                                  "Inference: secondary: something else."])
    outcome = {"suite": "opd", "outcome": "FAIL (reproduced)", "reason": "distill kl |z| = 7.07 >= 3.34",
               "rule": RULE, "runs": [{"attempt": 0, "folder": "opd", "verdict": "FAIL", "seed": None,
                                       "failure_class": "accuracy", "steps": 10, "expected_steps": 25},
                                      {"attempt": 1, "folder": "opd-r1", "verdict": "FAIL", "seed": 7,
                                       "failure_class": "accuracy", "steps": 25, "expected_steps": 25}],
               "estimates": ESTIMATES}
    grpo_outcome = {"suite": "grpo", "outcome": "PASS", "reason": "the first run passed", "rule": RULE,
                    "runs": [{"attempt": 0, "folder": "grpo", "verdict": "PASS", "seed": None}], "estimates": {}}
    return [grpo, opd], {"opd": outcome, "grpo": grpo_outcome}


def _meta(outcomes):
    return ReportMeta(commit="c" * 40, commit_ref="sim/regress-teacher", dag_run_id=RUN, outcomes=outcomes,
                      baselines={"opd": "v1 (shipped)"}, notes=["Approved by demo at 2026-12-03 06:00 UTC."],
                      record_location="/records/x", files_url="/files")


def test_a_fail_report_says_verdict_next_step_breached_metrics_and_commit_before_any_statistics():
    suites, outcomes = _suites()
    page = render_html(suites, _meta(outcomes))
    order = ["RL accuracy verification: FAIL", "opd: FAIL (reproduced) (accuracy)</h2>",
             "<b>Next step</b> (inference): suspect the teacher path", "<b>Why</b>: the distillation KL",
             "<b>distillation/reduced_distillation_kl</b>", "<b>Commit</b>", "Abnormal findings",
             "<summary>How sure: the rule and its error rates</summary>", "<h2>Commit under test</h2>"]
    at = [page.index(marker) for marker in order]
    assert at == sorted(at), list(zip(order, at))
    # the breached metric's steps, and its worst error against its threshold
    row = page[page.index("<b>distillation/reduced_distillation_kl</b>"):]
    assert "5, 10" in row[:200] and "at step 10" in row[:300]
    # the passing suite's "no action needed" is not the decision, and its table is one click away
    assert "no action needed" not in page
    assert "<details><summary>grpo: PASS" in page
    md = render_markdown(suites, _meta(outcomes))
    assert md.index("**Next step** (inference): suspect the teacher path") < md.index("| metric | values at step")
    assert md.index("**Commit**") < md.index("## How sure")


def test_the_rule_is_stated_once_in_words_with_its_formula_behind_a_toggle():
    suites, outcomes = _suites()
    page = render_html(suites, _meta(outcomes))
    assert page.count(RULE) == 1 and page.count(RULE_IN_WORDS.split(":")[0]) == 1
    toggle = page[page.index("<details><summary>details: the rule's formula"):]
    assert RULE in toggle[:len(RULE) + 200]
    assert page.index("Stouffer") > page.index("<details class=\"stats\">")  # no formula outside the section
    md = render_markdown(suites, _meta(outcomes))
    assert md.count(RULE) == 1 and "Rule (pre-registered)" not in md


def test_a_pass_report_is_short_its_tables_and_files_one_click_away():
    suites, outcomes = _suites()
    suites[1] = SuiteResult(suite="opd", verdict="PASS", failure_class=None,
                            checks=[_check("eval/gsm8k/acc", 0, 0.001, True)], next_steps=["Inference: none"])
    outcomes["opd"] = {**outcomes["opd"], "outcome": "PASS", "runs": outcomes["opd"]["runs"][:1]}
    page = render_html(suites, _meta(outcomes))
    assert "Next step" not in page and "breached metric" not in page
    body = page[page.index("<body>"):]
    shown = body.split("<details")[0]  # what is open before the first toggle
    assert "<table" not in shown and "<b>PASS</b>" in shown and "<b>Commit</b>" in shown


def test_a_run_with_the_node_default_seed_says_so():
    suites, outcomes = _suites()
    page = render_html(suites, _meta(outcomes))
    assert "node default" in page and "seed None" not in page and ">None<" not in page


def test_the_verdict_is_the_verdict_tasks_first_log_line_and_the_note_links_the_report(monkeypatch, caplog):
    from airflow.sdk.exceptions import AirflowFailException

    from rl_verify.orchestration import notify

    said = []
    monkeypatch.setattr(links, "ui_base_url", lambda: "http://ui")
    monkeypatch.setattr(reporting, "_first_next_step", lambda run_id, report=None: "suspect the teacher path")

    def send(title, body, failure=False):
        logging.getLogger("rl_verify.orchestration.notify").info("Notification sent: %s", title)
        said.append(("notify", title))

    monkeypatch.setattr(notify, "send", send)
    monkeypatch.setattr(reporting, "_notify_verdict", lambda summary, run_id: send("verdict", ""))
    monkeypatch.setattr(reporting, "_note_run", lambda run_id, note: said.append(("note", note)))
    summary = {"verdict": "FAIL", "record": "/r", "failure_classes": ["accuracy"], "failed_suites": ["opd"],
               "suites": [{"suite": "opd", "verdict": "FAIL", "failure_class": "accuracy", "missing": [],
                           "breached": [{"metric": "distillation/reduced_distillation_kl", "first_breach_step": 5,
                                         "steps": "5-25"}]}]}
    with caplog.at_level("INFO"), pytest.raises(AirflowFailException):
        reporting.verdict(summary, RUN)
    first = caplog.records[0].getMessage()
    assert first.startswith("FAIL (accuracy): opd distillation/reduced_distillation_kl breached at steps 5-25")
    assert "next step: suspect the teacher path" in first
    note = dict(said)["note"]
    view = links.absolute("http://ui", links.report_view_path(settings.DAG_ID, RUN))
    said_first = "FAIL (accuracy): opd distillation/reduced_distillation_kl breached at steps 5-25"
    assert note == f"{said_first} ([report]({view}))"


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    folder = tmp_path / settings.DAG_ID / run_key(RUN)
    (folder / "opd-r1").mkdir(parents=True)
    (folder / "report.html").write_text("<html><body><h1>RL accuracy verification: FAIL</h1></body></html>")
    (folder / "report.json").write_text(json.dumps({"commit": "c" * 40}))
    (folder / "opd-r1" / "report.html").write_text("<html><body><h1>run 2</h1></body></html>")
    return tmp_path


def _bisection(records, name, probes, source=None):
    folder = records / settings.BISECT_DAG_ID / name
    folder.mkdir(parents=True)
    (folder / "bisection.json").write_text(json.dumps({"dag_run_id": name, "probes": probes, "source": source or {},
                                                       "answer": {"reason": "culprit <b>abc</b>"}}))


def test_the_bisection_tab_of_a_verification_run_is_a_page_naming_the_bisections_that_probed_it(records):
    with pytest.raises(views.NoBisection) as none:
        views.bisection_page(settings.DAG_ID, RUN)
    assert "No bisection of this run" in none.value.message and none.value.status == 200
    assert "No bisection has probed" in none.value.message and "{" not in none.value.message.split("<body>")[1]
    _bisection(records, "manual__b1", [{"sha": "c" * 40, "run_id": "probe__x"}])
    _bisection(records, "manual__b2", [{"sha": "d" * 40, "run_id": "probe__y"}])
    _bisection(records, "scheduled__b3", [], source={"run_id": RUN})
    with pytest.raises(views.NoBisection) as none:
        views.bisection_page(settings.DAG_ID, RUN)
    text = html.unescape(none.value.message)
    assert links.bisection_path(settings.BISECT_DAG_ID, "manual__b1") in text and "probed this run's commit" in text
    assert links.bisection_path(settings.BISECT_DAG_ID, "scheduled__b3") in text and "started by this run" in text
    assert "manual__b2" not in text and "<b>abc</b>" not in none.value.message and "&lt;b&gt;abc" in none.value.message


def test_a_bisection_without_its_answer_yet_is_a_page_too(records):
    (records / settings.BISECT_DAG_ID / run_key(RUN)).mkdir(parents=True)
    with pytest.raises(views.NoBisection) as none:
        views.bisection_page(settings.BISECT_DAG_ID, RUN)
    assert none.value.status == 404 and "No bisection result yet" in none.value.message


def test_one_runs_report_links_back_to_the_verifications_report(records):
    page = views.with_back_link("<html><body><h1>run 2</h1></body></html>", settings.DAG_ID, "report", RUN)
    bar = page[page.index("<body>"):page.index("<h1>")]
    assert f'href="{links.report_path(settings.DAG_ID, RUN)}"' in bar and "back to the verification's report" in bar
    assert "target=" not in bar


def test_a_long_fail_note_fits_the_runs_header_naming_its_first_breach_and_how_many_more():
    view = "http://ui/dags/rl_accuracy_verification/runs/r/plugin/verification-report"
    summary = {"verdict": "FAIL", "failure_classes": ["accuracy"], "suites": [
        {"suite": "opd", "verdict": "FAIL", "outcome": "FAIL (reproduced)", "runs": 2, "breached": [
            {"metric": "distillation/reduced_distillation_kl", "steps": "5"},
            {"metric": "distillation/reduced_distillation_abs_loss", "steps": "5"}]}]}
    line = ("FAIL (accuracy): opd distillation/reduced_distillation_kl breached at step 5; distillation/"
            f"reduced_distillation_abs_loss breached at step 5 (FAIL (reproduced) over 2 runs); report: {view}")
    note = reporting.run_note(summary, line, view)
    said, link = note.split(" ([report](")
    assert said == "FAIL (accuracy): opd distillation/reduced_distillation_kl breached at step 5 (+1 more)"
    assert len(said) <= reporting.NOTE_FITS and link == view + "))"
    short = f"FAIL (accuracy): grpo eval/accuracy breached at step 45; report: {view}"
    assert reporting.run_note({"verdict": "FAIL", "suites": []}, short, view) == (
        f"FAIL (accuracy): grpo eval/accuracy breached at step 45 ([report]({view}))")


def test_a_gate_that_says_no_skips_the_repeats_tasks_and_then_itself(monkeypatch):
    """In the grid an unrun repeat is all "skipped", its gate too: the gate skips the later tasks through the REST
    API (public, one bulk request) and raises AirflowSkipException instead of succeeding; when the API cannot,
    Airflow's SkipMixin.skip skips them (the gate then ends green)."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowSkipException, DownstreamTasksSkipped

    from rl_verify.orchestration import airflow_api, verification_dag

    sent = []
    monkeypatch.setattr(airflow_api, "skip_tasks", lambda conn, dag_id, run_id, tasks, note: sent.append(
        (dag_id, run_id, list(tasks), note)))
    ti = SimpleNamespace(dag_id="rl_accuracy_verification", run_id="manual__x")
    with pytest.raises(AirflowSkipException, match="no repeat 1 of opd"):
        verification_dag.skip_repeat(ti, ["fetch_opd-r1", "run_opd-r1"], "no repeat 1 of opd: decided")
    assert sent == [("rl_accuracy_verification", "manual__x", ["fetch_opd-r1", "run_opd-r1"],
                     "no repeat 1 of opd: decided")]

    def unreachable(*args):
        raise ConnectionError("API down")

    skipped = []

    def skip(ti, tasks):
        skipped.extend(t for t in tasks)
        raise DownstreamTasksSkipped(tasks=[t for t in tasks])

    monkeypatch.setattr(airflow_api, "skip_tasks", unreachable)
    ti.task = SimpleNamespace(skip=skip, dag=SimpleNamespace(get_task=lambda t: t))
    with pytest.raises(DownstreamTasksSkipped):
        verification_dag.skip_repeat(ti, ["run_opd-r1"], "no repeat 1 of opd: decided")
    assert skipped == ["run_opd-r1"]


def test_skip_tasks_asks_the_api_to_skip_each_task_with_the_reason(monkeypatch):
    """The client calls the gate makes exist in the pinned apache-airflow-client and carry what the API needs."""
    from contextlib import contextmanager

    import airflow_client.client as ac
    from airflow_client.client.exceptions import ConflictException

    from rl_verify.orchestration import airflow_api

    calls = []

    class FakeTaskInstanceApi:
        def __init__(self, client):
            assert client == "client"

        def patch_task_instance(self, dag_id, run_id, task_id, body):
            calls.append((dag_id, run_id, task_id, body.new_state, body.note))
            if task_id == "fetch_opd-r1":
                raise ConflictException(status=409, reason="Task id fetch_opd-r1 is already in skipped state")

    @contextmanager
    def fake_client(conn_id):
        yield "client"

    monkeypatch.setattr(airflow_api, "api_client", fake_client)
    monkeypatch.setattr(ac, "TaskInstanceApi", FakeTaskInstanceApi)
    airflow_api.skip_tasks("conn", "dag", "run", ["run_opd-r1", "fetch_opd-r1", "compare_opd-r1"], "no repeat 1")
    assert [c[2] for c in calls] == ["run_opd-r1", "fetch_opd-r1", "compare_opd-r1"]  # a 409 (skipped) goes on
    assert calls[0] == ("dag", "run", "run_opd-r1", "skipped", "no repeat 1")
