"""SIMULATED (rl-verify simulator) at the path of a model family neither suite trains (DeepSeek-V3 MoE): code no
process of a GRPO or OPD run imports, there to be changed by a commit that cannot move their numbers."""
from __future__ import annotations


def router_scale(layer: int) -> float:
    """The expert router's scale at ``layer`` (never called by the simulated trainings)."""
    return 1.0
