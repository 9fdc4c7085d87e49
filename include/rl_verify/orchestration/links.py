"""Where a person finds a run's report and the history: the UI plugin's routes, in one place.

The plugin (``plugins/rl_verify_views.py``) serves these paths; tasks write them into logs, run
notes and notifications. No Airflow import at module level: the DAG file and the plugin both use it.
"""

from __future__ import annotations

from urllib.parse import quote

#: URL prefix of the plugin's FastAPI app inside the API server.
APP_PREFIX = "/rl-verify"
#: ``url_route`` of the plugin's views inside the Airflow UI.
REPORT_VIEW_ROUTE = "verification-report"
HISTORY_VIEW_ROUTE = "verification-history"
BISECTION_VIEW_ROUTE = "bisection"


def report_path(dag_id: str, run_id: str) -> str:
    """The plugin route serving a run's HTML report (``dag_id`` and ``run_id`` URL-quoted)."""
    return f"{APP_PREFIX}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/report"


def run_report_path(dag_id: str, run_id: str, folder: str) -> str:
    """The plugin route serving the report of one run of a suite (``folder``: its record folder, e.g.
    ``opd`` for the first run, ``opd-r1`` for its first repeat)."""
    return f"{report_path(dag_id, run_id)}/{quote(folder, safe='')}"


def bisection_path(dag_id: str, run_id: str) -> str:
    """The plugin route serving a bisection run's result page (culprit, evidence table, plot)."""
    return f"{APP_PREFIX}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/bisection"


def files_path(dag_id: str, run_id: str) -> str:
    """The UI plugin's route listing (and, followed by a path inside it, serving) a run's record files."""
    return f"{APP_PREFIX}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/files"


def history_path(dag_id: str) -> str:
    """The plugin route serving the DAG's verification history."""
    return f"{APP_PREFIX}/dags/{quote(dag_id, safe='')}/history"


def proposal_plot_path(dag_id: str, run_id: str, suite: str) -> str:
    """The plugin route serving the plot of a calibration run's proposal for ``suite``."""
    return (f"{APP_PREFIX}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
            f"/proposal/{quote(suite, safe='')}.png")


def run_page_path(dag_id: str, run_id: str) -> str:
    """The Airflow UI page of a DAG run."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def report_view_path(dag_id: str, run_id: str) -> str:
    """The Airflow UI page of a run with the report view open (the UI's plugin route)."""
    return f"{run_page_path(dag_id, run_id)}/plugin/{REPORT_VIEW_ROUTE}"


def absolute(base_url: str | None, path: str) -> str:
    """``path`` under the API server's public base URL (``[api] base_url``); the path alone without one."""
    return (base_url or "").rstrip("/") + path


def ui_base_url() -> str | None:
    """``[api] base_url`` of this deployment, or None when unset."""
    from airflow.sdk.configuration import conf

    return conf.get("api", "base_url", fallback=None) or None
