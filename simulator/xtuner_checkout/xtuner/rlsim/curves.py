"""Metric curves replayed by the SIMULATED XTuner trainer (rl-verify simulator; not XTuner code).

Standard library only: this module runs on the simulated GPU node with the system python3, and the
simulator's control side and the benchmarks import it (by file path). :func:`run_rows` generates a
whole run's tracker rows and :func:`baseline_rows` the share's baseline trackers; the trainer
(train.py) writes exactly ``run_rows``' rows, so a benchmark replaying seeds and the node agree.

A run is a mean curve per step plus seeded noise, plus the regression its commit carries
(behaviour.json: deterministic offsets on top, whatever the noise mode). The node's ``sim.json`` key
``"noise"`` picks the noise mode (NOISE_MODES):

* ``bounded`` (default): uniform noise, bounded so that a healthy run is guaranteed to sit inside
  the runbook thresholds (current-run half-width at most ~35 % of each threshold, the baseline's at
  most ~5 %, so the worst case |current - baseline| stays below ~40 %). The golden table / baseline
  is the truth. Tests that need a certain PASS use it.
* ``realistic``: unbounded normal noise with the run-to-run sigmas below, binomial sampling noise on
  eval accuracies, and the baseline's own error (below). A healthy run breaches the runbook's
  thresholds as often as real ones would.
* ``realistic-t``: the same sigmas with heavier tails: Student-t with T_DF = 5 degrees of freedom
  scaled to unit variance (kurtosis 9); the binomial part and the baseline's error stay normal.

Noise is independent per (metric, step) by default: the runbook gives no step-to-step correlation. (One
consequence: the GRPO checker's p80-over-45-steps statistics are nearly deterministic, so their
breach rate changes abruptly with sigma.) Real RL runs are not so: a run whose policy drifts above the mean
at step t is still above at t + 1. ``correlation`` (sim.json, :func:`check_correlation`, 0 <= rho < 1) makes a
run's noise on every training metric AR(1) from step to step: e_t = rho e_(t-1) + sqrt(1 - rho^2) z_t, the
first step's e_1 = z_1, so every step keeps the same marginal sigma and the draws are the independent mode's
when rho = 0 (the same seeds give the same rows). The baseline's own N-run error is AR(1) with the same rho (a
mean of such runs is). Eval accuracies keep their independent model-level and binomial parts. REAL_CORRELATION
is the value argued for real runs (docs/BEHAVIOUR.md): the simulator's default stays 0, the seeds the tests
chose keep their rows.

OPD sigmas: the runbook's measured max deviations (N=3, 25 steps) read as normal noise
----------------------------------------------------------------------------------------
The runbook's "measured max dev" is max |x_i - mean(x)| over the N=3 runs i and the eval points.
For N normal runs with sigma, E[max over K points of max_i |x_i - mean|] = c(N, K) sigma, with
c(3, 5) = 1.615 (training metrics: points 5..25, none at step 0) and c(3, 6) = 1.680 (eval
metrics: points 0..25) (Monte Carlo, 2e6 draws: MAXDEV_FACTOR). So sigma = measured / c:

    metric                      measured max dev   K   sigma (OPD_SIGMA)
    distill_kl                  0.0174             5   0.0108
    abs_loss                    0.0179             5   0.0111
    rewards                     0.0523             5   0.0324
    eval/gsm8k/acc              0.0169             6   0.0101
    eval/geo3k/acc              0.0225             6   0.0134
    response_len (relative)     12.1 %             5   7.49 %
    time/step (relative)        4.3 %              5   2.66 %

(Had the maxima been taken over all 25 steps, c(3, 25) = 2.136 and every sigma would be 24 %
smaller.) Each sigma is itself estimated from one maximum over 3 runs: uncertain by ~25 %.

GRPO sigmas: the runbook gives thresholds only (baseline: mean of 5 runs)
------------------------------------------------------------------------
Two estimates per metric; the smaller is used (GRPO_SIGMA_ESTIMATES), because each errs high under
its own assumption. (a) The runbook's rule read backwards: if the GRPO thresholds were 1.5 x the
expected max deviation of the baseline's 5 runs, in the statistic the check compares (final point
c(5, 1) = 1.353; p80 over 45 steps, max over 5 runs 1.300; every one of 45 steps c(5, 45) = 2.680):
too high where a threshold is a loose safety bound rather than a measured spread. (b) Physical: OPD's
measured spread transferred (it assumes the 8B GRPO run on one dataset is as noisy as the 2B VL
student distilled on two: too high if anything).

    metric              (a) rule                     (b) physical                          used
    eval/accuracy       0.05/(1.5*1.353) = 0.0246    OPD gsm8k as is: same benchmark 0.0101  0.0101
    rewards             0.1/(1.5*1.300)  = 0.0513    OPD 0.0324 scaled as batch sampling:    0.0280
                                                     0/1 rewards ~0.90 over 64 prompts vs
                                                     ~0.60 over 128: x sqrt(0.75)
    response_len (rel)  0.12/(1.5*1.300) = 6.15 %    OPD as is 7.49 %                        6.15 %
    mismatch_k3_kl      1e-4/(1.5*2.680) = 2.5e-5    a quarter of its level (1.2e-5): 3e-6   3e-6
    time/step (rel)     10 s/(1.5*2.680) = 5.5 %     OPD as is 2.66 % (1.2 s at 45 s)        2.66 %

(a) fails visibly for mismatch (a sigma above the metric's level: the 1e-4 bound is 8x the level)
and rewards (+-0.05 swings near a ceiling of 1). Caveat: response_len sits at a cliff, a healthy
run's p80 breach rate is ~0.2 % at 6.15 % and ~12 % at 7.49 %. Rewards are kept in [0, 1] and the KL
above 0 (physical limits).

Eval accuracies: model-level normal part + binomial sampling
-----------------------------------------------------------
An eval score is the share of EVAL_TRIALS answers correct at the model's accuracy: binomial (normal
approximation, n p (1-p) > 400 here), on top of a model-level part whose sigma makes the total equal
the metric's sigma at its true mean: model_sd^2 = sigma^2 - p (1-p) / n. Assumed sizes: the public
test splits, GSM8K 1,319 prompts (GRPO's eval file is gsm8k/test.jsonl), Geometry3K 601, with 4
samples per prompt: n = 5,276 (gsm8k, both suites) and 2,404 (geo3k). Why 4: with one sample per
prompt the binomial part alone (0.0126-0.0136 gsm8k, 0.0179-0.0188 geo3k at OPD's accuracies) would
exceed the measured totals (0.0101, 0.0134), which rules it out; 4 is the smallest power of two
leaving a real model-level part: the binomial share of the variance is 39-46 % (OPD gsm8k), 45-49 %
(geo3k), 17-25 % (GRPO at 0.84-0.90). These are assumptions about the eval protocol, not facts read
from XTuner.

The baseline's own error (realistic modes)
------------------------------------------
The golden table (OPD) and the baseline tracker (GRPO) are means of N runs (BASELINE_RUNS: 3 and 5),
not the truth: reference - truth ~ normal(0, sigma / sqrt(N)) per (metric, step). The node's true
healthy curve (:func:`true_means`) is therefore the reference offset by one seeded draw of that
error, taken from the node's ``baseline_error_seed`` (sim.json, default
DEFAULT_BASELINE_ERROR_SEED), the same for every run on the node: repeats share it, and no number
of repeats removes it. The share's baseline trackers (:func:`baseline_rows`) are one N-run mean of
that truth: truth + normal(0, sigma / sqrt(N)) drawn from the same seed, except the values the
runbook records, which stay exactly the runbook's (the golden table at OPD eval points, GRPO's final
eval/accuracy 0.9007): there the truth carries the whole error. Regressions apply on top of the truth.

Seeds: a run's noise comes from its seed (train.py: RLSIM_SEED, else RL_VERIFY_SEED, else sim.json
"seed", else the experiment folder name), drawn as Noise(f"{suite}:{seed}"); the truth and the share's
baselines from f"{suite}:truth:{baseline_error_seed}" and f"{suite}:baseline:{baseline_error_seed}".
"""
from __future__ import annotations

