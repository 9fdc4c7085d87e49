"""Metric curves replayed by the SIMULATED XTuner trainer (rl-verify simulator; not XTuner code).

Standard library only: this module runs on the simulated GPU node with the system python3, and the
simulator's control side imports it (by file path) to write the baseline trackers of the node's share.

A curve is a deterministic mean per step plus bounded, seeded noise. Noise is *uniform and bounded*
(never Gaussian) so that a healthy run is guaranteed to sit inside the runbook thresholds: the
current-run half-width is at most ~35 % of each threshold and the baseline's at most ~5 %, so the
worst-case |current - baseline| stays below ~40 % of the threshold whatever the seed.
Regressions (carried by commits of the simulated checkout, see behaviour.json) are deterministic
offsets that breach the thresholds clearly.
"""
from __future__ import annotations

import math
import random

# --------------------------------------------------------------------------------------------------
# GRPO (Qwen3-8B, gsm8k, lmdeploy): 3 epochs x (1000 prompts // batch 64) = 45 steps.
GRPO_STEPS = 45
GRPO_EVAL_STEPS = (0, 15, 30, 45)
GRPO_FINAL_EVAL = 0.9007  # baseline eval/accuracy at step 45 (runbook)
_GRPO_EVAL_MEAN = {0: 0.8421, 15: 0.8836, 30: 0.8958, 45: GRPO_FINAL_EVAL}

# Half-widths of the uniform noise: (current run, baseline). Thresholds in comments (runbook).
GRPO_NOISE = {
    "response/rewards/mean": (0.030, 0.004),        # absolute < 0.1 (p80 of per-step errors)
    "response/response_len/mean": (0.035, 0.004),   # relative < 0.12 (p80), noise is relative
    "mismatch/mismatch_k3_kl": (4e-6, 1e-6),        # absolute <= 1e-4, stepwise, 5-decimal rounding
    "time/step": (2.0, 0.3),                        # absolute < 10 s, stepwise
    "eval/accuracy": (0.012, 0.0),                  # absolute < 0.05 at the final step
}


def grpo_mean(step: int) -> dict[str, float]:
    """Mean (baseline) value of every GRPO step-summary metric at training step ``step`` >= 1."""
    s = float(step)
    return {
        "response/rewards/mean": 0.935 - 0.16 * math.exp(-(s - 1.0) / 9.0),
        "response/response_len/mean": 520.0 + 180.0 * math.exp(-(s - 1.0) / 12.0),
        "mismatch/mismatch_k3_kl": 1.2e-5 + 0.6e-5 * s / GRPO_STEPS,
        # eval steps also pay for the evaluation pass
        "time/step": 45.0 + (4.0 if step in GRPO_EVAL_STEPS else 0.0),
    }


def grpo_eval_mean(step: int) -> float:
    """Mean eval/accuracy at a GRPO eval step (0/15/30/45); other steps are interpolated."""
    if step in _GRPO_EVAL_MEAN:
        return _GRPO_EVAL_MEAN[step]
    return _interp(sorted(_GRPO_EVAL_MEAN.items()), step)


# --------------------------------------------------------------------------------------------------
# OPD (MOPD, Qwen3-VL-2B student, two rollout teachers), golden table of 2026-10-26 (3-run mean).
OPD_EVAL_EVERY = 5
OPD_GOLDEN: dict[int, dict[str, float]] = {
    0: {"eval/gsm8k/acc": 0.4339, "eval/geo3k/acc": 0.2601},
    5: {"distillation/reduced_distillation_kl": 0.3260, "distillation/reduced_distillation_abs_loss": 0.4640,
        "response/rewards/mean": 0.5286, "eval/gsm8k/acc": 0.5972, "eval/geo3k/acc": 0.2686},
    10: {"distillation/reduced_distillation_kl": 0.3305, "distillation/reduced_distillation_abs_loss": 0.4617,
         "response/rewards/mean": 0.6156, "eval/gsm8k/acc": 0.6871, "eval/geo3k/acc": 0.2830},
    15: {"distillation/reduced_distillation_kl": 0.3162, "distillation/reduced_distillation_abs_loss": 0.4576,
         "response/rewards/mean": 0.5914, "eval/gsm8k/acc": 0.6990, "eval/geo3k/acc": 0.2745},
    20: {"distillation/reduced_distillation_kl": 0.3129, "distillation/reduced_distillation_abs_loss": 0.4422,
         "response/rewards/mean": 0.6794, "eval/gsm8k/acc": 0.6904, "eval/geo3k/acc": 0.3040},
    25: {"distillation/reduced_distillation_kl": 0.3118, "distillation/reduced_distillation_abs_loss": 0.4438,
         "response/rewards/mean": 0.5771, "eval/gsm8k/acc": 0.6811, "eval/geo3k/acc": 0.2945},
}
# Step-1 anchors for the training metrics (no golden value before step 5).
_OPD_STEP1 = {"distillation/reduced_distillation_kl": 0.3520,
              "distillation/reduced_distillation_abs_loss": 0.4860,
              "response/rewards/mean": 0.4410}

