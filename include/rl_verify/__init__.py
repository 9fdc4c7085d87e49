"""rl-verify: RL accuracy verification of XTuner code changes (GRPO + OPD)."""

__version__ = "0.1.0"