import functools
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


def regression_applier(suite: str, regression: str | None, scale: float = 1.0, from_step: int = 0):
    """``apply(regression, step, row)`` for ``suite``: the regression's shifts, each multiplied by ``scale``
    and applied only from training step ``from_step`` on (0: from the start, as the regression branches do).

    ``scale`` 1 and ``from_step`` 0 give exactly :func:`apply_grpo_regression` / :func:`apply_opd_regression`.
    A scaled regression keeps its kind's shape: every metric it moves moves by ``scale`` x its usual shift
    (a multiplicative one by ``scale`` x its usual change). The simulated bisection history uses it:
    its culprit's behaviour.json names a kind, a ``scale`` and a ``from_step``.
    """
    base = apply_grpo_regression if suite == "grpo" else apply_opd_regression
    scale, from_step = float(scale), int(from_step)
    if regression is None or (scale == 1.0 and from_step <= 0):
        return base

    def apply(name: str | None, step: int, row: dict[str, float]) -> None:
        if name is None or step < from_step:
            return
        before = dict(row)
        base(name, step, row)
        for key, value in row.items():
            if key in before and value != before[key]:
                row[key] = before[key] + (value - before[key]) * scale

    return apply


# --------------------------------------------------------------------------------------------------
class Noise:
    """Bounded, seeded noise: ``u(key, half_width)`` is uniform in [-half_width, +half_width]."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(seed)
        #: each AR(1) series' last value (``ar``)
        self._persist: dict[str, float] = {}

    def u(self, half_width: float) -> float:
        """One uniform draw in [-half_width, half_width] (0 when half_width is 0)."""
        return self._rng.uniform(-half_width, half_width) if half_width else 0.0

    def ar(self, key: str, rho: float, mode: str = "realistic") -> float:
        """One step of ``key``'s AR(1) noise with lag-1 correlation ``rho`` and unit variance: exactly
        :meth:`z` when ``rho`` is 0 (one draw a call either way, so the draw order never shifts)."""
        z = self.z(mode)
        if not rho:
            return z
        previous = self._persist.get(key)
        value = z if previous is None else rho * previous + math.sqrt(1.0 - rho * rho) * z
        self._persist[key] = value
        return value

    def z(self, mode: str = "realistic") -> float:
        """One unbounded draw with mean 0 and variance 1: standard normal, or for ``realistic-t``
        Student-t with ``T_DF`` degrees of freedom scaled to unit variance (same sigma, heavier tails)."""
        if mode == "realistic-t":
            chi2 = 2.0 * self._rng.gammavariate(T_DF / 2.0, 1.0)
            return self._rng.gauss(0.0, 1.0) / math.sqrt(chi2 / T_DF) * math.sqrt((T_DF - 2.0) / T_DF)
        return self._rng.gauss(0.0, 1.0)


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


def first_row(suite: str, noise: Noise, regression: str | None, apply=None) -> dict[str, float]:
    """The step-0 eval row of a run (``apply``: a :func:`regression_applier`, default the plain one)."""
    row = {"step": 0, **eval_row(suite, 0, noise)}
    (apply or (apply_grpo_regression if suite == "grpo" else apply_opd_regression))(regression, 0, row)
    return row


def summary_row(suite: str, step: int, noise: Noise, regression: str | None, eval_every: int,
                apply=None) -> dict[str, float]:
    """A run's step-summary row at ``step`` (eval keys merged on eval steps), regression applied
    (``apply``: a :func:`regression_applier`, default the plain one)."""
    if suite == "grpo":
        row = grpo_summary(step, noise)
        if step % eval_every == 0:
            row.update(eval_row(suite, step, noise))
        (apply or apply_grpo_regression)(regression, step, row)
        return row
    row = opd_summary(step, noise)
    if step % eval_every == 0:
        row.update(eval_row(suite, step, noise))
    (apply or apply_opd_regression)(regression, step, row)
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


# ==================================================================================================
# Noise modes and the realistic noise model (the figures and their sources: module docstring).
NOISE_MODES = ("bounded", "realistic", "realistic-t")
DEFAULT_NOISE = "bounded"
#: Degrees of freedom of the ``realistic-t`` mode (scaled to unit variance: finite kurtosis, 9).
T_DF = 5
#: The node's default seed for the baseline's own error: the same on every node (there is one golden
#: table), and a typical draw: at it a healthy OPD run FAILs the runbook about as often as on average
#: over draws (about 50 %; seed "0", the worst of 60 draws tried, makes it about 70 %).
DEFAULT_BASELINE_ERROR_SEED = "33"
#: Runs averaged into the reference: OPD golden table 3-run mean, GRPO baseline tracker 5-run mean.
BASELINE_RUNS = {"grpo": 5, "opd": 3}

#: E[max |x_i - mean of the N runs|] / sigma over K points for N normal runs, by (N, K) (Monte Carlo,
#: 2e6 draws; tests/unit/test_sim_noise.py measures them again).
MAXDEV_FACTOR = {(3, 5): 1.615, (3, 6): 1.680, (5, 1): 1.353, (5, 45): 2.680}
#: The same for the GRPO checker's p80 statistic: E[max over 5 runs of p80 over 45 steps of |x - mean|].
P80_MAXDEV_FACTOR_5x45 = 1.300

#: The runbook's OPD table "measured max dev" (N=3, 25 steps) and the eval points each was taken over
#: (training metrics exist at 5/10/15/20/25 only; eval metrics also at step 0).
OPD_MEASURED_MAX_DEV = {
    "distillation/reduced_distillation_kl": (0.0174, 5),
    "distillation/reduced_distillation_abs_loss": (0.0179, 5),
    "response/rewards/mean": (0.0523, 5),
    "eval/gsm8k/acc": (0.0169, 6),
    "eval/geo3k/acc": (0.0225, 6),
    "response/response_len/mean": (0.121, 5),   # relative
    "time/step": (0.043, 5),                    # relative
}
#: Metrics whose noise (and sigma) is relative to the value; all others are absolute.
RELATIVE_METRICS = ("response/response_len/mean", "time/step")

OPD_SIGMA = {k: dev / MAXDEV_FACTOR[(3, points)] for k, (dev, points) in OPD_MEASURED_MAX_DEV.items()}

# GRPO: two estimates per metric, the smaller one is used (module docstring):
#   (a) the runbook's own rule read backwards: threshold = 1.5 x E[max deviation of the baseline's 5 runs]
#       for the statistic the check compares (final point, p80 over 45 steps, or every one of 45 steps);
#   (b) a physical estimate: OPD's measured spread transferred (rewards scaled as batch sampling,
#       0/1 rewards at ~0.90 over 64 prompts against ~0.60 over 128), mismatch a quarter of its level.
GRPO_SIGMA_ESTIMATES = {
    "eval/accuracy": (0.05 / (1.5 * MAXDEV_FACTOR[(5, 1)]), OPD_SIGMA["eval/gsm8k/acc"]),
    "response/rewards/mean": (0.1 / (1.5 * P80_MAXDEV_FACTOR_5x45),
                              OPD_SIGMA["response/rewards/mean"]
                              * math.sqrt((0.90 * 0.10 / 64) / (0.60 * 0.40 / 128))),
    "response/response_len/mean": (0.12 / (1.5 * P80_MAXDEV_FACTOR_5x45), OPD_SIGMA["response/response_len/mean"]),
    "mismatch/mismatch_k3_kl": (1e-4 / (1.5 * MAXDEV_FACTOR[(5, 45)]), 0.25 * 1.2e-5),
    "time/step": (10.0 / (1.5 * MAXDEV_FACTOR[(5, 45)]) / 45.0, OPD_SIGMA["time/step"]),
}
GRPO_SIGMA = {k: min(a, b) for k, (a, b) in GRPO_SIGMA_ESTIMATES.items()}
SIGMA = {"grpo": GRPO_SIGMA, "opd": OPD_SIGMA}

#: Eval accuracies: binomial sampling over this many independent trials = prompts x samples per prompt.
EVAL_SAMPLES_PER_PROMPT = 4
EVAL_PROMPTS = {"eval/accuracy": 1319, "eval/gsm8k/acc": 1319, "eval/geo3k/acc": 601}
EVAL_TRIALS = {k: n * EVAL_SAMPLES_PER_PROMPT for k, n in EVAL_PROMPTS.items()}

_EVAL_KEYS = {"grpo": ("eval/accuracy",), "opd": OPD_EVAL_KEYS}
#: Every metric of a suite, in the fixed order the truth's and the baselines' draws take.
_KEYS = {"grpo": tuple(sorted(GRPO_SIGMA)), "opd": tuple(sorted(OPD_SIGMA))}
_DEFAULT_STEPS = {"grpo": GRPO_STEPS, "opd": 25}
_DEFAULT_EVAL_EVERY = {"grpo": 15, "opd": OPD_EVAL_EVERY}


def check_noise_mode(mode: str) -> str:
    """Return ``mode`` if it is one of NOISE_MODES, else raise ValueError naming the valid ones."""
    if mode not in NOISE_MODES:
        raise ValueError(f"unknown noise mode {mode!r}: one of {', '.join(NOISE_MODES)}")
    return mode


#: The step-to-step correlation argued for real RL runs' training metrics (docs/BEHAVIOUR.md, "Correlated noise");
#: the simulator's default is 0 (independent), the bench covers 0 to 0.95.
REAL_CORRELATION = 0.8


def check_correlation(value: float) -> float:
    """Return ``value`` as a float if it is a step-to-step correlation this simulator draws (0 <= rho < 1), else
    raise ValueError naming it and the range."""
    rho = float(value)
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"correlation {value!r}: give a step-to-step correlation 0 <= rho < 1 (0: independent)")
    return rho


def check_spread_ratio(value: float) -> float:
    """The node's true run-to-run spread over the spread the baselines and the rule assume (sim.json
    ``"spread_ratio"``, default 1.0): every sigma of SIGMA, the run's noise and the baseline's own error
    (its N runs were as noisy), is multiplied by it in the realistic modes. 1.25 is the issue-34 case: the
    runbook's sigma, read from one max deviation over 3 runs, is one standard error low. Bounded mode
    ignores it. Raise ValueError unless it is a finite number in (0, 10]."""
    ratio = float(value)
    if not (math.isfinite(ratio) and 0 < ratio <= 10):
        raise ValueError(f"spread_ratio {value!r}: give a number in (0, 10] (1.0: the assumed spread)")
    return ratio


def _check_suite(suite: str) -> None:
    if suite not in SIGMA:
        raise ValueError(f"unknown suite {suite!r}: grpo or opd")


def design_means(suite: str, step: int) -> dict[str, float]:
    """The reference curve at ``step``: what the golden table / baseline records where it records a
    value (OPD golden points, GRPO final eval 0.9007), the smooth design curve elsewhere. Step 0 holds
    the eval metrics only."""
    _check_suite(suite)
    if suite == "grpo":
        evals = {"eval/accuracy": grpo_eval_mean(step)}
        return evals if step == 0 else {**grpo_mean(step), **evals}
    evals = opd_eval_mean(step)
    return evals if step == 0 else {**opd_mean(step), **evals}


@functools.lru_cache(maxsize=512)
def _truth(suite: str, steps: int, baseline_error_seed: str,
           spread_ratio: float = 1.0) -> tuple[tuple[tuple[str, float], ...], ...]:
    """The node's true healthy curve: the reference plus one draw of the baseline's own error per
    (metric, step), spread_ratio x sigma / sqrt(N) (normal: a mean of N runs). Drawn for every metric at
    every step in a fixed order, so a longer run shares a shorter one's steps."""
    rng = Noise(f"{suite}:truth:{baseline_error_seed}")
    root_n = math.sqrt(BASELINE_RUNS[suite])
    out = []
    for step in range(steps + 1):
        means = design_means(suite, step)
        point = {}
        for key in _KEYS[suite]:
            delta = spread_ratio * SIGMA[suite][key] / root_n * rng.z("realistic")
            if key in means:
                point[key] = (means[key] * (1.0 + delta) if key in RELATIVE_METRICS
                              else _physical(key, means[key] + delta))
        out.append(tuple(point.items()))
    return tuple(out)


