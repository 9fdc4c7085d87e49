"""Runbook section 3 ("Interpreting results") as code: one diagnosis per suite, applied by the shape
of each breach.

Every string returned starts with "Inference:" because it is a reading of the measurements, not a
measurement. A FAIL gets exactly one *first* next step, which says what to look at and why (the
rule and the measurements it reads), then the other readings, each marked "secondary". The first
one is chosen in this order, because the runbook's metric rules name a cause whatever the shape:

1. no metric judged (a wrong step count), which makes every other reading moot;
2. the runbook's metric rules: a ``mismatch/mismatch_k3_kl`` breach -> train/inference consistency
   (logprob path, weight update, rollout backend), "check that first" where the engine's rules say so;
   then the engine's own metric rules (``EngineRules.readings``: the opd engine's teacher-path and
   rewards-only readings);
3. the shape rules, read from every compared point of each breached metric: NaN/Infinity (the
   training diverged numerically), outside at step 1 / the first eval point (``from-start``) ->
   initialisation or config (weight mapping, seed, data order), growing into the bound (``gradual``)
   -> the training loop (loss, advantage, KL, weight sync); then the shapes no runbook rule
   describes (a jump that stays, an intermittent or isolated breach, a metric compared at one
   point), each marked as not coming from the runbook;
4. values not measured (an infrastructure problem, never a breach);
5. time checks only (performance): a slower commit or a slow or contended node, with the observed
   step times.

Metrics of one family that breach with one shape are read together (one line), so a regression
that moves distill_kl and abs_loss at the same eval point gets one reading, not two. Infrastructure
failures say that no metric was judged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rl_verify.core.model import INFRASTRUCTURE, STEP_COUNT, TIMING_METRICS, Check, infrastructure_steps
from rl_verify.core.numbers import duration
from rl_verify.core.shapes import ComparedPoint, Shape, classify

MISMATCH = "mismatch/mismatch_k3_kl"


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


def said(shapes: Mapping[str, Shape | None], metrics: Iterable[str]) -> str:
    return "; ".join(f"{m}: {shapes[m].text}" if shapes.get(m) else f"{m}: shape not known"
                     for m in sorted(set(metrics)))


#: What each breach shape suggests: (what to look at, why). The two runbook rules are quoted as such;
#: the others say that no runbook rule describes that shape.
SHAPE_RULES = {
    "non-finite": ("read the loss and grad norm in the training log just before the first non-finite step",
                   "the training diverged numerically (a NaN/Infinity makes every other reading of the metric moot)"),
    "from-start": ("look at initialisation or config differences (weight mapping, seed, data order), not the training "
                   "loop", "runbook section 3: a metric already off at step 1 / the first eval point points to "
                           "initialisation or config"),
    "gradual": ("look at the training loop (loss, advantage, KL, weight sync)",
                "runbook section 3: a metric that diverges gradually points to the training loop"),
    "jump": ("look at what happens at that step in the training log (an epoch or data boundary, an eval, a weight "
             "sync or checkpoint reload) and at the commit's changes to it",
             "no runbook rule describes a jump that stays"),
    "intermittent": ("compare it with the run-to-run spread the thresholds were calibrated on (a noisier commit or a "
                     "noisy node) before bisecting", "an on-and-off breach matches no runbook rule"),
    "isolated": ("re-run once to see whether it repeats before bisecting",
                 "one point outside its bound says little about its cause (no runbook rule matches a single point)"),
    "single-point": ("read the per-step curves in the plots to see where the run left the baseline",
                     "a metric compared at one point has no shape to read"),
}
#: The order in which shapes are read: a NaN first (it explains every other reading of its metric), then
#: the runbook's two shape rules, then the shapes no runbook rule describes.
SHAPE_ORDER = ("non-finite", "from-start", "gradual", "jump", "intermittent", "isolated", "single-point")


@dataclass(frozen=True)
class Reading:
    """One candidate next step: what to look at, why (the rule), and the measurements it reads."""

    action: str
    why: str
    evidence: str

    def first(self) -> str:
        return f"Inference: first, {self.action}. Why: {self.why}; {self.evidence}."

    def secondary(self) -> str:
        return f"Inference: secondary: {self.evidence}. {_capital(self.why)}: {self.action}."


#: An engine's own metric rules: (the breached accuracy metrics, sorted; their shapes) -> its readings.
MetricRules = Callable[[list[str], Mapping[str, Shape | None]], list[Reading]]


@dataclass(frozen=True)
class EngineRules:
    """The engine-specific rules of runbook section 3 that apply to a suite (its engine passes them)."""

    #: A mismatch/mismatch_k3_kl breach is looked at before anything else (GRPO).
    mismatch_first: bool = False
    #: The engine's own metric rules, read right after the mismatch rule and before the shape rules (OPD:
    #: distill_kl vs rewards tells the teacher path from rollout/the judger); None: it has none.
    readings: MetricRules | None = None


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def family(metric: str) -> str:
    """The family a metric belongs to (``distillation/...``, ``eval/...``): what one reading groups."""
    return metric.split("/", 1)[0] if "/" in metric else metric


def _shape_readings(metrics: list[str], shapes: Mapping[str, Shape | None]) -> list[Reading]:
    """One reading per (shape, family) among ``metrics``, in ``SHAPE_ORDER``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for metric in metrics:
        shape = shapes.get(metric)
        if shape is not None:
            groups.setdefault((shape.kind, family(metric)), []).append(metric)
    out = []
    for kind in SHAPE_ORDER:
        for (k, _), names in groups.items():
            if k == kind and kind in SHAPE_RULES:
                action, why = SHAPE_RULES[kind]
                out.append(Reading(action, why, said(shapes, names)))
    return out


