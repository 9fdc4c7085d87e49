"""The opd engine's rules of runbook section 3 (``core.nextsteps`` applies them): what a distillation
metric's breach says, beside the rewards."""

from __future__ import annotations

from collections.abc import Mapping

from rl_verify.core.nextsteps import EngineRules, Reading, family_too, said
from rl_verify.core.shapes import Shape

DISTILL_KL = "distillation/reduced_distillation_kl"
REWARDS = "response/rewards/mean"


def distillation_readings(accuracy: list[str], shapes: Mapping[str, Shape | None]) -> list[Reading]:
    """The runbook's OPD metric rules that apply to the breached ``accuracy`` metrics: a distill_kl breach
    with healthy rewards points at the teacher path; rewards-only drift at rollout/the judger."""
    out = []
    if DISTILL_KL in accuracy and REWARDS not in accuracy:
        out.append(Reading("suspect the teacher path (teacher endpoints, sampled tokens sent to the teachers, "
                           "distillation loss)",
                           "runbook section 3: an OPD distill_kl breach with healthy rewards points at the teacher "
                           "path",
                           said(shapes, [DISTILL_KL]) + "; response/rewards/mean within its threshold"
                           + family_too(DISTILL_KL, accuracy, shapes)))
    if accuracy == [REWARDS]:
        out.append(Reading("suspect rollout or the judger (reward function, answer parsing), not distillation",
                           "runbook section 3: rewards-only drift points at rollout/judger, not distillation",
                           said(shapes, [REWARDS]) + "; every other judged metric within its threshold"))
    return out


#: OPD: distill_kl vs rewards tells the teacher path from rollout/the judger.
OPD_RULES = EngineRules(readings=distillation_readings)