def true_means(suite: str, steps: int | None = None, mode: str = DEFAULT_NOISE,
               baseline_error_seed: str = DEFAULT_BASELINE_ERROR_SEED,
               spread_ratio: float = 1.0) -> list[dict[str, float]]:
    """The healthy node's true mean of every metric, indexed by step (0..steps): the reference curve in
    bounded mode; in the realistic modes the reference offset by the baseline's own error, the same
    for every run of a node with this ``baseline_error_seed``. Regressions are not applied."""
    _check_suite(suite)
    check_noise_mode(mode)
    steps = _DEFAULT_STEPS[suite] if steps is None else int(steps)
    if mode == "bounded":
        return [design_means(suite, s) for s in range(steps + 1)]
    return [dict(point) for point in _truth(suite, steps, str(baseline_error_seed), check_spread_ratio(spread_ratio))]


def _minibatch_rows(step: int, noise: Noise) -> list[dict[str, float]]:
    """The trainer's two mini-batch rows of a step (no step-summary marker; nobody checks them)."""
    return [{"step": step, "train/mini_batch": mb, "loss/policy_loss": 0.02 * noise.u(1.0),
             "grad_norm": 0.3 + noise.u(0.05), "lr": 1e-6} for mb in range(2)]


def _physical(key: str, value: float) -> float:
    """Keep a value where the metric can be: a mean of 0/1 rewards in [0, 1], a KL above 0."""
    if key == "response/rewards/mean":
        return min(max(value, 0.0), 1.0)
    if key == "mismatch/mismatch_k3_kl":
        return max(value, 1e-7)
    return value