OPD_NOISE = {
    "distillation/reduced_distillation_kl": (0.009, 0.0),        # absolute < 0.03
    "distillation/reduced_distillation_abs_loss": (0.009, 0.0),  # absolute < 0.03
    "response/rewards/mean": (0.025, 0.0),                       # absolute < 0.08
    "eval/gsm8k/acc": (0.009, 0.0),                              # absolute < 0.03
    "eval/geo3k/acc": (0.012, 0.0),                              # absolute < 0.04
    "response/response_len/mean": (0.05, 0.004),                 # relative < 0.18
    "time/step": (0.025, 0.004),                                 # relative < 0.10 (reference only)
}
OPD_TRAIN_KEYS = ("distillation/reduced_distillation_kl", "distillation/reduced_distillation_abs_loss",
                  "response/rewards/mean")
OPD_EVAL_KEYS = ("eval/gsm8k/acc", "eval/geo3k/acc")
OPD_RELATIVE = ("response/response_len/mean", "time/step")


def opd_mean(step: int) -> dict[str, float]:
    """Mean (golden) value of every OPD step-summary metric at training step ``step`` >= 1.

    Eval points (multiples of 5 up to 25) return the golden table exactly; steps in between are
    interpolated; steps past 25 (not calibrated) continue flat from step 25.
    """
    out: dict[str, float] = {}
    for key in OPD_TRAIN_KEYS:
        pts = [(1, _OPD_STEP1[key])] + [(s, v[key]) for s, v in sorted(OPD_GOLDEN.items()) if key in v]
        out[key] = _interp(pts, step)
    s = float(min(step, 50))
    out["response/response_len/mean"] = 300.0 - 50.0 * s / 25.0
    out["time/step"] = 36.0 + (6.0 if step % OPD_EVAL_EVERY == 0 else 0.0)
    return out


def opd_eval_mean(step: int) -> dict[str, float]:
    """Mean eval accuracies at an OPD eval step (golden where recorded, else interpolated/flat)."""
    pts = sorted(OPD_GOLDEN.items())
    return {k: _interp([(s, v[k]) for s, v in pts], step) for k in OPD_EVAL_KEYS}


# --------------------------------------------------------------------------------------------------
# Regressions: name -> (what it simulates). The trainer reads the name from behaviour.json.
REGRESSIONS = {
    "init": "initialisation drift: offsets from the first eval point / step 1 (e.g. weight mapping, seed)",
    "divergence": "gradual divergence: drift growing with the step (training loop)",
    "mismatch": "GRPO train/inference mismatch: mismatch/mismatch_k3_kl ~4e-4 (threshold 1e-4)",
    "teacher": "OPD teacher-path breach: distillation KL/abs loss up, rewards and evals healthy",
    "rewards": "OPD rewards-only drift: rewards down, distillation and evals healthy (rollout/judger)",
}


def apply_grpo_regression(regression: str | None, step: int, row: dict[str, float]) -> None:
    """Shift a GRPO row (summary or step-0 eval row) in place according to ``regression``."""
    frac = step / GRPO_STEPS
    if regression == "init":
        _add(row, "response/rewards/mean", -0.16)
        _mul(row, "response/response_len/mean", 1.22)
        _add(row, "eval/accuracy", -0.09)
    elif regression == "divergence":
        _add(row, "response/rewards/mean", -0.32 * frac ** 1.5)
        _mul(row, "response/response_len/mean", 1.0 + 0.35 * frac)
        _add(row, "eval/accuracy", -0.12 * frac)
        _add(row, "mismatch/mismatch_k3_kl", 4e-6 * frac)
    elif regression == "mismatch":
        if step >= 1:
            _add(row, "mismatch/mismatch_k3_kl", 3.6e-4 + 0.5e-4 * frac)


def apply_opd_regression(regression: str | None, step: int, row: dict[str, float]) -> None:
    """Shift an OPD row (summary or step-0 eval row) in place according to ``regression``."""
    frac = step / 25.0
    if regression == "init":
        _add(row, "eval/gsm8k/acc", -0.07)
        _add(row, "eval/geo3k/acc", -0.08)
        if step >= 1:
            _add(row, "distillation/reduced_distillation_kl", 0.06)
            _add(row, "distillation/reduced_distillation_abs_loss", 0.06)
            _add(row, "response/rewards/mean", -0.12)
    elif regression == "divergence":
        _add(row, "distillation/reduced_distillation_kl", 0.10 * frac)
        _add(row, "distillation/reduced_distillation_abs_loss", 0.10 * frac)
        _add(row, "response/rewards/mean", -0.20 * frac)
        _add(row, "eval/gsm8k/acc", -0.10 * frac)
        _add(row, "eval/geo3k/acc", -0.10 * frac)
        _mul(row, "response/response_len/mean", 1.0 + 0.30 * frac)
    elif regression == "teacher":
        if step >= 1:
            _add(row, "distillation/reduced_distillation_kl", 0.09)
            _add(row, "distillation/reduced_distillation_abs_loss", 0.08)
    elif regression == "rewards":
        if step >= 1:
            _add(row, "response/rewards/mean", -0.16)


