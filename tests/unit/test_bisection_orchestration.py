"""The bisection DAG's task bodies that need no node or API: params, the record's decided ends, a probe's
reading, the asset events that start a bisection, the probes' pre-approval, the result page."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rl_verify import engines, settings
from rl_verify.core import bisect, bisect_report
from rl_verify.core.names import run_key
from rl_verify.orchestration import airflow_api, approval, asset_events, bisection, probes, verification_history
from rl_verify.orchestration.standing import ApprovalRecord
from simulator.checkout import checkout_files

GOOD, BAD = "a" * 40, "f" * 40
#: A checkout's files that every shipped suite's path rule matches: the simulated checkout's.
SHIPPED_RULES_TREE = checkout_files()
MIDDLE = ["b" * 40, "c" * 40, "d" * 40]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    return tmp_path


def _verification(store, run_id, sha, outcomes, fingerprint="0123456789abcdef", classes=None, baselines=None,
                  checks=None):
    folder = store / settings.DAG_ID / run_key(run_id)
    folder.mkdir(parents=True)
    suites = [{"suite": s, "verdict": "PASS" if o.startswith("PASS") else "FAIL",
               "failure_class": (classes or {}).get(s, None if o.startswith("PASS") else "accuracy"),
               "outcome": {"outcome": o, "reason": f"{s} {o}", "runs": [{}, {}]}, "checks": checks or []}
              for s, o in outcomes.items()]
    (folder / "report.json").write_text(json.dumps({"commit": sha, "dag_run_id": run_id, "suites": suites,
                                                    "baselines": baselines or {"opd": "v1"}}))
    (folder / "card.md").write_text(f"...\nExperiment fingerprint: `{fingerprint}` (suites, specs...)\n")
    return folder


def _params(**over):
    return {"good": "sim/bisect-good", "bad": "sim/bisect-bad", "suites": ["opd"], "nodes": "rl_gpu_node",
            "metrics": [], "max_commits": 64, "repeats": 2, **over}


# --- params -------------------------------------------------------------------------------------------

def test_params_are_validated_and_every_problem_is_named_with_its_fix_at_once():
    with pytest.raises(bisection.BisectParamError) as err:
        bisection.validated_params(_params(good="bad commit;rm", suites=["nope"], nodes="a b", max_commits=500,
                                           metrics=["eval/gsm8k/acc", "rm -rf"]))
    text = str(err.value)
    assert text.startswith("5 problem(s)") and "nothing was launched" in text
    for param in ("'good'", "'suites'", "'nodes'", "'max_commits'", "'metrics'"):
        assert f"param {param}" in text
    assert text.count("Fix:") == 5


def test_the_same_commit_as_good_and_bad_is_refused_naming_both_params():
    with pytest.raises(bisection.BisectParamError, match="params 'good' and 'bad' are the same commit.*Fix:"):
        bisection.validated_params(_params(good="v1.2", bad="v1.2"))


def test_an_unknown_metric_to_follow_is_refused_with_the_suites_metrics_named():
    assert bisection._unknown_metrics(["eval/gsm8k/acc", "eval/nope"], [engines.load_suite("opd")]) == ["eval/nope"]


def test_the_reproduced_fail_event_fills_the_params_of_an_automatic_bisection():
    p = bisection.validated_params({"nodes": "n1,n2", "good": "", "bad": "", "suites": []},
                                   {"good": GOOD, "bad": BAD, "suites": ["opd"], "metrics": ["eval/gsm8k/acc"]})
    assert (p["good"], p["bad"], p["suites"], p["metrics"], p["nodes"]) == (GOOD, BAD, ["opd"], ["eval/gsm8k/acc"],
                                                                          ["n1", "n2"])


def test_a_node_named_twice_is_refused():
    with pytest.raises(bisection.BisectParamError, match="names a node twice"):
        bisection.validated_params(_params(nodes="n1,n1"))


# --- the record's decided ends -------------------------------------------------------------------------

def test_an_end_is_taken_from_the_record_only_when_commit_fingerprint_and_baseline_match_and_it_was_decided(store):
    _verification(store, "scheduled__2026-11-30T18:00:00+00:00", GOOD, {"opd": "PASS"})
    _verification(store, "scheduled__2026-12-01T18:00:00+00:00", BAD, {"opd": "FAIL (reproduced)"})
    shas = [GOOD, *MIDDLE, BAD]
    assert verification_history.recorded_readings(shas, ["opd"], "0123456789abcdef") == {GOOD: bisect.Reading.GOOD,
                                                                               BAD: bisect.Reading.BAD}
    # Another experiment (fingerprint), another baseline version, no fingerprint at all: re-checked.
    assert verification_history.recorded_readings(shas, ["opd"], "fedcba9876543210") == {}
    assert verification_history.recorded_readings(shas, ["opd"], "0123456789abcdef", {"opd": "v2"}) == {}
    assert verification_history.recorded_readings(shas, ["opd"], None) == {}


def test_an_undecided_or_middle_commit_in_the_record_is_not_taken(store):
    _verification(store, "manual__1", GOOD, {"opd": "INCONCLUSIVE"})
    _verification(store, "manual__2", MIDDLE[0], {"opd": "PASS"})
    assert verification_history.recorded_readings([GOOD, *MIDDLE, BAD], ["opd"], "0123456789abcdef") == {}


# --- a probe's reading -----------------------------------------------------------------------------------

def test_a_probe_without_a_report_could_not_be_checked_out_and_reads_skip(store):
    reading, row = probes.probe_reading("bisect__x__aaaa__0", {"suites": ["opd"], "metrics": []})
    assert reading == bisect.Reading.SKIP and row["runs"] == 0 and "could not be checked out" in row["why"]


@pytest.mark.parametrize("outcome, klass, want", [
    ("FAIL (reproduced)", "accuracy", bisect.Reading.BAD),
    ("PASS (not reproduced)", None, bisect.Reading.GOOD),
    ("PASS", None, bisect.Reading.GOOD),
    ("FAIL", "infrastructure", bisect.Reading.SKIP),
    ("INCONCLUSIVE", "accuracy", bisect.Reading.UNSURE),
])
def test_a_probes_outcome_is_its_reading_and_its_row_carries_the_followed_metrics_first_breach(store, outcome, klass,
                                                                                               want):
    checks = [{"metric": "eval/gsm8k/acc", "step": 5, "error": 0.01, "threshold": 0.03, "passed": True},
              {"metric": "distillation/reduced_distillation_kl", "step": 10, "error": 0.041, "threshold": 0.03,
               "passed": False},
              {"metric": "distillation/reduced_distillation_kl", "step": 15, "error": 0.05, "threshold": 0.03,
               "passed": False}]
    _verification(store, "bisect__b__x__0", MIDDLE[0], {"opd": outcome}, classes={"opd": klass}, checks=checks)
    reading, row = probes.probe_reading("bisect__b__x__0", {"suites": ["opd"], "metrics": []})
    assert reading == want and row["runs"] == 2 and row["report"].endswith("/report")
    assert (row["metric"], row["error"], row["step"]) == ("distillation/reduced_distillation_kl", 0.041, 10)
    # A followed metric named by the bisection wins (its largest error when it did not breach).
    _, row = probes.probe_reading("bisect__b__x__0", {"suites": ["opd"], "metrics": ["eval/gsm8k/acc"]})
    assert (row["metric"], row["error"]) == ("eval/gsm8k/acc", 0.01)


# --- asset events ------------------------------------------------------------------------------------------

def _summary(verdict, outcome="FAIL (reproduced)", klass="accuracy"):
    return {"verdict": verdict, "failure_classes": [klass] if verdict == "FAIL" else [],
            "suites": [{"suite": "opd", "verdict": "FAIL", "failure_class": klass, "outcome": outcome,
                        "breached": [{"metric": "distillation/reduced_distillation_kl", "step": 10}]}]}


def test_a_scheduled_reproduced_accuracy_fail_with_a_known_last_pass_starts_a_bisection(store):
    _verification(store, "scheduled__2026-11-30T18:00:00+00:00", GOOD, {"opd": "PASS"})
    nightly = "scheduled__2026-12-01T18:00:00+00:00"
    _verification(store, nightly, BAD, {"opd": "FAIL (reproduced)"})
    extra = asset_events.reproduced_fail_extra(_summary("FAIL"), nightly, "scheduled")
    assert extra["good"] == GOOD and extra["bad"] == BAD and extra["suites"] == ["opd"]
    assert extra["metrics"] == ["distillation/reduced_distillation_kl"] and extra["fingerprint"] == "0123456789abcdef"
    assert extra["run_id"] == nightly and extra["report"].endswith("/verification-report")


def test_no_bisection_for_a_manual_run_an_infrastructure_fail_an_unreproduced_fail_or_no_known_pass(store):
    nightly = "scheduled__2026-12-01T18:00:00+00:00"
    _verification(store, nightly, BAD, {"opd": "FAIL (reproduced)"})
    assert asset_events.reproduced_fail_extra(_summary("FAIL"), nightly, "scheduled") is None  # no PASS known
    _verification(store, "scheduled__2026-11-30T18:00:00+00:00", GOOD, {"opd": "PASS"})
    assert asset_events.reproduced_fail_extra(_summary("FAIL"), nightly, "manual") is None
    assert asset_events.reproduced_fail_extra(_summary("FAIL", "FAIL", "infrastructure"), nightly, "scheduled") is None
    assert asset_events.reproduced_fail_extra(_summary("FAIL", "FAIL", "accuracy"), nightly, "scheduled") is None
    assert asset_events.reproduced_fail_extra(_summary("PASS", "PASS"), nightly, "scheduled") is None


def test_a_pass_emits_the_verified_commit_and_nothing_else_does(store):
    run = "manual__ok"
    _verification(store, run, GOOD, {"opd": "PASS"})
    extra = asset_events.verified_commit_extra({"verdict": "PASS", "suites": [{"suite": "opd"}]}, run)
    assert extra["sha"] == GOOD and extra["suites"] == ["opd"] and extra["baselines"] == {"opd": "v1"}
    assert extra["report"].endswith("/verification-report")
    assert asset_events.verified_commit_extra({"verdict": "FAIL", "suites": []}, run) is None


def test_an_event_is_emitted_with_its_extra_and_a_missing_one_skips_the_task():
    from airflow.sdk import Asset
    from airflow.sdk.exceptions import AirflowSkipException

    events = {Asset("x-rl-verify://x"): SimpleNamespace(extra={})}
    asset_events.announce(events, next(iter(events)), {"sha": GOOD})
    assert next(iter(events.values())).extra == {"sha": GOOD}
    with pytest.raises(AirflowSkipException):
        asset_events.announce(events, next(iter(events)), None)


# --- the probes' pre-approval --------------------------------------------------------------------------------

@pytest.fixture
def approved(store, monkeypatch):
    plan = {"commits": [{"sha": s} for s in (GOOD, *MIDDLE, BAD)], "suites": ["opd"]}
    (store / settings.BISECT_DAG_ID / run_key("manual__b")).mkdir(parents=True)
    (store / settings.BISECT_DAG_ID / run_key("manual__b") / bisection.PLAN_FILE).write_text(json.dumps(plan))
    answer = {"record": ApprovalRecord(run_type="manual", responded_by="alice", responded_at="2026-12-02T03:00:00Z",
                                       chosen_options=["Approve"], params_input={}, body="")}
    monkeypatch.setattr(airflow_api, "approval_record", lambda *a: answer["record"])
    return answer


def test_a_probe_in_the_approved_range_proceeds_on_the_bisections_one_human_approval(approved):
    reasons, record = approval.preapproval_refusals("manual__b", MIDDLE[1], ["opd"])
    assert reasons == [] and record.responded_by == "alice"


def test_a_probe_outside_the_range_of_other_suites_or_of_an_unapproved_bisection_is_refused(approved):
    reasons, _ = approval.preapproval_refusals("manual__b", "9" * 40, ["opd", "grpo"])
    assert any("not in the approved range" in r for r in reasons) and any("not the approved" in r for r in reasons)
    approved["record"] = ApprovalRecord(run_type="manual", responded_by="alice", responded_at=None,
                                        chosen_options=["Reject"], params_input={}, body="")
    assert approval.preapproval_refusals("manual__b", MIDDLE[1], ["opd"])[0] == [
        "the bisection's card was not approved (Reject)"]
    approved["record"] = None
    refused = approval.preapproval_refusals("manual__b", MIDDLE[1], ["opd"])[0]
    assert refused == ["nobody approved the bisection's card"]
    assert "no plan" in approval.preapproval_refusals("manual__other", MIDDLE[1], ["opd"])[0][0]


# --- the card and the result page ------------------------------------------------------------------------------

def _plan():
    commits = [{"sha": s, "subject": f"change {i} | with a pipe", "author": "Ana <ana@x>", "date": "2026-11-30T10:00"}
               for i, s in enumerate((GOOD, *MIDDLE, BAD))]
    return {"good": "v1", "bad": "main", "suites": ["opd"], "metrics": [], "nodes": ["n1", "n2"], "repeats": 2,
            "commits": commits, "recorded": {GOOD: "good"}, "fingerprint": "0123456789abcdef",
            "dag_run_id": "manual__b",
            "worst": {"probes": 6, "rounds": 3, "runs": 18, "gpu_hours": 36.0, "wall_hours": 2.2}}


def test_the_card_lists_every_commit_the_cost_at_the_runbooks_scale_and_says_no_standing_approval_covers_it():
    text = bisection.card(_plan())["markdown"]
    for s in (GOOD, *MIDDLE, BAD):
        assert s[:12] in text
    assert "change 2 \\| with a pipe" in text  # a subject cannot break the table
    assert "**Probes at most: 6**" in text and "18 training runs, 36.0 GPU-hours" in text and "opd 15 min" in text
    assert "taken from the record (good)" in text and "bad ffffffffffff: re-checked" in text
    assert "A standing approval of the nightly does not cover a bisection" in text


def test_the_result_page_names_the_culprit_links_each_probes_report_escapes_what_it_shows_and_plots_the_metric(
        tmp_path):
    plan = _plan()
    culprit = plan["commits"][2]
    result = {"good": "v1", "bad": "main<script>", "suites": ["opd"], "nodes": ["n1", "n2"], "commits": plan["commits"],
              "runs": 5, "wall_s": 600.0,
              "answer": {"kind": "culprit", "reason": "the culprit is cccc", "culprit": culprit, "skipped": [],
                         "range": [culprit]},
              "probes": [{"sha": MIDDLE[0], "node": "n1", "runs": 2, "outcome": "opd PASS (not reproduced)",
                          "metric": "eval/gsm8k/acc", "error": 0.01, "threshold": 0.03, "fraction": 0.33, "step": 5,
                          "report": "/rl-verify/dags/x/runs/a/report", "run_id": "a"},
                         {"sha": MIDDLE[1], "node": "n2", "runs": 3, "outcome": "opd FAIL (reproduced)",
                          "metric": "eval/gsm8k/acc", "error": -0.05, "threshold": 0.03, "fraction": 1.67, "step": 10,
                          "report": "/rl-verify/dags/x/runs/b/report", "run_id": "b"},
                         {"sha": MIDDLE[2], "node": "n1", "runs": 0, "outcome": "SKIP", "run_id": "c",
                          "report": "/r/c"}]}
    written = bisect_report.write(tmp_path, result)
    page = written["html"].read_text()
    assert "Culprit: cccccccccccc change 2" in page and "main&lt;script&gt;" in page and "<script>" not in page
    assert page.count('<a href="/rl-verify/dags/x/runs/') == 2  # the skipped probe has no report to link
    assert "data:image/png;base64," in page and written["png"].read_bytes()[:4] == b"\x89PNG"
    assert "| `cccccccccccc` |" in written["md"].read_text()
    assert "error at first breach" in page and "-0.05 at step 10 (167% of its threshold)" in page


def test_the_nightly_fails_report_links_its_bisection_escaped(store):
    from rl_verify.orchestration import views

    folder = _verification(store, "scheduled__2026-12-01T18:00:00+00:00", BAD, {"opd": "FAIL (reproduced)"})
    page = "<html><body><h1>FAIL</h1></body></html>"
    assert views._with_bisection_link(folder, page) == page  # no bisection yet
    linked = {"bisection": "asset_triggered__x", "answer": "the <b>culprit",
              "link": "/rl-verify/dags/rl_regression_bisect/runs/x/bisection"}
    (folder / bisection.RESULT_FILE).write_text(json.dumps(linked))
    shown = views._with_bisection_link(folder, page)
    assert shown.startswith('<html><body><p style=') and shown.endswith("<h1>FAIL</h1></body></html>")
    assert 'href="/rl-verify/dags/rl_regression_bisect/runs/x/bisection"' in shown and "the &lt;b&gt;culprit" in shown


def test_a_probes_report_link_names_the_probe_dag_and_its_record_is_the_verifications(store):
    from rl_verify.orchestration import views

    run = probes.probe_run_id("manual__b", MIDDLE[0], 1)
    assert run.startswith(settings.PROBE_RUN_PREFIX) and settings.verification_dag_of(run) == settings.PROBE_DAG_ID
    assert settings.verification_dag_of("scheduled__2026-12-01T18:00:00+00:00") == settings.DAG_ID
    assert str(views.dag_records(settings.PROBE_DAG_ID)) == str(views.dag_records(settings.DAG_ID))


# --- issue 30: the card's promise, a stopped probe's row, a bisection without an answer -------------------------

def _spent_by_the_planner(n_commits: int, free: int, culprit: int, skipped: int | None) -> int:
    """Probes ``core.bisect.plan`` launches over good + ``n_commits`` with truthful readings, the commit at
    ``skipped`` (if any) unlaunchable, every round waiting for all its probes."""
    commits = [f"c{i}" for i in range(n_commits + 1)]
    readings: dict[str, list] = {}
    probes = 0
    while True:
        step = bisect.plan(commits, readings, (), free, max_commits=n_commits)
        if step.done:
            return probes
        for c in step.probe:
            i = commits.index(c)
            readings.setdefault(c, []).append(bisect.Reading.SKIP if i == skipped else
                                              bisect.Reading.GOOD if i < culprit else bisect.Reading.BAD)
        probes += len(step.probe)
        assert probes < 10 * len(commits), "the planner did not end"


@pytest.mark.parametrize("n_commits", [1, 2, 3, 5, 8, 12, 16])
@pytest.mark.parametrize("free", [1, 2])
def test_the_cards_probes_at_most_is_what_the_planner_can_spend_with_an_unlaunchable_commit(n_commits, free):
    scale = {"opd": {"minutes": 15.0, "gpus": 8}}
    promised = bisection.promised_worst(n_commits, free, False, False, 3, scale)
    with_skip = max(_spent_by_the_planner(n_commits, free, culprit, skipped)
                    for culprit in range(1, n_commits + 1) for skipped in [None, *range(1, n_commits)])
    without = max(_spent_by_the_planner(n_commits, free, culprit, None) for culprit in range(1, n_commits + 1))
    assert promised["probes"] == with_skip and promised["probes_no_skip"] == without
    assert promised["runs"] == 3 * with_skip and promised["gpu_hours"] == round(with_skip * 3 * 15 * 8 / 60, 1)


def test_the_card_of_16_commits_on_2_nodes_promises_the_11_probes_one_skip_can_cost():
    scale = {"opd": {"minutes": 15.0, "gpus": 8}}
    plan = {**_plan(), "worst": bisection.promised_worst(16, 2, False, False, 3, scale)}
    text = bisection.card(plan)["markdown"]
    assert "**Probes at most: 11**" in text and "9 if every commit launches" in text, text


def test_a_stopped_probes_row_links_its_report_or_says_it_has_none(store):
    run = probes.probe_run_id("manual__b", MIDDLE[0], 0)
    assert probes.stopped_probe_evidence(run)["report"] is None
    row = {"sha": MIDDLE[0], "node": "n1", "outcome": "stopped", "stopped": "outside the open range", "run_id": run,
           **probes.stopped_probe_evidence(run)}
    result = {"good": "v1", "bad": "main", "suites": ["opd"], "nodes": ["n1"], "commits": _plan()["commits"],
              "runs": 0, "wall_s": 60.0, "answer": {"kind": "culprit", "reason": "r", "culprit": None}, "probes": [row]}
    assert "stopped: no report" in bisect_report.markdown(result)
    assert "stopped: no report" in bisect_report.html_page(result, None) and row["run_page"] in \
        bisect_report.html_page(result, None)
    _verification(store, run, MIDDLE[0], {"opd": "PASS"})
    evidence = probes.stopped_probe_evidence(run)
    assert evidence["report"] == f"/rl-verify/dags/{settings.PROBE_DAG_ID}/runs/{run}/report" and evidence["runs"] == 2
    assert 'href="/rl-verify/dags/' in bisect_report.html_page({**result, "probes": [{**row, **evidence}]}, None)


def test_a_bisection_that_ends_without_a_culprit_fails_its_run_with_the_reason(monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from rl_verify.orchestration.probes import BisectOperator

    plan = {**_plan(), "recorded": {}, "nodes": ["n1"]}
    finished = []
    monkeypatch.setattr(bisection, "finish", lambda plan, rows, answer, wall, run_id: finished.append(answer) or {
        "answer": answer, "link": "/rl-verify/dags/rl_regression_bisect/runs/manual__b/bisection"})
    monkeypatch.setattr(probes, "probe_reading", lambda run_id, plan: (bisect.Reading.SKIP, {
        "run_id": run_id, "outcome": "SKIP", "runs": 0, "report": None}))
    op = BisectOperator(task_id="bisect", plan=plan)
    state = {"started": 0.0, "running": {"p-bad": {"sha": BAD, "node": "n1"}}, "stopping": {}, "readings": {},
             "rows": [], "count": {BAD: 1}}
    with pytest.raises(AirflowFailException, match="without a culprit \\(end not judged\\)"):
        op._step({"run_id": "manual__b"}, state, {"p-bad": "success"})
    assert finished and finished[0]["kind"] == bisect.END_SKIPPED  # the result is kept before the run fails


def test_a_probe_the_live_check_stopped_early_says_so_in_its_row_and_the_page_counts_such_probes(store):
    run = probes.probe_run_id("manual__b", MIDDLE[1], 0)
    folder = _verification(store, run, MIDDLE[1], {"opd": "FAIL (reproduced)"})
    report = json.loads((folder / "report.json").read_text())
    report["suites"][0]["details"] = {"early_abort": {"applied": True, "step": 10, "expected_steps": 25}}
    (folder / "report.json").write_text(json.dumps(report))
    reading, row = probes.probe_reading(run, {**_plan(), "suites": ["opd"]})
    assert reading is bisect.Reading.BAD and row["aborted_at"] == {"opd": "step 10 of 25"}
    result = {"good": "v1", "bad": "main", "suites": ["opd"], "nodes": ["n1"], "commits": _plan()["commits"],
              "runs": 2, "wall_s": 60.0, "answer": {"kind": "culprit", "reason": "r", "culprit": None},
              "probes": [{**row, "sha": MIDDLE[1], "node": "n1", "reading": "bad"},
                         {"sha": GOOD, "node": "n1", "runs": 1, "outcome": "opd PASS", "run_id": "g", "report": "/r"}]}
    text = bisect_report.markdown(result)
    assert "(opd aborted early at step 10 of 25)" in text and "1 of 1 probe(s) that read bad were aborted early" in text


def test_commits_whose_diff_from_the_good_end_cannot_move_a_number_are_good_without_a_probe(monkeypatch):
    from rl_verify.engines import load_suite
    from rl_verify.node import ops as node_ops
    from rl_verify.orchestration import bisection as orchestration_bisection

    diffs = {"c1": ["CHANGELOG.md", "docs/en/rl/grpo.md"], "c2": ["CHANGELOG.md", "xtuner/v1/rl/loss.py"],
             "c3": None, "c4": ["tests/test_x.py"]}

    def changed(client, checkout, base, head):
        assert base == "good"
        if head == "c5":
            raise node_ops.NodeError("git failed")
        return diffs[head]

    tree = list(SHIPPED_RULES_TREE)
    monkeypatch.setattr(node_ops, "changed_files", changed)
    monkeypatch.setattr(node_ops, "tree_files", lambda client, checkout, sha: tree if sha == "bad" else None)
    verdicts: list[dict] = []
    monkeypatch.setattr(orchestration_bisection.verification_history, "suite_verdicts", lambda suites: verdicts)
    shas = ["good", "c1", "c2", "c3", "c4", "c5", "bad"]
    specs = [load_suite("grpo"), load_suite("opd")]
    # c2 touches code, c3's base is not in the checkout, c5's diff cannot be read: probed as usual.
    assert orchestration_bisection.unmoved_commits(object(), "/ckpt", shas, specs) == ["c1", "c4"]
    # The record doubts c1 (a FAIL of it): probed, whatever its diff says (issue 42).
    verdicts.append({"suite": "opd", "sha": "c1", "outcome": "FAIL (reproduced)", "failure_class": "accuracy",
                     "run_id": "manual__x", "report": "/r", "written_at": 1.0, "doubting": True})
    assert orchestration_bisection.unmoved_commits(object(), "/ckpt", shas, specs) == ["c4"]
    # A rule naming a path the bad end does not have decides nothing: every commit is probed.
    tree[:] = [f for f in SHIPPED_RULES_TREE if not f.startswith("recipe/")]
    assert orchestration_bisection.unmoved_commits(object(), "/ckpt", shas, specs) == []
