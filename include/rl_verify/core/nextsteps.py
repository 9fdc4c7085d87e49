"""Runbook section 3 ("Interpreting results") as code, applied by the shape of each breach.

Every string returned starts with "Inference:" because it is a reading of the measurements, not a
measurement, and states the shape it reads ("jump at step 10, stays outside"). Runbook rules are
applied only to the breaches they describe:

* outside its bound at step 1 / the first eval point (``from-start``) -> initialisation or config
  (weight mapping, seed, data order), not the training loop;
* grows into its bound and stays there (``gradual``) -> the training loop (loss, advantage, KL,
  weight sync);
* ``mismatch/mismatch_k3_kl`` breach (any shape) -> train/inference consistency (logprob path,
  weight update, rollout backend), listed first for GRPO;
* OPD ``distill_kl`` breach with healthy rewards -> teacher path (teacher endpoints, sampled tokens,
  distillation loss); rewards-only drift -> rollout/judger, not distillation.

Shapes no runbook rule describes (a jump that stays, an isolated point, an intermittent breach,
NaN/Infinity, a metric compared at one point only) get a suggestion of their own, marked as not
coming from the runbook. Performance failures (only time checks) name both readings: a slower
commit and a slow or contended node, with the observed step times. Infrastructure failures say
that no metric was judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rl_verify.core.model import INFRASTRUCTURE, STEP_COUNT, TIMING_METRICS, Check, infrastructure_steps
from rl_verify.core.shapes import ComparedPoint, Shape, classify

MISMATCH = "mismatch/mismatch_k3_kl"
DISTILL_KL = "distillation/reduced_distillation_kl"
REWARDS = "response/rewards/mean"


@dataclass(frozen=True)
class EngineRules:
    """The engine-specific rules of runbook section 3 that apply to a suite (its engine passes them)."""

    #: GRPO: a mismatch/mismatch_k3_kl breach is looked at before anything else.
    mismatch_first: bool = False
    #: OPD: distill_kl vs rewards tells the teacher path from rollout/the judger.
    distillation: bool = False


GRPO_RULES = EngineRules(mismatch_first=True)
OPD_RULES = EngineRules(distillation=True)


def pass_steps() -> list[str]:
    """The single line shown on PASS."""
    return ["Inference: no action needed; every checked metric is within its threshold."]


def _names(metrics: Iterable[str]) -> str:
    return ", ".join(sorted(set(metrics)))


def shape_of(metric: str, checks: list[Check]) -> Shape | None:
    """The breach shape of ``metric``: as the engine recorded it, else read from its per-point rows."""
    for c in checks:
        if c.metric == metric and c.breached and c.shape:
            return Shape(c.shape, c.first_breach_step if c.first_breach_step is not None else -1, c.shape_text)
    points = [ComparedPoint(c.step, c.current, c.error, c.breached) for c in checks
              if c.metric == metric and c.step is not None and c.passed is not None and not c.missing]
    threshold = next((c.threshold for c in checks if c.metric == metric and c.threshold is not None), None)
    return classify(points, threshold)


def _said(shapes: Mapping[str, Shape | None], metrics: Iterable[str]) -> str:
    return "; ".join(f"{m}: {shapes[m].text}" if shapes.get(m) else f"{m}: shape not known"
                     for m in sorted(set(metrics)))


#: What each breach shape suggests; the two runbook rules are quoted as such, the others say that
#: no runbook rule describes that shape.
SHAPE_RULES = {
    "from-start": "Runbook section 3: a metric already off at step 1 / the first eval point points to initialisation "
                  "or config differences (weight mapping, seed, data order), not the training loop.",
    "gradual": "Runbook section 3: a metric that diverges gradually points to the training loop (loss, advantage, "
               "KL, weight sync).",
    "jump": "No runbook rule describes a jump that stays: look at what happens at that step in the training log (an "
            "epoch or data boundary, an eval, a weight sync or checkpoint reload) and at the commit's changes to it.",
    "isolated": "One point outside its bound says little about its cause (no runbook rule matches a single point): "
                "re-run once to see whether it repeats before bisecting.",
    "intermittent": "An on-and-off breach matches no runbook rule: compare it with the run-to-run spread the "
                    "thresholds were calibrated on (a noisier commit or a noisy node) before bisecting.",
    "non-finite": "The training diverged numerically: read the loss and grad norm in the training log just before "
                  "the first non-finite step.",
    "single-point": "A metric compared at one point has no shape to read; the per-step curves in the plots show "
                    "where the run left the baseline.",
}


def _shape_rule(kind: str, metrics: list[str], shapes: Mapping[str, Shape | None]) -> str | None:
    rule = SHAPE_RULES.get(kind)
    return f"Inference: {_said(shapes, metrics)}. {rule}" if rule else None


def _performance(timing: list[Check], step_times: Mapping[str, Any] | None) -> str:
    observed = []
    for c in timing:
        if c.metric == "e2e wall time" and c.current is not None:
            observed.append(f"e2e wall time {c.current:.0f} s against a budget of {c.operator} {c.threshold:g} s")
        elif c.current is not None and c.baseline is not None:
            at = f" at step {c.step}" if c.step is not None else ""
            observed.append(f"{c.metric} {c.current:.4g} s vs baseline {c.baseline:.4g} s{at}")
    if step_times:
        cur_mean, base_mean = step_times.get("current_mean"), step_times.get("baseline_mean")
        cur_max, max_step = step_times.get("current_max"), step_times.get("current_max_step")
        if cur_mean is not None and base_mean is not None:
            observed.append(f"time/step mean {cur_mean:.4g} s vs baseline {base_mean:.4g} s"
                            + (f", slowest step {max_step} at {cur_max:.4g} s" if cur_max is not None else ""))
    return (f"Inference: {_names(c.metric for c in timing)} over budget ({'; '.join(observed)}). Either the commit "
            "under test is slower, or the node was slow or contended (another job on its GPUs, throttling, a slow "
            "share): re-run on an idle node; if it is still slow, profile the commit.")


def suggest(rules: EngineRules, checks: list[Check], verdict: str, failure_class: str | None = None,
            reason: str = "", step_times: Mapping[str, Any] | None = None) -> list[str]:
    """Next-step suggestions for one suite, each starting with "Inference:".

    ``engine`` ("grpo" or "opd") selects the runbook's engine-specific rules (mismatch first for
    GRPO; the teacher-path and rewards-only readings for OPD).

    ``reason`` is the cause of an infrastructure failure found before any comparison;
    ``step_times`` (current_mean, current_max, current_max_step, baseline_mean) feeds the
    performance suggestion with the observed step times.
    """
    if verdict == "PASS":
        return pass_steps()
    if failure_class == INFRASTRUCTURE and reason:
        return infrastructure_steps(reason)
    failed = [c for c in checks if c.passed is False]
    out: list[str] = []
    step_count = [c for c in failed if c.metric == STEP_COUNT]
    missing = [c for c in failed if c.missing]
    breached = [c for c in failed if c.breached and c.metric != STEP_COUNT]
    accuracy = sorted({c.metric for c in breached if c.metric not in TIMING_METRICS})
    timing = [c for c in breached if c.metric in TIMING_METRICS]
    shapes = {m: shape_of(m, checks) for m in accuracy}

    if step_count:
        c = step_count[0]
        out.append(f"Inference: the current run has {c.current:.0f} RL steps vs {c.baseline:.0f} in the baseline: "
                   "the run stopped early (crash, OOM, killed) or total_epochs/global_batch_size/dataset size "
                   "changed. Read the end of the training log; no metric was judged.")
    if missing:
        where = "; ".join(
            f"{m} at step(s) {', '.join(str(c.step) for c in missing if c.metric == m and c.step is not None) or 'n/a'}"
            for m in sorted({c.metric for c in missing}))
        out.append(f"Inference: not measured ({where}): the run stopped before those points, or the eval interval "
                   "or a metric name changed; read the training log and the config. Missing values are not an "
                   "accuracy signal.")
    if MISMATCH in accuracy:
        out.append(f"Inference: {_said(shapes, [MISMATCH])}. Runbook section 3: a mismatch/mismatch_k3_kl breach "
                   "means train/inference inconsistency: check the logprob path, the weight update/sync into the "
                   "rollout engine and the rollout backend"
                   + (" first, before anything else for GRPO." if rules.mismatch_first else "."))
    if rules.distillation and DISTILL_KL in accuracy and REWARDS not in accuracy:
        out.append(f"Inference: {_said(shapes, [DISTILL_KL])}, rewards within threshold. Runbook section 3: suspect "
                   "the teacher path (teacher endpoints, sampled tokens sent to the teachers, distillation loss).")
    if rules.distillation and accuracy == [REWARDS]:
        out.append(f"Inference: {_said(shapes, [REWARDS])}, only rewards drift. Runbook section 3: suspect rollout "
                   "or the judger (reward function, answer parsing), not distillation.")
    by_kind: dict[str, list[str]] = {}
    for metric in accuracy:
        shape = shapes[metric]
        if shape is not None:
            by_kind.setdefault(shape.kind, []).append(metric)
    # Non-finite first: NaN explains every other reading of the same metric.
    for kind in ("non-finite", "from-start", "gradual", "jump", "intermittent", "isolated", "single-point"):
        if kind in by_kind:
            line = _shape_rule(kind, by_kind[kind], shapes)
            if line:
                out.append(line)
    unknown = [m for m in accuracy if shapes[m] is None]
    if unknown:
        out.append(f"Inference: {_names(unknown)} outside threshold; read the failing rows of the metric table.")
    if timing:
        out.append(_performance(timing, step_times))
    if not out:
        out += infrastructure_steps(reason or "the verdict is FAIL but no check names a metric; see the abnormal "
                                             "findings")
    return out
