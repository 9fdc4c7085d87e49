"""The confirmation rule: is one run's FAIL a regression, or noise? (issue 21; pure, no Airflow).

Every run keeps its own verdict by the runbook's thresholds. Above it, a suite whose first run FAILs
only on breaches that run-to-run noise can produce is repeated at the same commit with a new seed,
within a budget of extra runs, and the verification ends in one of three outcomes, by this
pre-registered rule (its error rates are measured by ``scripts/bench_confirmation.py``):

* **Repeatable.** The first run's FAIL is of the accuracy class, its breaches are point comparisons
  whose run-to-run spread is known (``Spread``, from the baseline version's provenance), none is
  NaN/Infinity and none lies farther than ``Rule.z_far`` standard deviations from the reference.
  Anything else (a NaN, a wrong step count, a crash, a stall, a log rule, an infrastructure or a
  performance failure, a breach far outside the noise) is FAIL at once.
* **The evidence.** For each metric the first run breached, the group of its judged points from its
  first breached step on, with the sign of that first breach. After each repeat, each point's mean
  over the repeats (the first run is left out: it was selected for being extreme) is scaled by its
  standard error under "no shift", ``sigma * sqrt(1/k + 1/N)`` (k repeats; the reference is itself an
  N-run mean whose error every repeat shares, so repeats never remove it), and the group's z is the
  Stouffer sum of its points, ``sum(sign * mean / se) / sqrt(points)``.
* **FAIL (reproduced)** as soon as a group's z reaches ``z_reproduce`` (one-sided p <= 0.005);
  **PASS (not reproduced)** as soon as every group's z is below ``z_clear``; otherwise another repeat,
  and **INCONCLUSIVE** when the budget is spent, naming what would settle it.
* **No spread known** (a baseline version that records none, or an engine whose verdict is not a set
  of point comparisons, e.g. the checker's p80 aggregates): one repeat; FAIL (reproduced) when it
  breaches one of the same metrics with the same sign, else PASS (not reproduced).

The estimates a report states (the chance that a healthy run breaches each metric, the false alarm
after confirmation, the smallest shift detected with 90% probability) assume normal, independent
noise with the spread given, at every judged point; SciPy gives the normal tails, a seeded Monte Carlo
through :func:`decide` itself the rates of the whole procedure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

#: The outcomes of a verification's suite.
PASS, FAIL = "PASS", "FAIL"
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "FAIL (reproduced)", "PASS (not reproduced)", "INCONCLUSIVE"
#: Outcomes that fail the DAG run (with infrastructure failures, which are FAIL).
FAILING = (FAIL, REPRODUCED)


@dataclass(frozen=True)
class Point:
    """One judged comparison of one run: ``diff`` = current - reference (relative methods: divided by
    |reference|), in the unit of ``threshold``."""

    metric: str
    step: int
    diff: float
    threshold: float
    breached: bool


@dataclass(frozen=True)
class Spread:
    """The run-to-run spread the rule judges against: ``sigma`` per metric (in the unit of its points'
    diffs), ``runs`` the N the reference is the mean of, ``source`` where it comes from."""

    sigma: Mapping[str, float]
    runs: int
    source: str


@dataclass(frozen=True)
class Rule:
    """The pre-registered parameters (``scripts/bench_confirmation.py`` measures their error rates)."""

    z_reproduce: float = 2.576   # one-sided p <= 0.005
    z_clear: float = 1.645       # one-sided p ~ 0.05: the repeats show no shift in the breach's direction
    z_far: float = 10.0          # a breach this many sigma away is no noise: FAIL at once
    budget: int = 2              # extra runs at most

    def describe(self) -> str:
        return (f"repeat a FAIL that noise can produce (accuracy class, no NaN, every breach within {self.z_far:g} "
                f"sigma) up to {self.budget} time(s); per breached metric, the Stouffer z of its points from its "
                f"first breach on, over the repeats' means against the run-to-run spread and the reference's "
                f"own error: FAIL (reproduced) at z >= {self.z_reproduce:g}, PASS (not reproduced) when every "
                f"metric's z < {self.z_clear:g}, else another repeat, INCONCLUSIVE when the budget is spent")


@dataclass
class RunPoints:
    """What the rule needs of one run: its runbook verdict and class, its judged points, and why it
    cannot be repeated if it cannot (a NaN, a wrong step count...)."""

    verdict: str
    failure_class: str | None
    points: list[Point] = field(default_factory=list)
    #: Breached metrics the run's verdict names, with the sign of the breach (when no points are known).
    breached: dict[str, int] = field(default_factory=dict)
    not_repeatable: list[str] = field(default_factory=list)


@dataclass
class Decision:
    """``outcome`` (None: run another), the words that say why, and each breached metric's evidence."""

    outcome: str | None
    reason: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    rule: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- the rule