def _performance(timing: list[Check], step_times: Mapping[str, Any] | None) -> Reading:
    observed = []
    for c in timing:
        if c.metric == "e2e wall time" and c.current is not None and c.threshold is not None:
            observed.append(f"e2e wall time {duration(c.current)} against a budget of {c.operator} "
                            f"{duration(c.threshold)}")
        elif c.current is not None and c.baseline is not None:
            at = f" at step {c.step}" if c.step is not None else ""
            observed.append(f"{c.metric} {c.current:.4g} s vs baseline {c.baseline:.4g} s{at}")
    if step_times:
        cur_mean, base_mean = step_times.get("current_mean"), step_times.get("baseline_mean")
        cur_max, max_step = step_times.get("current_max"), step_times.get("current_max_step")
        if cur_mean is not None and base_mean is not None:
            observed.append(f"time/step mean {cur_mean:.4g} s vs baseline {base_mean:.4g} s"
                            + (f", slowest step {max_step} at {cur_max:.4g} s" if cur_max is not None else ""))
    return Reading("re-run on an idle node; if it is still slow, profile the commit",
                   "either the commit under test is slower, or the node was slow or contended (another job on its "
                   "GPUs, throttling, a slow share)",
                   f"{_names(c.metric for c in timing)} over budget ({'; '.join(observed)})")


def suggest(rules: EngineRules, checks: list[Check], verdict: str, failure_class: str | None = None,
            reason: str = "", step_times: Mapping[str, Any] | None = None) -> list[str]:
    """Next-step suggestions for one suite, each starting with "Inference:".

    ``rules`` (the engine's) selects the runbook's engine-specific rules (mismatch first for GRPO; the
    engine's own metric readings, such as OPD's teacher-path and rewards-only ones). The first line is the
    one first next step, with its reason; the others are marked "secondary".

    ``reason`` is the cause of an infrastructure failure found before any comparison;
    ``step_times`` (current_mean, current_max, current_max_step, baseline_mean) feeds the
    performance suggestion with the observed step times.
    """
    if verdict == "PASS":
        return pass_steps()
    if failure_class == INFRASTRUCTURE and reason:
        return infrastructure_steps(reason)
    readings = diagnosis(rules, checks, step_times)
    if not readings:
        return infrastructure_steps(reason or "the verdict is FAIL but no check names a metric; see the abnormal "
                                             "findings")
    return [readings[0].first()] + [r.secondary() for r in readings[1:]]


