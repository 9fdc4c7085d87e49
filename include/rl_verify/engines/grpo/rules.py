"""The grpo engine's rules of runbook section 3 (``core.nextsteps`` applies them)."""

from __future__ import annotations

from rl_verify.core.nextsteps import EngineRules

#: GRPO: a mismatch/mismatch_k3_kl breach is looked at before anything else.
GRPO_RULES = EngineRules(mismatch_first=True)
