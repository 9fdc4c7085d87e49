"""The documented import path of rl-verify's cluster policy (``from rl_verify.policy import
task_instance_mutation_hook`` in a deployment's ``airflow_local_settings.py``): the hook lives in
``rl_verify.orchestration.policy``."""

from rl_verify.orchestration.policy import task_instance_mutation_hook

__all__ = ["task_instance_mutation_hook"]