def _sign(value: float) -> int:
    return 1 if value > 0 else -1 if value < 0 else 0


def repeatable(first: RunPoints, spread: Spread | None, rule: Rule) -> list[str]:
    """Why the first run's FAIL cannot be noise ([] when it can be repeated)."""
    if first.verdict == PASS:
        return ["the run passed"]
    out = list(first.not_repeatable)
    if first.failure_class != "accuracy":
        out.append(f"a FAIL of the {first.failure_class or 'unknown'} class, not the accuracy class")
    for p in first.points:
        if not p.breached:
            continue
        if not math.isfinite(p.diff):
            out.append(f"{p.metric} is not finite at step {p.step}")
        elif spread is not None and p.metric in spread.sigma:
            z = abs(p.diff) / (spread.sigma[p.metric] * math.sqrt(1 + 1 / spread.runs))
            if z > rule.z_far:
                out.append(f"{p.metric} at step {p.step} is {z:.0f} sigma from its reference (more than "
                           f"{rule.z_far:g}: no noise reaches it)")
    if not first.points and not first.breached:
        out.append("no breached metric is named")
    return out


def _groups(first: RunPoints, spread: Spread) -> list[tuple[str, int, list[int]]]:
    """(metric, sign, steps): per breached metric, its points from its first breached step on."""
    out = []
    for metric in dict.fromkeys(p.metric for p in first.points if p.breached):
        mine = sorted((p for p in first.points if p.metric == metric), key=lambda p: p.step)
        first_breach = next(p for p in mine if p.breached)
        out.append((metric, _sign(first_breach.diff), [p.step for p in mine if p.step >= first_breach.step]))
    return out


def _group_z(metric: str, sign: int, steps: list[int], repeats: Sequence[RunPoints],
             spread: Spread) -> tuple[float | None, int]:
    """The Stouffer z of one group over the repeats (None when no repeat reached its points), and how
    many points it is over."""
    sigma, n = spread.sigma[metric], spread.runs
    terms = []
    for step in steps:
        values = [p.diff for r in repeats for p in r.points if p.metric == metric and p.step == step
                  and math.isfinite(p.diff)]
        if values:
            se = sigma * math.sqrt(1 / len(values) + 1 / n)
            terms.append(sign * (sum(values) / len(values)) / se)
    if not terms:
        return None, 0
    return sum(terms) / math.sqrt(len(terms)), len(terms)


