"""The task modules preloaded by a component that forks its tasks (``RL_VERIFY_PRELOAD_TASK_MODULES``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from rl_verify import settings
from rl_verify.orchestration.preload import import_task_modules

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import airflow_local_settings
print(json.dumps({m: m in sys.modules for m in %r}))
"""


def _imported_by_local_settings(preload: str | None) -> dict[str, bool]:
    """Which task modules a fresh interpreter holds after importing the project's local settings."""
    env = {k: v for k, v in os.environ.items() if k != settings.PRELOAD_ENV}
    if preload is not None:
        env[settings.PRELOAD_ENV] = preload
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "include"), str(ROOT / "plugins")])
    out = subprocess.run([sys.executable, "-c", PROBE % (settings.TASK_PRELOAD_MODULES,)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_forking_component_with_the_setting_imports_every_task_module_once_at_start():
    assert _imported_by_local_settings("1") == {m: True for m in settings.TASK_PRELOAD_MODULES}


def test_every_other_component_imports_none_of_the_heavy_task_modules():
    held = _imported_by_local_settings(None)
    assert not any(held[m] for m in ("airflow_client.client", "pandas", "matplotlib.pyplot",
                                     "rl_verify.orchestration.verification_dag")), held


def test_a_module_that_cannot_be_imported_is_named_in_a_warning_and_the_rest_still_load(caplog):
    with caplog.at_level(logging.WARNING, logger="rl_verify.orchestration.preload"):
        failed = import_task_modules(("json", "rl_verify_no_such_module", "csv"))
    assert failed == ["rl_verify_no_such_module"]
    assert "csv" in sys.modules
    assert "cannot import rl_verify_no_such_module" in caplog.text
