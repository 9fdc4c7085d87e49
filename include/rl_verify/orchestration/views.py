"""The UI plugin's web app: a run's verification report, the DAG's verification history, and the
plots of a calibration's proposal (linked from its approval card).

Mounted by ``plugins/rl_verify_views.py`` in the Airflow API server (``fastapi_apps``) at
``links.APP_PREFIX``. Every route depends on Airflow's own auth: the auth manager must allow the
caller to read the runs of the DAG named in the path (``requires_access_dag("GET", RUN)``), so an
anonymous request gets 401/403 and a user without access to that DAG 403. A run id that does not
name a record folder of that DAG (``..``, encoded or not, a slash, a made-up id) is 404; no path
from the request ever reaches the filesystem but a folder name chosen from a listing.
"""

from __future__ import annotations

import html
import io
import json
import logging
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from rl_verify import settings
from rl_verify.core import history
from rl_verify.core.names import run_key
from rl_verify.orchestration import links
from rl_verify.store import record

log = logging.getLogger(__name__)


def _dag_access():
    """Airflow's own dependency: the caller may read the runs of the path's ``dag_id`` (401/403 otherwise)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return Depends(requires_access_dag("GET", DagAccessEntity.RUN))


def dag_records(dag_id: str) -> Any:
    """The records of a DAG rl-verify knows, in the record store (404 for any other DAG id)."""
    if dag_id not in (settings.DAG_ID, settings.PROBE_DAG_ID, settings.BISECT_DAG_ID):
        raise HTTPException(404, f"no verification records for DAG {dag_id!r}")
    return record.dag_store(dag_id)


def _listed(folder: Any, name: str) -> Any | None:
    """The entry of ``folder`` called ``name``, chosen from a listing (None when there is none)."""
    entries = {p.name: p for p in folder.iterdir()} if folder.exists() else {}
    return entries.get(name)


def _record_folder(records: Any, run_id: str) -> Any | None:
    """The record folder of ``run_id`` in a DAG's ``records``: its name is computed from the id, then
    looked up in a listing."""
    try:
        name = run_key(run_id)
    except Exception as err:  # an id run_key refuses cannot name a run
        raise HTTPException(404, "no such run") from err
    return _listed(records, name)


def run_folder(dag_id: str, run_id: str) -> Any:
    """The record folder of the verification run ``run_id`` (404 unless it has a report)."""
    folder = _record_folder(dag_records(dag_id), run_id)
    if folder is None or not (folder / "report.html").is_file():
        raise HTTPException(404, f"no verification report for run {run_id!r} (yet)")
    return folder


def run_report(dag_id: str, run_id: str, folder: str) -> Any:
    """The report of one run of a repeated suite (``folder``: its record folder, chosen from a listing of
    the run's record; 404 for anything else)."""
    chosen = _listed(run_folder(dag_id, run_id), folder)
    page = chosen / "report.html" if chosen is not None else None
    if page is None or not page.is_file():
        raise HTTPException(404, f"no report of run {folder!r} in verification run {run_id!r}")
    return page


class NoBisection(Exception):
    """The Bisection tab of a run that has no bisection result: said as a page (``message``, escaped HTML),
    never as the API's JSON error."""

    def __init__(self, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def bisection_page(dag_id: str, run_id: str) -> str:
    """The bisection run's result page. A verification or probe run has none: a page says so and links the
    bisections that probed its commit or that its FAIL started (:func:`related_bisections`); a bisection
    run without its answer yet says where to look. Another DAG is 404."""
    if dag_id in (settings.DAG_ID, settings.PROBE_DAG_ID):
        raise NoBisection(_no_bisection_html(dag_id, run_id))
    if dag_id != settings.BISECT_DAG_ID:
        raise HTTPException(404, f"DAG {dag_id!r} runs no bisections")
    folder = _record_folder(dag_records(dag_id), run_id)
    page = _listed(folder, "bisection.html") if folder is not None else None
    if page is None or not page.is_file():
        raise NoBisection(_page("Bisection", "<h1>No bisection result yet</h1><p>This bisection has no answer yet: "
                                "its probes may still run. The <code>bisect</code> task's log says what it is "
                                "doing.</p>"), status=404)
    return page.read_bytes().decode("utf-8")


#: The most bisection records the Bisection tab of a verification run reads to find those that probed it.
RELATED_BISECTIONS_SCANNED = 200


def related_bisections(dag_id: str, run_id: str) -> list[dict[str, str]]:
    """The bisections that probed this run's commit, ran this probe, or that this run's FAIL started: each
    ``{"bisection": run id, "link": its page, "why": in words, "answer": its headline}`` (newest records
    first, at most :data:`RELATED_BISECTIONS_SCANNED` read)."""
    folder = _record_folder(dag_records(dag_id), run_id)
    commit = None
    if folder is not None:
        try:
            commit = json.loads((folder / "report.json").read_bytes()).get("commit")
        except (OSError, ValueError):
            commit = None
    store = record.dag_store(settings.BISECT_DAG_ID)
    folders = sorted((p for p in store.iterdir()), key=lambda p: p.name, reverse=True) if store.exists() else []
    out = []
    for bis in folders[:RELATED_BISECTIONS_SCANNED]:
        result_file = _listed(bis, "bisection.json")
        try:
            result = json.loads(result_file.read_bytes()) if result_file is not None else None
        except (OSError, ValueError):
            result = None
        if not isinstance(result, dict):
            continue
        probes = result.get("probes") or []
        why = ("started by this run's FAIL" if (result.get("source") or {}).get("run_id") == run_id else
               "this run is one of its probes" if any(p.get("run_id") == run_id for p in probes) else
               "it probed this run's commit" if commit and any(p.get("sha") == commit for p in probes) else None)
        if why:
            answer = (result.get("answer") or {}).get("reason") or ""
            name = str(result.get("dag_run_id") or bis.name)
            # the plugin's own route, in this frame: Airflow's sandboxed iframe allows no top navigation
            out.append({"bisection": name, "why": why, "answer": str(answer),
                        "link": links.bisection_path(settings.BISECT_DAG_ID, name)})
    return out


def _no_bisection_html(dag_id: str, run_id: str) -> str:
    esc = html.escape
    related = related_bisections(dag_id, run_id)
    body = ["<h1>No bisection of this run</h1>",
            "<p>A bisection is a run of the DAG <code>rl_regression_bisect</code>: it starts on its own after a "
            "scheduled verification's FAIL is reproduced, or by hand with a good and a bad commit. This run is a "
            "verification" + (" probe" if dag_id == settings.PROBE_DAG_ID else "") + ", not a bisection.</p>"]
    if related:
        body.append("<h2>Bisections that probed it</h2><ul>")
        body += [f'<li><a href="{esc(r["link"])}">{esc(r["bisection"])}</a> ({esc(r["why"])})'
                 + (f": {esc(r['answer'])}" if r["answer"] else "") + "</li>" for r in related]
        body.append("</ul>")
    else:
        body.append("<p>No bisection has probed this run's commit.</p>")
    body.append(f'<p><a href="{esc(links.report_path(dag_id, run_id))}">&larr; this run\'s verification report</a>'
                "</p>")
    return _page("Bisection", "".join(body))


def _page(title: str, body: str) -> str:
    style = ("body{font-family:system-ui,sans-serif;margin:1.2em;color:#222;overflow-wrap:anywhere}" + WIDE_CSS)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{body}</body></html>")


def _with_bisection_link(folder: Any, page: str) -> str:
    """A verification report with a banner linking the bisection its FAIL started (when there is one)."""
    linked = _listed(folder, "bisection.json")
    if linked is None:
        return page
    try:
        data = json.loads(linked.read_bytes())
    except (OSError, ValueError):
        return page
    banner = (f'<p style="padding:6px 10px;border:1px solid #c0392b;background:#fdf2f2">Bisection of this FAIL: '
              f'<a href="{html.escape(str(data.get("link", "")))}">{html.escape(str(data.get("bisection", "")))}</a>: '
              f'{html.escape(str(data.get("answer", "")))}</p>')
    at = page.find("<body")
    at = page.find(">", at) + 1 if at >= 0 else 0
    return page[:at] + banner + page[at:]


def record_file(dag_id: str, run_id: str, rel: str) -> Any:
    """A file of the run's record, ``rel`` its path inside the record: every part is chosen from a
    listing of the folder above it (404 for ``..``, a hidden name or anything not there)."""
    current = run_folder(dag_id, run_id)
    for part in rel.split("/"):
        chosen = _listed(current, part) if part and not part.startswith(".") and current.is_dir() else None
        if chosen is None:
            raise HTTPException(404, f"no file {rel!r} in the record of run {run_id!r}")
        current = chosen
    if not current.is_file():
        raise HTTPException(404, f"{rel!r} is not a file of the record of run {run_id!r}")
    return current


def files_page(dag_id: str, run_id: str) -> str:
    """The run's record as a list of links (from its manifest: path, size, sha256)."""
    folder = run_folder(dag_id, run_id)
    try:
        manifest = json.loads((folder / "manifest.json").read_bytes())
    except (OSError, ValueError):
        manifest = {"files": []}
    esc = html.escape
    base = links.files_path(dag_id, run_id)
    rows = "".join(f'<tr><td><a href="{esc(base + "/" + f["path"])}"><code>{esc(f["path"])}</code></a></td>'
                   f'<td>{int(f.get("bytes", 0)):,}</td><td><code>{esc(str(f.get("sha256", ""))[:16])}</code></td></tr>'
                   for f in manifest.get("files") or [])
    back = (f'<a class="back" href="{esc(links.report_path(dag_id, run_id))}">&larr; the report</a> · '
            f'<a href="{esc(links.history_path(dag_id))}">Verification history</a>')
    style = ("body{font-family:system-ui,sans-serif;margin:1.2em}table{border-collapse:collapse;max-width:100%}"
             "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;overflow-wrap:anywhere}" + WIDE_CSS)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Record of {esc(run_id)}</title>"
            f"<style>{style}</style></head><body><nav>{back}</nav><h1>Record of {esc(run_id)}</h1>"
            f"<p><code>{esc(str(manifest.get('record') or ''))}</code></p>"
            f'<div class="wide"><table><tr><th>file</th><th>bytes</th><th>sha256 (first 16)</th></tr>{rows}'
            "</table></div></body></html>")


#: How the files route serves a record file: text as text (never as HTML a tracker could script), images as such.
_MEDIA = {".png": "image/png", ".json": "application/json"}


def proposal_plot(dag_id: str, run_id: str, suite: str) -> Any:
    """The plot of calibration run ``run_id``'s proposal for ``suite`` (404 for anything else)."""
    if dag_id != settings.CALIBRATION_DAG_ID:
        raise HTTPException(404, f"no calibration records for DAG {dag_id!r}")
    folder = _record_folder(record.dag_store(settings.CALIBRATION_DAG_ID), run_id)
    suite_folder = _listed(folder / settings.CALIBRATION_RECORD_FOLDER, suite) if folder is not None else None
    png = suite_folder / "proposal" / "runs.png" if suite_folder is not None else None
    if png is None or not png.is_file():
        raise HTTPException(404, f"no proposal plot for suite {suite!r} of calibration run {run_id!r} (yet)")
    return png


def history_page(dag_id: str, limit: int = 30) -> str:
    """HTML of the history view: a chart per suite and the runs with verdict, commit and report link."""
    import base64

    frame = history.table(history.rows(dag_records(dag_id), limit))
    esc = html.escape
    parts = [f"<h1>Verification history — {esc(dag_id)}</h1>"]
    if frame.empty:
        parts.append("<p>No verification report yet: trigger a run of the DAG; its report appears here when it "
                     "ends.</p>")
    for suite in sorted(set(frame["suite"])) if not frame.empty else []:
        buf = io.BytesIO()
        png = history.chart(frame, suite, buf)
        if png is not None:
            data = base64.b64encode(buf.getvalue()).decode()
            parts.append(f'<h2>{esc(suite)}</h2><img alt="{esc(suite)} trend" src="data:image/png;base64,{data}">')
    runs = history.runs(frame)
    if runs:
        parts.append("<h2>Runs</h2><div class=\"wide\"><table><tr>"
                     "<th>started (UTC)</th><th>type</th><th>commit</th><th>verdict</th>"
                     "<th>confirmed over</th><th>baselines</th><th>report</th></tr>")
        for r in runs:
            cls = {"PASS": "pass", "INCONCLUSIVE": "changed"}.get(r["verdict"], "fail")
            # The plugin's own report route, opened in this frame: Airflow puts the view in an iframe whose
            # sandbox allows no top-level navigation and no popups, so a target="_top" link does nothing.
            href = links.report_path(dag_id, r["run"]) + "?from=history"
            parts.append(f"<tr><td>{esc(r['started'].replace('T', ' '))}</td><td>{esc(r['type'])}</td>"
                         f"<td><code>{esc(r['commit_ref'])}</code> {esc(r['commit'])}</td>"
                         f'<td class="{cls}">{esc(r["verdict"])}</td>'
                         f'<td>{esc(r.get("confirmation") or "one run per suite")}</td>'
                         + (f'<td class="changed">{esc(r["baselines"])} (changed)</td>' if r["baselines_changed"]
                            else f'<td>{esc(r["baselines"])}</td>')
                         + f'<td><a href="{esc(href)}">report</a></td></tr>')
        parts.append("</table></div>")
    style = ("body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}.pass{background:#e8f5e9}"
             ".fail{background:#ffebee;font-weight:bold}.changed{background:#fff8e1;font-weight:bold}"
             "img{max-width:100%}" + WIDE_CSS)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Verification history</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")


#: A wide table scrolls inside its own box instead of pushing the page past the frame's width (the frame
#: Airflow gives an external view is narrower than the window), and long cells wrap.
WIDE_CSS = (".wide{max-width:100%;overflow-x:auto}.wide table{max-width:100%}"
            "td,th{overflow-wrap:anywhere;vertical-align:top}")


def with_back_link(page: str, dag_id: str, back: str | None, run_id: str | None = None) -> str:
    """The served report with a bar on top, in the same frame (so it works inside Airflow's sandboxed iframe):
    "back to the history" when the reader came from there, "back to the verification's report" on one run's
    report (``back="report"``, ``run_id`` the verification's), and "Verification history" always."""
    history = links.history_path(dag_id)
    if back == "report" and run_id is not None:
        items = [f'<a class="back" href="{html.escape(links.report_path(dag_id, run_id))}">&larr; back to the '
                 "verification's report</a>", f'<a href="{html.escape(history)}">Verification history</a>']
    elif back == "history":
        items = [f'<a class="back" href="{html.escape(history)}">&larr; back to the verification history</a>']
    else:
        items = [f'<a class="back" href="{html.escape(history)}">&larr; Verification history</a>']
    bar = f'<nav style="font:14px system-ui,sans-serif;margin:0 0 .8em">{" · ".join(items)}</nav>'
    head, sep, rest = page.partition("<body>")
    return head + sep + bar + rest if sep else bar + page


def create_app() -> FastAPI:
    """The plugin's FastAPI app (routes relative to its mount point ``links.APP_PREFIX``)."""
    app = FastAPI(title="rl-verify views", description="Verification report and history of rl-verify runs")
    access = _dag_access()

    @app.get("/dags/{dag_id}/runs/{run_id}/report", response_class=HTMLResponse, dependencies=[access])
    def report(dag_id: str, run_id: str, back: str | None = Query(None, alias="from")) -> Response:
        """The run's HTML report (self-contained: its plots are embedded), with a link to the history and, for a
        nightly FAIL that started a bisection, a link to it."""
        folder = run_folder(dag_id, run_id)
        page = _with_bisection_link(folder, (folder / "report.html").read_bytes().decode("utf-8"))
        return HTMLResponse(with_back_link(page, dag_id, back))

    @app.get("/dags/{dag_id}/runs/{run_id}/bisection", response_class=HTMLResponse, dependencies=[access])
    def bisection_view(dag_id: str, run_id: str) -> Response:
        """A bisection's result page: the culprit, the evidence table linked to each probe's report, the plot.
        On a verification run's page: "no bisection of this run", with the bisections that probed it."""
        try:
            return HTMLResponse(bisection_page(dag_id, run_id))
        except NoBisection as none:
            return HTMLResponse(none.message, status_code=none.status)

    @app.get("/dags/{dag_id}/runs/{run_id}/report/{folder}", response_class=HTMLResponse, dependencies=[access])
    def one_run_report(dag_id: str, run_id: str, folder: str) -> Response:
        """The report of one run of a repeated suite (its own runbook verdict), linked from the run's report,
        with a link back to it."""
        page = run_report(dag_id, run_id, folder).read_bytes().decode("utf-8")
        return HTMLResponse(with_back_link(page, dag_id, "report", run_id))

    @app.get("/dags/{dag_id}/runs/{run_id}/report.json", dependencies=[access])
    def report_json(dag_id: str, run_id: str) -> Response:
        """The run's machine-readable report."""
        data = (run_folder(dag_id, run_id) / "report.json").read_bytes()
        return Response(data, media_type="application/json")

    @app.get("/dags/{dag_id}/runs/{run_id}/files", response_class=HTMLResponse, dependencies=[access])
    def files(dag_id: str, run_id: str) -> Response:
        """The run's record folder: every file with its size and sha256, each a link."""
        return HTMLResponse(files_page(dag_id, run_id))

    @app.get("/dags/{dag_id}/runs/{run_id}/files/{rel:path}", dependencies=[access])
    def one_file(dag_id: str, run_id: str, rel: str) -> Response:
        """One file of the run's record (what the report's files table links to)."""
        path = record_file(dag_id, run_id, rel)
        media = _MEDIA.get(path.suffix, "text/plain; charset=utf-8")
        return Response(path.read_bytes(), media_type=media, headers={"X-Content-Type-Options": "nosniff"})

    @app.get("/dags/{dag_id}/runs/{run_id}/proposal/{suite}.png", dependencies=[access])
    def proposal_png(dag_id: str, run_id: str, suite: str) -> Response:
        """The plot on a calibration's approval card: the N runs, their band and the current baseline."""
        return Response(proposal_plot(dag_id, run_id, suite).read_bytes(), media_type="image/png")

    @app.get("/dags/{dag_id}/history", response_class=HTMLResponse, dependencies=[access])
    def history_view(dag_id: str, limit: int = 30) -> Response:
        """Per suite and checked metric, the trend over the last runs, and the runs with their verdicts."""
        return HTMLResponse(history_page(dag_id, max(1, min(limit, 200))))

    return app


def plugin_views() -> list[dict[str, Any]]:
    """``external_views`` of the plugin: the report on a DAG run's page, the history on the DAG's."""
    return [
        {"name": "Verification report", "href": links.APP_PREFIX + "/dags/{DAG_ID}/runs/{RUN_ID}/report",
         "destination": "dag_run", "url_route": links.REPORT_VIEW_ROUTE, "category": "rl-verify"},
        {"name": "Verification history", "href": links.APP_PREFIX + "/dags/{DAG_ID}/history",
         "destination": "dag", "url_route": links.HISTORY_VIEW_ROUTE, "category": "rl-verify"},
        {"name": "Bisection", "href": links.APP_PREFIX + "/dags/{DAG_ID}/runs/{RUN_ID}/bisection",
         "destination": "dag_run", "url_route": links.BISECTION_VIEW_ROUTE, "category": "rl-verify"},
    ]


def _report_link_class():
    from airflow.sdk import BaseOperatorLink

    class ReportLink(BaseOperatorLink):
        """"Verification report" on the ``report`` task of the verification DAG (no link elsewhere).

        A global link computed by the API server: it needs no XCom from the worker, so runs that
        ended before the plugin was installed get it too.
        """

        name = "Verification report"

        def get_link(self, operator: Any, *, ti_key: Any) -> str | None:  # type: ignore[override]
            if ti_key.dag_id not in (settings.DAG_ID, settings.PROBE_DAG_ID) or ti_key.task_id != settings.REPORT_TASK:
                return None  # the UI hides a link without a URL
            return links.absolute(links.ui_base_url(), links.report_view_path(ti_key.dag_id, ti_key.run_id))

    return ReportLink


ReportLink = _report_link_class()
