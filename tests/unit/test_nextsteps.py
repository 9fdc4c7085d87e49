"""Pins runbook section 3 as code: every suggestion is marked "Inference:" and follows the rules."""

from __future__ import annotations

from rl_verify.model import Check, SuiteResult
from rl_verify.nextsteps import suggest


def c(metric, step, passed, first=None, note="", current=0.5, source="golden"):
    return Check(metric=metric, step=step, baseline=0.5, current=current, error=0.0, threshold=0.1, operator="<",
                 method="absolute", passed=passed, source=source, note=note, first_breach_step=first)


def text(lines):
    return " ".join(lines)


def test_every_suggestion_is_marked_as_inference():
    cases = [suggest("grpo", [c("time/step", 1, False)], "FAIL"), suggest("opd", [], "PASS"),
             suggest("opd", [c("eval/gsm8k/acc", 0, False)], "FAIL"),
             suggest("grpo", [], "FAIL", failure_class="infrastructure", reason="node down")]
    assert all(s.startswith("Inference:") for lines in cases for s in lines)


def test_pass_gives_a_short_no_action_line():
    assert suggest("grpo", [c("response/rewards/mean", None, True)], "PASS") == [
        "Inference: no action needed; every checked metric is within its threshold."]


def test_breach_at_the_first_eval_point_points_to_init_or_config():
    checks = [c("eval/gsm8k/acc", 0, False), c("eval/gsm8k/acc", 5, False), c("eval/gsm8k/acc", 10, True)]
    out = text(suggest("opd", checks, "FAIL"))
    assert "initialisation or config" in out and "weight mapping" in out and "training loop (" not in out


def test_breach_at_step_1_of_a_grpo_aggregate_points_to_init_or_config():
    checks = [c("response/rewards/mean", None, False, first=1, source="checker")]
    out = text(suggest("grpo", checks, "FAIL", first_steps={"response/rewards/mean": 1}))
    assert "initialisation or config" in out


def test_gradual_divergence_points_to_the_training_loop():
    checks = [c("eval/gsm8k/acc", 0, True), c("eval/gsm8k/acc", 5, True), c("eval/gsm8k/acc", 15, False)]
    out = text(suggest("opd", checks, "FAIL"))
    assert "training loop" in out and "advantage" in out and "initialisation" not in out


def test_mismatch_breach_points_to_train_inference_consistency_first_for_grpo():
    checks = [c("response/rewards/mean", None, False, first=20, source="checker"),
              c("mismatch/mismatch_k3_kl", 12, False, first=12, source="checker")]
    out = suggest("grpo", checks, "FAIL", first_steps={"response/rewards/mean": 1, "mismatch/mismatch_k3_kl": 1})
    assert out[0].startswith("Inference: mismatch") and "logprob path" in out[0] and "rollout backend" in out[0]


def test_distill_kl_breach_with_healthy_rewards_points_to_the_teacher_path():
    checks = [c("distillation/reduced_distillation_kl", 10, False), c("response/rewards/mean", 10, True)]
    out = text(suggest("opd", checks, "FAIL"))
    assert "teacher path" in out and "teacher endpoints" in out


def test_distill_kl_breach_with_bad_rewards_is_not_blamed_on_the_teacher_alone():
    checks = [c("distillation/reduced_distillation_kl", 10, False), c("response/rewards/mean", 10, False)]
    assert "teacher path" not in text(suggest("opd", checks, "FAIL"))


def test_rewards_only_drift_points_to_rollout_or_judger_not_distillation():
    checks = [c("response/rewards/mean", 10, False), c("distillation/reduced_distillation_kl", 10, True)]
    out = text(suggest("opd", checks, "FAIL"))
    assert "rollout or the judger" in out and "not distillation" in out


def test_infrastructure_failure_gets_its_own_suggestion():
    result = SuiteResult.infrastructure("grpo", "ssh connection refused", host="n1")
    assert result.verdict == "FAIL" and result.failure_class == "infrastructure"
    assert "not an accuracy signal" in result.next_steps[0] and "logs" in result.next_steps[0]
    assert result.details == {"host": "n1"}


def test_missing_and_timing_failures_have_their_own_suggestions():
    checks = [c("eval/gsm8k/acc", 20, False, note="missing: no value", current=None),
              Check("e2e wall time", None, None, 3000.0, 3000.0, 2400.0, "<", "value", False, "wall-time")]
    out = text(suggest("grpo", checks, "FAIL"))
    assert "missing from the current tracker" in out and "over budget" in out
