"""Pins runbook section 3 as code: every suggestion is marked "Inference:", states the shape of the
breach it reads, and applies a runbook rule only to the shape that rule describes; a FAIL gets one first
next step with its reason (the runbook's metric rules before the shape rules), the others marked secondary."""

from __future__ import annotations

from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.nextsteps import suggest
from rl_verify.engines.grpo import GRPO_RULES
from rl_verify.engines.opd import OPD_RULES

THRESHOLD = 0.1


def c(metric, step, passed, error=None, current=0.5, missing=False, source="golden", note=""):
    if error is None:
        error = 0.2 if passed is False else 0.01
    return Check(metric=metric, step=step, baseline=0.5, current=current, error=error, threshold=THRESHOLD,
                 operator="<", method="absolute", passed=passed, source=source, note=note, missing=missing,
                 first_breach_step=step if passed is False else None)


def curve(metric, errors, first_step=5, every=5):
    """Per-point checks of one metric with the given errors (breach where error >= THRESHOLD)."""
    return [c(metric, first_step + i * every, not e >= THRESHOLD, error=e) for i, e in enumerate(errors)]


def text(lines):
    return " ".join(lines)


def test_every_suggestion_is_marked_as_inference():
    cases = [suggest(GRPO_RULES, [c("time/step", 1, False)], "FAIL"), suggest(OPD_RULES, [], "PASS"),
             suggest(OPD_RULES, curve("eval/gsm8k/acc", [0.2, 0.2]), "FAIL"),
             suggest(GRPO_RULES, [], "FAIL", failure_class="infrastructure", reason="node down")]
    assert all(s.startswith("Inference:") for lines in cases for s in lines)


def test_pass_gives_a_short_no_action_line():
    assert suggest(GRPO_RULES, [c("response/rewards/mean", None, True)], "PASS") == [
        "Inference: no action needed; every checked metric is within its threshold."]


def test_breach_from_the_first_eval_point_points_to_init_or_config_only():
    out = text(suggest(OPD_RULES, curve("eval/gsm8k/acc", [0.2, 0.2, 0.01], first_step=0), "FAIL"))
    assert "outside its bound from the first compared step 0" in out
    assert "initialisation or config" in out and "weight mapping" in out and "points to the training loop" not in out


def test_gradual_growth_points_to_the_training_loop_only():
    out = text(suggest(OPD_RULES, curve("eval/gsm8k/acc", [0.02, 0.06, 0.09, 0.12, 0.15]), "FAIL"))
    assert "grows into the bound" in out and "outside from step 20" in out
    assert "training loop" in out and "advantage" in out and "initialisation" not in out


def test_jump_that_stays_is_not_called_gradual_and_names_its_step():
    out = text(suggest(OPD_RULES, curve("eval/gsm8k/acc", [0.01, 0.01, 0.3, 0.3, 0.3]), "FAIL"))
    assert "jump at step 15" in out and "no runbook rule describes a jump" in out
    assert "gradual" not in out and "training loop" not in out and "initialisation" not in out


def test_single_breach_at_the_last_eval_point_is_isolated_not_gradual():
    out = text(suggest(OPD_RULES, curve("eval/geo3k/acc", [0.01, 0.01, 0.01, 0.01, 0.2]), "FAIL"))
    assert "single breach at step 25 (the last compared point; error at 10%" in out and "re-run once" in out
    assert "gradual" not in out and "training loop" not in out


def test_single_nan_gets_one_numerical_suggestion_not_three_causes():
    checks = curve("response/rewards/mean", [0.01, 0.01, 0.01, 0.01, 0.01])
    checks[2] = c("response/rewards/mean", 15, False, error=float("nan"), current=float("nan"))
    out = suggest(OPD_RULES, checks, "FAIL")
    said = text(out)
    assert "NaN/Infinity only at step 15" in said and "diverged numerically" in said
    assert "gradual" not in said and "initialisation" not in said and "rollout or the judger" in said


def test_shape_recorded_by_the_engine_is_used_for_an_aggregate_row():
    row = c("response/rewards/mean", None, False, source="checker")
    row.shape, row.first_breach_step = "from-start", 1
    row.shape_text = "outside its bound from the first compared step 1"
    out = text(suggest(GRPO_RULES, [row], "FAIL"))
    assert "first compared step 1" in out and "initialisation or config" in out


def test_mismatch_breach_points_to_train_inference_consistency_first_for_grpo():
    mismatch = c("mismatch/mismatch_k3_kl", 12, False, source="checker")
    mismatch.shape, mismatch.shape_text = "jump", "jump at step 12 (error 0.0002; 1e-05 at step 11), stays outside"
    out = suggest(GRPO_RULES, [c("response/rewards/mean", None, True, source="checker"), mismatch], "FAIL")
    assert out[0].startswith("Inference: first, check train/inference consistency")
    assert "mismatch/mismatch_k3_kl: jump at step 12" in out[0]
    assert "logprob path" in out[0] and "rollout backend" in out[0] and "check that first for GRPO failures" in out[0]
    # The jump's own reading follows, marked secondary.
    assert out[1:] and all(s.startswith("Inference: secondary: ") for s in out[1:])