def decide(first: RunPoints, repeats: Sequence[RunPoints], spread: Spread | None, rule: Rule = Rule(),
           budget: int | None = None) -> Decision:
    """The outcome of a suite after its first run and ``repeats`` so far, or ``outcome=None`` when
    another repeat is needed (and allowed by ``budget``, default ``rule.budget``)."""
    budget = rule.budget if budget is None else budget
    text = rule.describe()
    if first.verdict == PASS:
        return Decision(PASS, "the first run passed: nothing to confirm", rule=text)
    reasons = repeatable(first, spread, rule)
    if reasons:
        return Decision(FAIL, "not repeated: " + "; ".join(reasons), rule=text)
    if budget <= 0:
        return Decision(FAIL, "not repeated: the budget of extra runs is 0", rule=text)
    broken = [k for k, r in enumerate(repeats, 1) if r.verdict != PASS and r.failure_class == "infrastructure"]
    if broken:
        return Decision(FAIL, f"repeat {broken[0]} failed as infrastructure (see its report): no verdict on the "
                        "first run's breach", rule=text)
    known = spread is not None and first.points and all(
        p.metric in spread.sigma for p in first.points if p.breached)
    if not known:
        return _decide_without_spread(first, repeats, spread, text)
    assert spread is not None
    if not repeats:
        return Decision(None, "the first run's FAIL could be noise: repeat it", rule=text)
    evidence, undecided = [], []
    for metric, sign, steps in _groups(first, spread):
        z, count = _group_z(metric, sign, steps, repeats, spread)
        evidence.append({"metric": metric, "direction": "up" if sign > 0 else "down", "steps": steps,
                         "points_seen": count, "z": None if z is None else round(z, 3), "repeats": len(repeats)})
        if z is not None and z >= rule.z_reproduce:
            return Decision(REPRODUCED, f"{metric} is {'above' if sign > 0 else 'below'} its reference again: over "
                            f"{len(repeats)} repeat(s) and {count} point(s) from step {steps[0]} on, z = {z:.2f} "
                            f">= {rule.z_reproduce:g}", evidence, text)
        if z is None or z >= rule.z_clear:
            undecided.append((metric, z))
    if not undecided:
        said = ", ".join(f"{e['metric']} z = {e['z']:.2f}" for e in evidence)
        return Decision(NOT_REPRODUCED, f"the first run's breach reads as noise: over {len(repeats)} repeat(s) no "
                        f"breached metric shifts in its direction ({said}; every z < {rule.z_clear:g})", evidence,
                        text)
    if len(repeats) < budget:
        return Decision(None, "undecided after {} repeat(s): {}; another repeat".format(
            len(repeats), ", ".join(f"{m} z = {'n/a' if z is None else f'{z:.2f}'}" for m, z in undecided)),
            evidence, text)
    settle = "; ".join(f"{m}: z = {'n/a' if z is None else f'{z:.2f}'} lies between {rule.z_clear:g} and "
                       f"{rule.z_reproduce:g}" for m, z in undecided)
    return Decision(INCONCLUSIVE, f"the budget of {budget} extra run(s) is spent and {settle}. What would settle it: "
                    "more runs of this commit (trigger it again with a larger 'repeats'), or a baseline version "
                    "calibrated from more runs (its own error is shared by every repeat)", evidence, text)


def _decide_without_spread(first: RunPoints, repeats: Sequence[RunPoints], spread: Spread | None,
                           text: str) -> Decision:
    why = "the baseline version records no run-to-run spread" if spread is None else \
        "the spread of a breached metric is not known"
    breached = first.breached or {p.metric: _sign(p.diff) for p in first.points if p.breached}
    if not repeats:
        return Decision(None, f"{why}: one repeat decides (the same metric breaching in the same direction)",
                        rule=text)
    again = repeats[0]
    seen = again.breached or {p.metric: _sign(p.diff) for p in again.points if p.breached}
    same = sorted(m for m, s in breached.items() if m in seen and (seen[m] == s or 0 in (s, seen[m])))
    if same:
        return Decision(REPRODUCED, f"{why}; the repeat breaches again: {', '.join(same)}", rule=text)
    return Decision(NOT_REPRODUCED, f"{why}; the repeat does not breach {', '.join(sorted(breached))} again",
                    rule=text)


# ----------------------------------------------------------------------------- what a report states

def healthy_breach_rate(sigma: float, threshold: float, points: int, runs: int) -> float:
    """The chance that a healthy run breaches a metric at one of its ``points`` (normal, independent noise;
    the reference an N-run mean, so a difference has variance sigma^2 (1 + 1/N))."""
    from scipy.stats import norm  # kept out of DAG parsing

    if sigma <= 0:
        return 0.0
    inside = 2 * norm.cdf(threshold / (sigma * math.sqrt(1 + 1 / runs))) - 1
    return float(1 - inside ** points)