def _noisy(suite: str, key: str, true: float, noise: Noise, mode: str, spread_ratio: float = 1.0,
           correlation: float = 0.0) -> float:
    """One run's value of a training metric around its true mean (relative or absolute sigma), its noise AR(1)
    over the run's steps with ``correlation``."""
    sigma = spread_ratio * SIGMA[suite][key]
    if key in RELATIVE_METRICS:
        return true * (1.0 + sigma * noise.ar(key, correlation, mode))
    return _physical(key, true + sigma * noise.ar(key, correlation, mode))


def _noisy_eval(suite: str, key: str, true: float, noise: Noise, mode: str, spread_ratio: float = 1.0) -> float:
    """One run's eval accuracy: the model's accuracy (true mean + model-level noise), then the score
    of EVAL_TRIALS[key] answers at that accuracy (binomial, normal approximation: n p (1-p) > 400
    here). The model-level sigma makes the total equal SIGMA at the true mean."""
    sigma, n = spread_ratio * SIGMA[suite][key], EVAL_TRIALS[key]
    p = min(max(true, 0.0), 1.0)
    model_sd = math.sqrt(max(sigma * sigma - p * (1.0 - p) / n, 0.0))
    p_model = min(max(p + model_sd * noise.z(mode), 0.0), 1.0)
    # Sampling of answers is binomial whatever the mode: its tails are never heavy.
    correct = round(n * p_model + math.sqrt(n * p_model * (1.0 - p_model)) * noise.z("realistic"))
    return min(max(correct, 0), n) / n