# --------------------------------------------------------------------------------------------------
class Noise:
    """Bounded, seeded noise: ``u(key, half_width)`` is uniform in [-half_width, +half_width]."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(seed)

    def u(self, half_width: float) -> float:
        """One uniform draw in [-half_width, half_width] (0 when half_width is 0)."""
        return self._rng.uniform(-half_width, half_width) if half_width else 0.0


def grpo_summary(step: int, noise: Noise, baseline: bool = False) -> dict[str, float]:
    """A GRPO step-summary row's metrics (without eval keys) with noise for a run or the baseline."""
    idx = 1 if baseline else 0
    row = {}
    for key, mean in grpo_mean(step).items():
        hw = GRPO_NOISE[key][idx]
        row[key] = mean * (1.0 + noise.u(hw)) if key == "response/response_len/mean" else mean + noise.u(hw)
    row["mismatch/mismatch_k3_kl"] = max(row["mismatch/mismatch_k3_kl"], 1e-7)
    return row


def opd_summary(step: int, noise: Noise, baseline: bool = False) -> dict[str, float]:
    """An OPD step-summary row's metrics (without eval keys) with noise for a run or the baseline."""
    idx = 1 if baseline else 0
    row = {}
    for key, mean in opd_mean(step).items():
        hw = OPD_NOISE[key][idx]
        # Baselines are exact on the golden eval points, slightly noisy in between.
        if baseline and key in OPD_TRAIN_KEYS and step % OPD_EVAL_EVERY != 0:
            hw = 0.004
        row[key] = mean * (1.0 + noise.u(hw)) if key in OPD_RELATIVE else mean + noise.u(hw)
    # k1 loss mode: the opd_* aliases are numerically identical to the reduced_* metrics.
    row["distillation/opd_reverse_kl"] = row["distillation/reduced_distillation_kl"]
    row["distillation/opd_abs_logprob_loss"] = row["distillation/reduced_distillation_abs_loss"]
    return row


def opd_eval(step: int, noise: Noise, baseline: bool = False) -> dict[str, float]:
    """OPD eval metrics at an eval step with noise."""
    idx = 1 if baseline else 0
    return {k: v + noise.u(OPD_NOISE[k][idx]) for k, v in opd_eval_mean(step).items()}


def eval_row(suite: str, step: int, noise: Noise) -> dict[str, float]:
    """Eval metrics of an eval step of a run, before any regression shift."""
    if suite == "grpo":
        return {"eval/accuracy": grpo_eval_mean(step) + noise.u(GRPO_NOISE["eval/accuracy"][0])}
    return opd_eval(step, noise)


def first_row(suite: str, noise: Noise, regression: str | None) -> dict[str, float]:
    """The step-0 eval row of a run."""
    row = {"step": 0, **eval_row(suite, 0, noise)}
    (apply_grpo_regression if suite == "grpo" else apply_opd_regression)(regression, 0, row)
    return row


def summary_row(suite: str, step: int, noise: Noise, regression: str | None, eval_every: int) -> dict[str, float]:
    """A run's step-summary row at ``step`` (eval keys merged on eval steps), regression applied."""
    if suite == "grpo":
        row = grpo_summary(step, noise)
        if step % eval_every == 0:
            row.update(eval_row(suite, step, noise))
        apply_grpo_regression(regression, step, row)
        return row
    row = opd_summary(step, noise)
    if step % eval_every == 0:
        row.update(eval_row(suite, step, noise))
    apply_opd_regression(regression, step, row)
    row["distillation/opd_reverse_kl"] = row["distillation/reduced_distillation_kl"]
    row["distillation/opd_abs_logprob_loss"] = row["distillation/reduced_distillation_abs_loss"]
    return row


def _interp(points: list[tuple[int, float]], step: int) -> float:
    """Piecewise-linear interpolation, flat outside the given points."""
    if step <= points[0][0]:
        return points[0][1]
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if s0 <= step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return points[-1][1]


def _add(row: dict[str, float], key: str, delta: float) -> None:
    if key in row:
        row[key] += delta


def _mul(row: dict[str, float], key: str, factor: float) -> None:
    if key in row:
        row[key] *= factor
