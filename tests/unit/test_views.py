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