def _realistic_row(suite: str, step: int, truth: dict[str, float], noise: Noise, mode: str,
                   eval_step: bool, spread_ratio: float = 1.0, correlation: float = 0.0) -> dict[str, float]:
    """A realistic step-summary row (eval keys merged on eval steps), before any regression."""
    row = {}
    for key in (grpo_mean(step) if suite == "grpo" else opd_mean(step)):
        row[key] = _noisy(suite, key, truth[key], noise, mode, spread_ratio, correlation)
    if eval_step:
        for key in _EVAL_KEYS[suite]:
            row[key] = _noisy_eval(suite, key, truth[key], noise, mode, spread_ratio)
    return row


def run_rows(suite: str, seed: str | int, regression: str | None = None, mode: str = DEFAULT_NOISE, *,
             steps: int | None = None, eval_every: int | None = None,
             baseline_error_seed: str = DEFAULT_BASELINE_ERROR_SEED, regression_scale: float = 1.0,
             regression_from: int = 0, spread_ratio: float = 1.0,
             correlation: float = 0.0) -> list[dict[str, float]]:
    """Every row the simulated trainer writes for one run, in order: the step-0 eval row, then per step
    its two mini-batch rows and its step-summary row (eval keys merged on eval steps).

    Pure and deterministic: the same arguments give the same rows, in this process or on the node
    (the trainer writes exactly these, then applies its node faults: slow, nan, crash, ...).
    ``seed`` is the run's seed (the trainer's RLSIM_SEED / RL_VERIFY_SEED / node seed / experiment
    folder); ``regression`` a key of REGRESSIONS or None (healthy); ``mode`` one of NOISE_MODES;
    ``steps`` / ``eval_every`` default to the runbook's (GRPO 45 / 15, OPD 25 / 5);
    ``baseline_error_seed`` fixes the node's true curve in the realistic modes (ignored when bounded);
    ``regression_scale`` / ``regression_from``: the regression's size (x its kind's shifts) and the first
    training step it shows at (:func:`regression_applier`; behaviour.json's ``scale`` / ``from_step``);
    ``spread_ratio``: the node's true run-to-run spread over the one the baselines assume (SIGMA), see
    :func:`check_spread_ratio`; ``correlation``: the step-to-step correlation of the run's training-metric noise
    (:func:`check_correlation`; 0: independent). The noise draws never depend on the regression: the same seed
    gives the same noise on every commit.
    Bounded mode reproduces the rows of the earlier trainer exactly.
    """
    _check_suite(suite)
    check_noise_mode(mode)
    steps = _DEFAULT_STEPS[suite] if steps is None else int(steps)
    eval_every = _DEFAULT_EVAL_EVERY[suite] if eval_every is None else int(eval_every)
    noise = Noise(f"{suite}:{seed}")
    apply = regression_applier(suite, regression, regression_scale, regression_from)
    if mode == "bounded":
        rows = [first_row(suite, noise, regression, apply)]
        for step in range(1, steps + 1):
            rows += _minibatch_rows(step, noise)
            rows.append({"step": step, **summary_row(suite, step, noise, regression, eval_every, apply)})
        return rows

    truth = true_means(suite, steps, mode, baseline_error_seed, spread_ratio)
    first = {"step": 0, **{k: _noisy_eval(suite, k, truth[0][k], noise, mode, spread_ratio)
                           for k in _EVAL_KEYS[suite]}}
    apply(regression, 0, first)
    rows = [first]
    for step in range(1, steps + 1):
        rows += _minibatch_rows(step, noise)
        row = _realistic_row(suite, step, truth[step], noise, mode, step % eval_every == 0, spread_ratio,
                             check_correlation(correlation))
        apply(regression, step, row)
        if suite == "opd":
            # k1 loss mode: the opd_* aliases are numerically identical to the reduced_* metrics.
            row["distillation/opd_reverse_kl"] = row["distillation/reduced_distillation_kl"]
            row["distillation/opd_abs_logprob_loss"] = row["distillation/reduced_distillation_abs_loss"]
        rows.append({"step": step, **row})
    return rows


