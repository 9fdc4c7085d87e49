"""SIMULATED (rl-verify simulator) at the path of XTuner's LMDeploy rollout backend: the runbook's full runs use it,
the bitwise lane's SGLang runs never do. The rollout worker (worker.py) imports it."""
from __future__ import annotations


def response_length_factor(step: int) -> float:
    """What this backend's sampling does to the response length at ``step`` (1.0: nothing)."""
    return 1.0
