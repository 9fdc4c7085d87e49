"""The UI plugin's routes pick files from listings of the record store, never from request paths."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from rl_verify import settings

from rl_verify.orchestration import links

from rl_verify.orchestration import views
from rl_verify.core.names import run_key

CAL = settings.CALIBRATION_DAG_ID
RUN = "manual__2026-12-01T06:00:00.123456+00:00"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    plot = (tmp_path / CAL / run_key(RUN) / settings.CALIBRATION_RECORD_FOLDER / "opd" / "proposal"
            / "runs.png")
    plot.parent.mkdir(parents=True)
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "secret.png").write_bytes(b"not yours")
    return tmp_path


def test_a_calibration_runs_proposal_plot_is_found_by_dag_run_and_suite(store):
    assert views.proposal_plot(CAL, RUN, "opd").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("dag_id, run_id, suite", [
    (settings.DAG_ID, RUN, "opd"),          # a verification run has no proposal
    ("other_dag", RUN, "opd"),
    (CAL, RUN, "grpo"),                     # a suite the calibration did not run
    (CAL, RUN, ".."), (CAL, RUN, "opd/proposal"), (CAL, RUN, "../../../secret"),
    (CAL, "../..", "opd"), (CAL, "manual__nope", "opd"), (CAL, "", "opd"),
])
def test_anything_but_a_proposal_plot_of_the_calibration_dag_is_404(store, dag_id, run_id, suite):
    with pytest.raises(HTTPException) as err:
        views.proposal_plot(dag_id, run_id, suite)
    assert err.value.status_code == 404


def test_the_plot_path_quotes_the_run_id_and_the_suite():
    path = links.proposal_plot_path(CAL, RUN, "opd")
    assert path == (f"{links.APP_PREFIX}/dags/{CAL}/runs/manual__2026-12-01T06%3A00%3A00.123456%2B00%3A00"
                    "/proposal/opd.png")
    assert links.proposal_plot_path(CAL, "a/b", "x/y").endswith("/runs/a%2Fb/proposal/x%2Fy.png")


@pytest.fixture
def verification_record(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    folder = tmp_path / settings.DAG_ID / run_key(RUN)
    (folder / "opd").mkdir(parents=True)
    (folder / "report.html").write_text("<html><head></head><body><h1>RL accuracy verification: PASS</h1>"
                                        "</body></html>")
    (folder / "opd" / "tracker.jsonl").write_text('{"step": 1}\n')
    (folder / "opd" / ".hidden").write_text("no")
    (tmp_path / "secret.txt").write_text("not yours")
    return folder


def test_a_record_file_is_served_by_its_path_inside_the_record(verification_record):
    assert views.record_file(settings.DAG_ID, RUN, "opd/tracker.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("rel", ["..", "../secret.txt", "opd/../../secret.txt", "opd/.hidden", "opd", "",
                                 "opd//tracker.jsonl", "/etc/passwd", "opd/tracker.jsonl/x", "%2e%2e/secret.txt"])
def test_anything_but_a_file_of_the_record_is_404(verification_record, rel):
    with pytest.raises(HTTPException) as err:
        views.record_file(settings.DAG_ID, RUN, rel)
    assert err.value.status_code == 404


def test_the_served_report_links_back_to_the_history_in_the_same_frame(verification_record):
    page = views.with_back_link((verification_record / "report.html").read_text(), settings.DAG_ID, "history")
    bar = page[page.index("<body>"):page.index("<h1>")]
    assert f'href="{links.history_path(settings.DAG_ID)}"' in bar and "back to the verification history" in bar
    assert "target=" not in bar  # Airflow's iframe sandbox forbids top navigation: the link stays in the frame
    other = views.with_back_link("<body>x</body>", settings.DAG_ID, "<script>")
    assert "<script>" not in other.replace("<body>x</body>", "") and "Verification history" in other


def test_history_rows_link_to_the_report_route_in_the_same_frame(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    folder = tmp_path / settings.DAG_ID / run_key(RUN)
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({"dag_run_id": RUN, "verdict": "PASS", "commit": "a" * 40,
                                                    "commit_ref": "main", "suites": [
        {"suite": "opd", "verdict": "PASS", "checks": [{"metric": "eval/gsm8k/acc", "step": 0, "error": 0.001,
                                                        "threshold": 0.03, "passed": True}]}]}))
    page = views.history_page(settings.DAG_ID)
    href = f'href="{links.report_path(settings.DAG_ID, RUN)}?from=history"'
    assert href in page and "_top" not in page