def diagnosis(rules: EngineRules, checks: list[Check], step_times: Mapping[str, Any] | None = None) -> list[Reading]:
    """Every reading of a FAIL's checks, the one to act on first at the head (module docstring's order)."""
    failed = [c for c in checks if c.passed is False]
    step_count = [c for c in failed if c.metric == STEP_COUNT]
    missing = [c for c in failed if c.missing]
    breached = [c for c in failed if c.breached and c.metric != STEP_COUNT]
    accuracy = sorted({c.metric for c in breached if c.metric not in TIMING_METRICS})
    timing = [c for c in breached if c.metric in TIMING_METRICS]
    shapes = {m: shape_of(m, checks) for m in accuracy}
    out: list[Reading] = []
    if step_count:
        c = step_count[0]
        out.append(Reading("read the end of the training log: the run stopped early (crash, OOM, killed) or "
                           "total_epochs/global_batch_size/dataset size changed",
                           "no metric was judged",
                           f"the current run has {c.current:.0f} RL steps vs {c.baseline:.0f} in the baseline"))
    out += _metric_readings(rules, accuracy, shapes)
    out += _shape_readings(accuracy, shapes)
    unknown = [m for m in accuracy if shapes[m] is None]
    if unknown:
        out.append(Reading("read the failing rows of the metric table", "no shape could be read",
                           f"{_names(unknown)} outside threshold"))
    if missing:
        where = "; ".join(
            f"{m} at step(s) {', '.join(str(c.step) for c in missing if c.metric == m and c.step is not None) or 'n/a'}"
            for m in sorted({c.metric for c in missing}))
        out.append(Reading("read the training log and the config: the run stopped before those points, or the eval "
                           "interval or a metric name changed", "missing values are not an accuracy signal",
                           f"not measured ({where})"))
    if timing:
        out.append(_performance(timing, step_times))
    return out


def family_too(metric: str, accuracy: list[str], shapes: Mapping[str, Shape | None]) -> str:
    """"; distillation/reduced_distillation_abs_loss breached the same way": the other breached metrics of
    ``metric``'s family, which the same reading explains ("" when none)."""
    same = [m for m in accuracy if m != metric and family(m) == family(metric)]
    if not same:
        return ""
    kind = shapes[metric].kind if shapes.get(metric) else None
    alike = [m for m in same if shapes.get(m) and shapes[m].kind == kind]  # type: ignore[union-attr]
    other = [m for m in same if m not in alike]
    parts = [f"{_names(alike)} breached the same way"] if alike else []
    parts += [f"{m}: {shapes[m].text}" if shapes.get(m) else f"{m} breached" for m in other]  # type: ignore[union-attr]
    return "; " + "; ".join(parts)


def _metric_readings(rules: EngineRules, accuracy: list[str], shapes: Mapping[str, Shape | None]) -> list[Reading]:
    """The runbook's metric rules that apply (they win over the shape rules: they name a cause)."""
    out = []
    if MISMATCH in accuracy:
        out.append(Reading("check train/inference consistency: the logprob path, the weight update/sync into the "
                           "rollout engine and the rollout backend",
                           "runbook section 3: a mismatch/mismatch_k3_kl breach means train/inference inconsistency"
                           + (", check that first for GRPO failures, before anything else" if rules.mismatch_first
                              else ""),
                           said(shapes, [MISMATCH])))
    if rules.readings is not None:
        out += rules.readings(accuracy, shapes)
    return out
