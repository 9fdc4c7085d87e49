"""SIMULATED (rl-verify simulator) at the path of XTuner's SGLang rollout backend: the one with a deterministic
mode, the bitwise lane's. The rollout worker (worker.py) imports it."""
from __future__ import annotations


def response_length_factor(step: int) -> float:
    """What this backend's sampling does to the response length at ``step`` (1.0: nothing)."""
    return 1.0