def baseline_rows(suite: str, mode: str = DEFAULT_NOISE, *, steps: int | None = None,
                  baseline_error_seed: str = DEFAULT_BASELINE_ERROR_SEED,
                  spread_ratio: float = 1.0, correlation: float = 0.0) -> list[dict[str, float]]:
    """The rows of the node share's baseline tracker of ``suite`` (``correlation``: its training metrics' N-run
    error AR(1) over the steps, as the mean of runs that are).

    GRPO: 45 step-summary rows, ``eval/accuracy`` only on the last (0.9007, the runbook's value).
    OPD: the step-0 eval row and ``steps`` (25) step-summary rows, eval keys on eval steps.
    Bounded mode: the reference curve with small bounded noise, as before. Realistic modes: one mean of
    N runs (GRPO 5, OPD 3) of the node's true curve (see :func:`true_means`): every value is the true
    mean plus a normal draw with sigma / sqrt(N), except the values the runbook records, which are
    exactly the runbook's (the golden table at OPD eval points, GRPO's final eval/accuracy): there the
    true curve carries the error instead. Either way reference - truth has sigma / sqrt(N).
    """
    _check_suite(suite)
    check_noise_mode(mode)
    steps = _DEFAULT_STEPS[suite] if steps is None else int(steps)
    if mode == "bounded":
        return _bounded_baseline_rows(suite, steps)
    truth = true_means(suite, steps, mode, baseline_error_seed, spread_ratio)
    rng = Noise(f"{suite}:baseline:{baseline_error_seed}")
    root_n = math.sqrt(BASELINE_RUNS[suite])

    rho = check_correlation(correlation)
    evals = set(_EVAL_KEYS[suite])

    def mean_of_runs(key: str, step: int) -> float:
        # always drawn: the order never shifts
        err = spread_ratio * SIGMA[suite][key] / root_n * rng.ar(key, 0.0 if key in evals else rho, "realistic")
        true = truth[step][key]
        return true * (1.0 + err) if key in RELATIVE_METRICS else _physical(key, true + err)

    if suite == "grpo":
        rows = []
        for step in range(1, steps + 1):
            row = {"step": step, **{k: mean_of_runs(k, step) for k in grpo_mean(step)}}
            if step == steps:
                row["eval/accuracy"] = GRPO_FINAL_EVAL
            rows.append(row)
        return rows
    rows = [{"step": 0, **{k: OPD_GOLDEN[0][k] for k in OPD_EVAL_KEYS}}]
    for step in range(1, steps + 1):
        golden = OPD_GOLDEN.get(step, {})
        keys = list(opd_mean(step)) + (list(OPD_EVAL_KEYS) if step % OPD_EVAL_EVERY == 0 else [])
        row = {"step": step}
        for key in keys:
            value = mean_of_runs(key, step)
            row[key] = golden.get(key, value)
        row["distillation/opd_reverse_kl"] = row["distillation/reduced_distillation_kl"]
        row["distillation/opd_abs_logprob_loss"] = row["distillation/reduced_distillation_abs_loss"]
        rows.append(row)
    return rows


def _bounded_baseline_rows(suite: str, steps: int) -> list[dict[str, float]]:
    """The bounded mode's baselines (unchanged): reference curve, small uniform noise, runbook values."""
    if suite == "grpo":
        noise = Noise("grpo-baseline")
        rows = []
        for step in range(1, steps + 1):
            row = {"step": step, **grpo_summary(step, noise, baseline=True)}
            if step == steps:
                row["eval/accuracy"] = GRPO_FINAL_EVAL
            rows.append(row)
        return rows
    noise = Noise("opd-baseline")
    rows = [{"step": 0, **opd_eval(0, noise, baseline=True)}]
    for step in range(1, steps + 1):
        row = {"step": step, **opd_summary(step, noise, baseline=True)}
        if step % OPD_EVAL_EVERY == 0:
            row.update(opd_eval(step, noise, baseline=True))
        rows.append(row)
    return rows