def test_distill_kl_breach_with_healthy_rewards_points_to_the_teacher_path():
    checks = curve("distillation/reduced_distillation_kl", [0.2, 0.2]) + curve("response/rewards/mean", [0.01, 0.01])
    out = text(suggest(OPD_RULES, checks, "FAIL"))
    assert "teacher path" in out and "teacher endpoints" in out


def test_distill_kl_breach_with_bad_rewards_is_not_blamed_on_the_teacher_alone():
    checks = curve("distillation/reduced_distillation_kl", [0.2, 0.2]) + curve("response/rewards/mean", [0.2, 0.2])
    assert "teacher path" not in text(suggest(OPD_RULES, checks, "FAIL"))


def test_rewards_only_drift_points_to_rollout_or_judger_not_distillation():
    checks = curve("response/rewards/mean", [0.2, 0.2]) + curve("distillation/reduced_distillation_kl", [0.01, 0.01])
    out = text(suggest(OPD_RULES, checks, "FAIL"))
    assert "rollout or the judger" in out and "not distillation" in out


def test_infrastructure_failure_gets_its_own_suggestion():
    result = SuiteResult.infrastructure("grpo", "ssh connection refused", host="n1")
    assert result.verdict == "FAIL" and result.failure_class == "infrastructure"
    assert "not an accuracy signal" in result.next_steps[0] and "logs" in result.next_steps[0]
    assert result.details == {"host": "n1"}


def test_missing_values_are_not_read_as_a_breach():
    checks = curve("eval/gsm8k/acc", [0.01, 0.01]) + [c("eval/gsm8k/acc", 20, False, current=None, missing=True)]
    out = text(suggest(OPD_RULES, checks, "FAIL", failure_class="infrastructure"))
    assert "not measured (eval/gsm8k/acc at step(s) 20)" in out and "not an accuracy signal" in out
    assert "initialisation" not in out and "training loop" not in out and "single breach" not in out


def test_performance_failure_names_a_slower_commit_and_a_slow_node_with_the_step_times():
    checks = [Check("time/step", 30, 45.0, 57.0, 12.0, 10.0, "<", "absolute", False, "checker"),
              Check("e2e wall time", None, None, 2500.0, 2500.0, 2400.0, "<", "value", False, "wall-time")]
    times = {"current_mean": 52.1, "current_max": 57.0, "current_max_step": 30, "baseline_mean": 45.3}
    (line,) = suggest(GRPO_RULES, checks, "FAIL", failure_class="performance", step_times=times)
    assert "commit under test is slower" in line and "slow or contended" in line
    assert "time/step mean 52.1 s vs baseline 45.3 s, slowest step 30 at 57 s" in line
    assert "e2e wall time 41 min 40 s against a budget of < 40 min" in line


def test_a_fail_has_exactly_one_first_next_step_and_the_others_are_secondary():
    checks = (curve("eval/gsm8k/acc", [0.2, 0.2, 0.2], first_step=0) + curve("eval/geo3k/acc", [0.01, 0.01, 0.3])
              + [Check("time/step", 30, 45.0, 57.0, 12.0, 10.0, "<", "absolute", False, "checker")])
    out = suggest(OPD_RULES, checks, "FAIL")
    assert out[0].startswith("Inference: first, ") and " Why: " in out[0]
    assert len(out) == 3 and all(s.startswith("Inference: secondary: ") for s in out[1:])
    assert sum(s.startswith("Inference: first,") for s in out) == 1


def test_teacher_regression_gets_one_teacher_path_diagnosis_first_not_init_for_its_family():
    """sim/regress-teacher moves distill_kl and abs_loss from the first eval point they are judged at, rewards
    healthy: the runbook's metric rule (teacher path) comes first and names abs_loss as the same breach; the
    from-start shape reading of that family follows, marked secondary."""
    checks = (curve("distillation/reduced_distillation_kl", [0.2, 0.2, 0.2])
              + curve("distillation/reduced_distillation_abs_loss", [0.2, 0.2, 0.2])
              + curve("response/rewards/mean", [0.01, 0.01, 0.01]))
    first, *rest = suggest(OPD_RULES, checks, "FAIL")
    assert first.startswith("Inference: first, suspect the teacher path")
    assert "distillation/reduced_distillation_abs_loss breached the same way" in first
    assert "initialisation" not in first
    assert len(rest) == 1 and rest[0].startswith("Inference: secondary: ") and "initialisation" in rest[0]


def test_metrics_of_one_family_with_one_shape_are_read_together():
    checks = curve("eval/gsm8k/acc", [0.2, 0.2], first_step=0) + curve("eval/geo3k/acc", [0.3, 0.3], first_step=0)
    (line,) = suggest(OPD_RULES, checks, "FAIL")
    assert "eval/geo3k/acc: outside" in line and "eval/gsm8k/acc: outside" in line and "initialisation" in line


def test_mismatch_rule_comes_before_a_nan_reading_of_the_same_metric_for_grpo():
    nan = c("mismatch/mismatch_k3_kl", 3, False, error=float("nan"), current=float("nan"), source="checker")
    nan.shape, nan.shape_text = "non-finite", "NaN/Infinity only at step 3"
    first, second = suggest(GRPO_RULES, [nan], "FAIL")
    assert first.startswith("Inference: first, check train/inference consistency") and "NaN/Infinity" in first
    assert second.startswith("Inference: secondary: ") and "diverged numerically" in second
