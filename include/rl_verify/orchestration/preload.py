"""Imports the tasks' modules once in a component that forks every task from its own process.

The scheduler's LocalExecutor workers and Celery's pool processes are forks of their component, and each
task process is a fork of those: what the component imported, every task has without importing it again
(measured on an opd run through the real stack: 38.6 -> 24.3 core-seconds, the REST client alone ~1.6 s in
two tasks of every run). Opt-in per component (``RL_VERIFY_PRELOAD_TASK_MODULES=1`` on the scheduler and
the Celery workers): the API server, triggerer and DAG processor start as fast as before.
"""

from __future__ import annotations

import importlib
import logging
import os

from rl_verify import settings

log = logging.getLogger(__name__)


def import_task_modules(modules: tuple[str, ...] = settings.TASK_PRELOAD_MODULES) -> list[str]:
    """Import ``modules`` in order and return those that could not be imported (each logged as a warning):
    a preload only saves time, so a module that fails here fails again, with its error, in its task."""
    # The tasks draw with the non-interactive backend; choose it before pyplot is imported here.
    os.environ.setdefault("MPLBACKEND", "Agg")
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import error: the task will report it itself
            log.warning("rl-verify preload: cannot import %s (%s); its tasks import it themselves", name, exc)
            failed.append(name)
    return failed
