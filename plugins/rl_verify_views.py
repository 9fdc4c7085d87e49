"""rl-verify's Airflow UI plugin: the verification report on a run's page, the history on the DAG's.

Thin: the app, views and link live in ``rl_verify.orchestration.views`` (Airflow glue layer of the package).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from rl_verify.orchestration import links
from rl_verify.orchestration.views import ReportLink, create_app, plugin_views


class RlVerifyViewsPlugin(AirflowPlugin):
    name = "rl_verify_views"
    fastapi_apps = [{"app": create_app(), "url_prefix": links.APP_PREFIX, "name": "rl-verify views"}]
    external_views = plugin_views()
    global_operator_extra_links = [ReportLink()]
