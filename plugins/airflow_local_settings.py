"""Airflow local settings of rl-verify: the cluster policy that gives each training its node's pool.

Airflow imports ``airflow_local_settings`` from its config folder or the plugins folder (both on
``sys.path``; Astro projects keep it in ``plugins/``). A deployment with its own local settings
imports the hook there instead: ``from rl_verify.orchestration.policy import task_instance_mutation_hook``.

On a component that forks the tasks (the scheduler with the LocalExecutor, Celery workers) started with
``RL_VERIFY_PRELOAD_TASK_MODULES=1``, the tasks' modules are imported here once, before the component forks
its workers, so that no task imports them again (``rl_verify.orchestration.preload``).
"""

from rl_verify import settings
from rl_verify.orchestration.policy import task_instance_mutation_hook

if settings.PRELOAD:
    from rl_verify.orchestration.preload import import_task_modules

    import_task_modules()

__all__ = ["task_instance_mutation_hook"]
