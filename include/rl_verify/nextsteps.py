"""Runbook section 3 ("Interpreting results") as code.

Every string returned starts with "Inference:" because it is a reading of the measurements, not a
measurement. Rules (runbook section 3):

* breach already at step 1 / the first eval point -> initialisation or config (weight mapping,
  seed, data order), not the training loop;
* breach that appears later (gradual divergence) -> training loop (loss, advantage, KL, weight sync);
* ``mismatch/mismatch_k3_kl`` breach -> train/inference consistency (logprob path, weight update,
  rollout backend), listed first for GRPO;
* OPD ``distill_kl`` breach with healthy rewards -> teacher path (teacher endpoints, sampled tokens,
  distillation loss); rewards-only drift -> rollout/judger, not distillation.

Plus: PASS -> one "no action" line; infrastructure failures -> check the logs, not an accuracy signal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rl_verify.model import Check

MISMATCH = "mismatch/mismatch_k3_kl"
DISTILL_KL = "distillation/reduced_distillation_kl"
REWARDS = "response/rewards/mean"
STEP_COUNT = "RL steps"
FINAL_EVAL_SOURCES = ("final-eval",)
# Metrics whose breach says nothing about accuracy (machine speed), excluded from the accuracy rules.
TIMING_METRICS = ("time/step", "e2e wall time")


def infrastructure_steps(reason: str) -> list[str]:
    """Suggestion for a failure that is not an accuracy signal."""
    return [
        "Inference: infrastructure failure, not an accuracy signal "
        f"({reason}). Check the training/launch logs and the node (GPUs, Ray, teacher servers) "
        "and re-run; no metric was judged."
    ]


def pass_steps() -> list[str]:
    """The single line shown on PASS."""
    return ["Inference: no action needed; every checked metric is within its threshold."]


def _failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if c.passed is False]


def _first_breach(metric: str, checks: list[Check]) -> int | None:
    """Earliest step at which ``metric`` breaks its bound, from per-point checks or aggregates."""
    steps = [c.first_breach_step if c.first_breach_step is not None else c.step
             for c in checks if c.metric == metric and c.passed is False]
    known = [s for s in steps if s is not None]
    return min(known) if known else None


def _first_compared(metric: str, checks: list[Check], first_steps: Mapping[str, int]) -> int | None:
    """First step at which ``metric`` is compared at all (step 1 for GRPO, first eval point for OPD)."""
    if metric in first_steps:
        return first_steps[metric]
    steps = [c.step for c in checks if c.metric == metric and c.step is not None and c.passed is not None]
    return min(steps) if steps else None


def _names(metrics: Iterable[str]) -> str:
    return ", ".join(sorted(set(metrics)))


def suggest(suite: str, checks: list[Check], verdict: str, failure_class: str | None = None,
            first_steps: Mapping[str, int] | None = None, reason: str = "") -> list[str]:
    """Next-step suggestions for one suite, each starting with "Inference:".

    ``first_steps`` maps a metric to the first step it is compared at, when the checks alone do
    not tell (GRPO aggregates); otherwise the earliest calibrated check step is used.
    """
    if failure_class == "infrastructure":
        return infrastructure_steps(reason or "see abnormal findings")
    if verdict == "PASS":
        return pass_steps()
    first_steps = first_steps or {}
    failed = _failed(checks)
    out: list[str] = []
    missing = [c for c in failed if "missing" in c.note.lower()]
    non_finite = [c for c in failed if c.current is not None and c.current != c.current]
    step_count = [c for c in failed if c.metric == STEP_COUNT]
    accuracy = [c for c in failed if c.metric not in TIMING_METRICS and c.metric != STEP_COUNT
                and c not in missing]
    failed_metrics = {c.metric for c in accuracy}

    if MISMATCH in failed_metrics:
        out.append("Inference: mismatch/mismatch_k3_kl breached: train/inference inconsistency. Check first "
                   "the logprob path, the weight update/sync into the rollout engine and the rollout backend"
                   + (" (check this before anything else for GRPO)." if suite == "grpo" else "."))
    if step_count:
        c = step_count[0]
        out.append(f"Inference: the current run has {c.current} RL steps vs {c.baseline} in the baseline: the run "
                   "stopped early (crash, OOM, killed) or total_epochs/global_batch_size/dataset size changed. "
                   "Read the end of the training log before trusting any metric.")
    if missing:
        out.append(f"Inference: {_names(c.metric for c in missing)} missing from the current tracker at some "
                   "points: the run stopped before them or the metric was renamed/not logged; check the "
                   "training log and the config (eval interval, total steps).")
    if non_finite:
        out.append(f"Inference: {_names(c.metric for c in non_finite)} became NaN/Infinity: training diverged "
                   "numerically; look at the first non-finite step in the tracker and the loss/grad-norm "
                   "around it.")
    if suite == "opd" and DISTILL_KL in failed_metrics and REWARDS not in failed_metrics:
        out.append("Inference: distill_kl breached while rewards stay within threshold: suspect the teacher "
                   "path (teacher endpoints, sampled tokens sent to the teachers, distillation loss).")
    if suite == "opd" and failed_metrics == {REWARDS}:
        out.append("Inference: only rewards drift: suspect rollout or the judger (reward function, answer "
                   "parsing), not distillation.")

    early, gradual = [], []
    for metric in sorted(failed_metrics):
        first = _first_breach(metric, accuracy)
        start = _first_compared(metric, checks, first_steps)
        if first is None or start is None:
            continue
        (early if first <= start else gradual).append((metric, first))
    if early:
        out.append("Inference: " + _names(m for m, _ in early) + " already off at the first compared step "
                   f"({', '.join(f'{m}: step {s}' for m, s in early)}): points to initialisation or config "
                   "differences (weight mapping, seed, data order), not the training loop.")
    if gradual:
        out.append("Inference: " + _names(m for m, _ in gradual) + " diverge gradually (first breach "
                   f"{', '.join(f'{m}: step {s}' for m, s in gradual)}): points to the training loop "
                   "(loss, advantage, KL, weight sync).")
    timing = [c for c in failed if c.metric in TIMING_METRICS]
    if timing:
        out.append(f"Inference: {_names(c.metric for c in timing)} over budget: a slowdown in the code under "
                   "test or a contended/slow node; compare time/step against the baseline and check the node "
                   "before calling it a regression.")
    if not out:
        out.append("Inference: the verdict is FAIL; read the failing rows of the metric table and the "
                   "abnormal findings above.")
    return out