@lru_cache(maxsize=64)
def max_dev_factor(runs: int, points: int, samples: int = 100_000) -> float:
    """E[max over ``points`` points and ``runs`` runs of |x - mean of the runs|] for unit normal noise: the
    factor between a measured max deviation and sigma (runbook's N=3: 1.61 at 5 points, 1.68 at 6)."""
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(20261026)
    x = rng.standard_normal((samples, points, runs))
    dev = np.abs(x - x.mean(axis=2, keepdims=True)).max(axis=(1, 2))
    return float(dev.mean())


def sigma_from_max_dev(max_dev: float, runs: int, points: int) -> float:
    """The sigma a measured max run-to-run deviation over ``runs`` runs and ``points`` points means."""
    return max_dev / max_dev_factor(runs, max(1, points))


@dataclass(frozen=True)
class Layout:
    """Where a suite is judged: per metric its threshold and the steps of its points (a run's judged
    points); what the simulated estimates need besides the spread."""

    thresholds: Mapping[str, float]
    steps: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, points: Iterable[Point]) -> "Layout":
        thresholds: dict[str, float] = {}
        steps: dict[str, list[int]] = {}
        for p in points:
            thresholds[p.metric] = p.threshold
            steps.setdefault(p.metric, []).append(p.step)
        return cls(thresholds, {m: tuple(sorted(s)) for m, s in steps.items()})


def simulate(layout: Layout, spread: Spread, rule: Rule = Rule(), shift: Mapping[str, float] | None = None,
             samples: int = 2000, seed: int = 0, budget: int | None = None) -> dict[str, float]:
    """Outcome rates and mean runs of the whole procedure (:func:`decide` itself) on simulated runs: normal,
    independent noise with ``spread``, the reference's own N-run error drawn once per verification, and
    ``shift`` (metric -> a constant shift at every point) added to every run."""
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(seed)
    metrics = [m for m in layout.thresholds if m in spread.sigma]
    keys = [(m, s) for m in metrics for s in layout.steps[m]]
    sig = np.array([spread.sigma[m] for m, _ in keys])
    delta = np.array([(shift or {}).get(m, 0.0) for m, _ in keys])
    thr = np.array([layout.thresholds[m] for m, _ in keys])
    counts = {REPRODUCED: 0, NOT_REPRODUCED: 0, INCONCLUSIVE: 0, PASS: 0, FAIL: 0}
    runs_used = 0
    limit = rule.budget if budget is None else budget
    for _ in range(samples):
        reference_error = rng.normal(0, sig / math.sqrt(spread.runs))

        def run() -> RunPoints:
            d = rng.normal(0, sig) - reference_error + delta
            pts = [Point(m, s, float(v), float(t), bool(abs(v) >= t)) for (m, s), v, t in zip(keys, d, thr)]
            failed = any(p.breached for p in pts)
            return RunPoints(FAIL if failed else PASS, "accuracy" if failed else None, pts)

        first, repeats = run(), []
        while True:
            decision = decide(first, repeats, spread, rule, limit)
            if decision.outcome is not None:
                break
            repeats.append(run())
        counts[decision.outcome] += 1
        runs_used += 1 + len(repeats)
    out = {k: v / samples for k, v in counts.items()}
    out["runs"] = runs_used / samples
    out["detected"] = out[REPRODUCED] + out[FAIL]
    return out


def minimum_detectable_shift(layout: Layout, spread: Spread, metric: str, rule: Rule = Rule(),
                             power: float = 0.9, samples: int = 600, budget: int | None = None) -> float | None:
    """The smallest constant shift of ``metric`` (at all its points, in its unit) that the whole procedure
    reports as a FAIL with probability ``power``; None when the metric's spread is unknown."""
    if metric not in spread.sigma:
        return None
    low, high = 0.0, 2.0 * layout.thresholds[metric]
    for _ in range(9):  # bisection to ~0.4% of twice the threshold
        mid = (low + high) / 2
        rate = simulate(layout, spread, rule, {metric: mid}, samples, seed=7, budget=budget)["detected"]
        low, high = (low, mid) if rate >= power else (mid, high)
    return high
