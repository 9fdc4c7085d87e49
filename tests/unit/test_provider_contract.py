"""Contract with Airflow and the SSH provider: only public members, and those pinned here.

``SuiteTrainingOperator`` is a plain ``BaseOperator`` launching through ``SSHHook`` and
``RLJobTrigger`` a plain ``BaseTrigger`` watching through ``SSHHookAsync``: no provider class is
extended. What the package relies on from Airflow and the provider is pinned below, so an upgrade
that changes it fails here, not in a night's run. A scan of the package's source shows that no
private member (``._name``) of anything but the package's own code is used.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from airflow.providers.ssh.hooks.ssh import SSHHook, SSHHookAsync
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator
from airflow.sdk.types import RuntimeTaskInstanceProtocol
from airflow.triggers.base import BaseTrigger, TriggerEvent

from rl_verify.orchestration.approval import CardApprovalOperator
from rl_verify.orchestration.operators import SuiteTrainingOperator
from rl_verify.orchestration.triggers import RLJobTrigger

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "include" / "rl_verify").rglob("*.py"), *(ROOT / "dags").glob("*.py"),
                  *(ROOT / "plugins").rglob("*.py")])


def params(func) -> list[str]:
    return list(inspect.signature(func).parameters)


def test_training_operator_and_trigger_extend_no_provider_class():
    assert SuiteTrainingOperator.__mro__[1] is BaseOperator
    assert RLJobTrigger.__mro__[1] is BaseTrigger
    for cls in (SuiteTrainingOperator, RLJobTrigger):
        assert not any(base.__module__.startswith("airflow.providers.ssh") for base in cls.__mro__), cls


def test_ssh_hooks_offer_what_the_launch_and_the_watch_use():
    assert params(SSHHook.__init__)[:2] == ["self", "ssh_conn_id"]
    assert {"conn_timeout", "conn_retry_attempts"} <= set(params(SSHHook.__init__))
    source = inspect.getsource(SSHHook)
    # pipeline.ssh_client refuses a connection without a pinned host key by reading these two.
    assert "self.no_host_key_check =" in source and "self.host_key =" in source and "get_conn" in vars(SSHHook)
    assert "ssh_conn_id" in params(SSHHookAsync.__init__)
    assert inspect.iscoroutinefunction(SSHHookAsync.get_conn)


def test_trigger_interface_the_watch_relies_on():
    assert inspect.iscoroutinefunction(BaseTrigger.on_kill) and inspect.isasyncgenfunction(RLJobTrigger.run)
    assert isinstance(BaseTrigger.__dict__["task_instance"], property)
    assert params(TriggerEvent.__init__)[:2] == ["self", "payload"]
    # The kill on a user's action reads the task's state through the Task SDK's public protocol.
    assert {"dag_id", "task_ids", "run_ids"} <= set(params(RuntimeTaskInstanceProtocol.get_task_states))
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    assert {"dag_id", "task_ids", "run_ids"} <= set(params(RuntimeTaskInstance.get_task_states))


def test_operator_interface_the_deferral_relies_on():
    assert {"trigger", "method_name", "kwargs", "timeout"} <= set(params(BaseOperator.defer))
    assert callable(BaseOperator.on_kill)


def test_approval_operator_members_the_card_approval_uses():
    assert (ApprovalOperator.APPROVE, ApprovalOperator.REJECT) == ("Approve", "Reject")
    hitl = set(inspect.signature(ApprovalOperator.__mro__[1]).parameters)
    assert {"subject", "body", "params", "assigned_users", "response_timeout"} <= hitl
    assert params(ApprovalOperator.execute_complete) == ["self", "context", "event"]
    assert {"ti", "tasks"} <= set(params(CardApprovalOperator.skip))


def _private_accesses(tree: ast.AST) -> set[str]:
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and node.attr.startswith("_") and not node.attr.startswith("__")}


def _own_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_package_uses_no_private_member_of_airflow_or_a_provider():
    trees = {path: ast.parse(path.read_text()) for path in SOURCES}
    own = set().union(*(_own_names(t) for t in trees.values()))
    foreign = {f"{path.relative_to(ROOT)}: .{name}" for path, tree in trees.items()
               for name in _private_accesses(tree) - own}
    private_imports = {f"{path.relative_to(ROOT)}: {node.module}" for path, tree in trees.items()
                       for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                       and node.module.startswith("airflow") and any(p.startswith("_") for p in node.module.split("."))}
    assert not foreign and not private_imports, sorted(foreign | private_imports)


def test_the_scan_finds_a_private_provider_member():
    tree = ast.parse("class Op(X):\n    def execute(self):\n        self._paths = 1\n        hook._get_conn()\n")
    assert _private_accesses(tree) - _own_names(tree) == {"_get_conn"}


def test_the_ui_plugin_extension_points_it_relies_on():
    """fastapi_apps / external_views / global links on AirflowPlugin, the auth dependency every route
    uses, the link signature, and the UI substituting {DAG_ID}/{RUN_ID} in a view's href."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from airflow.plugins_manager import AirflowPlugin
    from airflow.sdk import BaseOperatorLink

    import airflow

    for attr in ("fastapi_apps", "external_views", "global_operator_extra_links"):
        assert hasattr(AirflowPlugin, attr), attr
    assert params(requires_access_dag)[:2] == ["method", "access_entity"] and DagAccessEntity.RUN
    assert "ti_key" in params(BaseOperatorLink.get_link)
    from rl_verify.orchestration.views import plugin_views

    for view in plugin_views():  # a view the API would refuse drops the whole plugin silently
        ExternalViewResponse.model_validate(view)
    bundle = "".join(p.read_text(errors="ignore") for p in
                     (Path(airflow.__file__).parent / "ui" / "dist" / "assets").glob("index-*.js"))
    assert "{DAG_ID}" in bundle and "{RUN_ID}" in bundle and "/plugin/" in bundle
