"""Airflow local settings of rl-verify: the cluster policy that gives each training its node's pool.

Airflow imports ``airflow_local_settings`` from its config folder or the plugins folder (both on
``sys.path``; Astro projects keep it in ``plugins/``). A deployment with its own local settings
imports the hook there instead: ``from rl_verify.orchestration.policy import task_instance_mutation_hook``.
"""

from rl_verify.orchestration.policy import task_instance_mutation_hook

__all__ = ["task_instance_mutation_hook"]
