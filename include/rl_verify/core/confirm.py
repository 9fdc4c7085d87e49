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
* **The evidence.** Every judged metric whose spread is known, over the repeats only (the first run is
  left out: it was selected for being extreme; it may also have been stopped early on whatever metric
  breached first, which need not be the one a regression moved). Each point's mean over the repeats is
  scaled by its standard error under "no shift", ``sigma * sqrt(1/k + 1/N)`` (k repeats; the reference
  is itself an N-run mean whose error every repeat shares, so repeats never remove it), and a metric's
  z is the Stouffer sum of its points, ``sum(mean / se) / sqrt(points)``, two-sided (an absolute
  tolerance is broken either way).
* **FAIL (reproduced)** as soon as a metric's |z|, or one of its points' (the repeats' mean there over its
  standard error), reaches its Sidak-corrected bound: ``p_reproduce`` (0.01, family-wise, two-sided) is
  split in two, half over the M metrics' Stouffer z (3.34 for OPD's six), half over their points (6 each:
  3.81). **PASS (not reproduced)** when a repeat ran to its end and every metric's |z| is below the bound
  of ``p_clear`` (0.05: 2.63 for six); otherwise another repeat, and **INCONCLUSIVE** when the budget is
  spent, naming what would settle it. A repeat is stopped early only by a certain FAIL of one point that
  alone reaches the point bound (:func:`stop_early`): then the outcome is known.
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
from statistics import NormalDist
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

#: The outcomes of a verification's suite.
PASS, FAIL = "PASS", "FAIL"
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "FAIL (reproduced)", "PASS (not reproduced)", "INCONCLUSIVE"
#: Outcomes that fail the DAG run (with infrastructure failures, which are FAIL).
FAILING = (FAIL, REPRODUCED)
#: The unit normal distribution. The standard library's (exact to double precision for these tails) rather
#: than SciPy's: every repeat gate and confirmation task would import scipy.stats (seconds on a busy core).
_NORMAL = NormalDist()


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
    diffs), ``runs`` the N the reference is the mean of, ``source`` where it comes from.

    ``df``: per metric, the degrees of freedom of its sigma, i.e. how many independent squared deviations
    the estimate rests on (``core.spread``). The rule's bounds are then Student-t's, so a thin estimate
    asks for more evidence instead of crying wolf; a metric not in ``df`` has a sigma taken as exact
    (normal bounds). ``sources`` and ``drift`` say, in words, what it was learned from and which metrics'
    learned spread left the prior's plausible range (``core.spread.learn``)."""

    sigma: Mapping[str, float]
    runs: int
    source: str
    df: Mapping[str, float] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    prior_sigma: Mapping[str, float] = field(default_factory=dict)
    drift: tuple[str, ...] = ()
    #: The most judged points of one metric when the engine's differs from :class:`Rule`'s default (GRPO: one
    #: per training step); the single-point bound is Sidak over that many points per metric.
    points_per_metric: int | None = None
    #: Per metric, the correlation of its noise at two neighbouring judged points (issue 51: a run's deviation
    #: persists from step to step). Points k of the metric's spacings apart correlate by correlation^k (AR(1));
    #: a metric not here is taken as independent from point to point (``core.spread.learn`` learns it).
    correlation: Mapping[str, float] = field(default_factory=dict)

    def df_of(self, metric: str) -> float:
        """The degrees of freedom of ``metric``'s sigma (infinity: taken as exact), rounded to 0.1 (the
        bounds are cached per value)."""
        df = self.df.get(metric)
        return math.inf if df is None or not math.isfinite(df) else max(1.0, round(float(df), 1))


@dataclass(frozen=True)
class Rule:
    """The pre-registered parameters (``scripts/bench_confirmation.py`` measures their error rates)."""

    p_reproduce: float = 0.01    # family-wise, two-sided: a healthy verification's chance per decision
    p_clear: float = 0.05        # family-wise: below its bound every metric reads as noise
    z_far: float = 10.0          # a breach this many sigma away is no noise: FAIL at once
    budget: int = 2              # extra runs at most
    points_per_metric: int = 6   # the most judged points of one metric (OPD: eval points 0, 5, ..., 25)

    def z_reproduce(self, metrics: int, df: float = math.inf) -> float:
        """|z| from which one of ``metrics`` metrics' Stouffer z reproduces the FAIL (Sidak, two-sided; half
        of ``p_reproduce``, the other half is the single points'); Student-t with ``df`` when the sigma is
        an estimate on ``df`` degrees of freedom."""
        return _two_sided_bound(self.p_reproduce / 2, metrics, df)

    def z_point(self, metrics: int, df: float = math.inf) -> float:
        """|z| from which one point alone reproduces the FAIL (Sidak over every point of ``metrics`` metrics;
        the other half of ``p_reproduce``): what lets a repeat stop at its first such point."""
        return _two_sided_bound(self.p_reproduce / 2, metrics * self.points_per_metric, df)

    def z_clear(self, metrics: int, df: float = math.inf) -> float:
        """|z| below which every one of ``metrics`` metrics reads as noise (Sidak, two-sided). Normal whatever
        ``df``: not knowing the spread well must never make clearing a FAIL easier (a Student-t bound would:
        it widens); it only makes reproducing one harder, and the runs between the two bounds ask for more
        evidence (another repeat, INCONCLUSIVE at the budget)."""
        return _two_sided_bound(self.p_clear, metrics)

    def describe(self) -> str:
        return (f"repeat a FAIL that noise can produce (accuracy class, no NaN, every breach within {self.z_far:g} "
                f"sigma) up to {self.budget} time(s); per judged metric, the two-sided Stouffer z of its points over "
                f"the repeats' means against the run-to-run spread and the reference's own error: FAIL (reproduced) "
                f"when one |z|, or one point's, reaches its Sidak bound (p = {self.p_reproduce:g} over the metrics "
                f"and their points, split in two), PASS (not "
                f"reproduced) when a repeat ran to its end and every |z| is below the bound of p = {self.p_clear:g}, "
                f"else another repeat, INCONCLUSIVE when the budget is spent")


@lru_cache(maxsize=1024)
def _two_sided_bound(p: float, metrics: int, df: float = math.inf) -> float:
    per_test = 1 - (1 - p) ** (1 / max(1, metrics))
    if not math.isfinite(df):
        return -_NORMAL.inv_cdf(per_test / 2)
    from scipy.stats import t  # only for an estimated sigma (kept out of DAG parsing)

    return float(-t.ppf(per_test / 2, df))


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
    #: False when the run was stopped before its last step (early abort): it cannot clear a FAIL.
    complete: bool = True


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


def _rule_for(rule: Rule, spread: Spread | None) -> Rule:
    """``rule`` with the spread's own count of points per metric, when it states one."""
    if spread is None or not spread.points_per_metric or spread.points_per_metric == rule.points_per_metric:
        return rule
    return replace(rule, points_per_metric=int(spread.points_per_metric))


def _tested(spread: Spread) -> list[str]:
    """The metrics the repeats are judged on: every judged metric whose spread is known (fixed in advance, so
    that the bound does not depend on where the first run happened to stop)."""
    return sorted(spread.sigma)


def sum_variance(steps: Sequence[int], correlation: float) -> float:
    """The variance of the sum of unit-variance terms at ``steps`` whose correlation is ``correlation`` ** k for
    terms k of the smallest spacing apart (AR(1)); ``len(steps)`` when independent (issue 51)."""
    n = len(steps)
    if n < 2 or not correlation:
        return float(n)
    rho = min(max(float(correlation), -0.999), 0.999)
    ordered = sorted(steps)
    gaps = [b - a for a, b in zip(ordered, ordered[1:])]
    unit = max(1, min(gaps))
    if all(g == unit for g in gaps):  # evenly spaced: n + 2 sum_k (n - k) rho^k
        return n + 2.0 * sum((n - k) * rho ** k for k in range(1, n))
    return sum(rho ** (abs(a - b) / unit) for a in ordered for b in ordered)


def _metric_z(metric: str, repeats: Sequence[RunPoints], spread: Spread) -> tuple[float | None, list[int], float]:
    """The Stouffer z of one metric over the repeats' means at each point (None when no repeat has a point
    of it), the steps it is over, and its largest point |z|. The sum of the points' z is scaled by its own
    standard deviation: sqrt(points) when they are independent, more when the metric's noise persists from
    point to point (``Spread.correlation``: neighbouring points then say less than their count)."""
    sigma, n = spread.sigma[metric], spread.runs
    by_step: dict[int, list[float]] = {}
    for r in repeats:
        for p in r.points:
            if p.metric == metric and math.isfinite(p.diff):
                by_step.setdefault(p.step, []).append(p.diff)
    terms = [(sum(v) / len(v)) / (sigma * math.sqrt(1 / len(v) + 1 / n)) for _, v in sorted(by_step.items())]
    if not terms:
        return None, [], 0.0
    scale = math.sqrt(sum_variance(sorted(by_step), spread.correlation.get(metric, 0.0)))
    return sum(terms) / scale, sorted(by_step), max(abs(t) for t in terms)


def decide(first: RunPoints, repeats: Sequence[RunPoints], spread: Spread | None, rule: Rule = Rule(),
           budget: int | None = None) -> Decision:
    """The outcome of a suite after its first run and ``repeats`` so far, or ``outcome=None`` when
    another repeat is needed (and allowed by ``budget``, default ``rule.budget``)."""
    budget = rule.budget if budget is None else budget
    rule = _rule_for(rule, spread)
    text = rule.describe()
    if first.verdict == PASS:
        return Decision(PASS, "the first run passed: nothing to confirm", rule=text)
    reasons = repeatable(first, spread, rule)
    if reasons:
        return Decision(FAIL, "not repeated: " + "; ".join(reasons), rule=text)
    if budget <= 0:
        return Decision(FAIL, "not repeated: the budget of extra runs is 0", rule=text)
    broken = [k for k, r in enumerate(repeats, 1)
              if r.verdict != PASS and str(r.failure_class or "").startswith("infrastructure")]
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
    breached = {p.metric for p in first.points if p.breached}
    metrics = _tested(spread)
    evidence = []
    for metric in metrics:
        z, steps, top_point = _metric_z(metric, repeats, spread)
        df = spread.df_of(metric)
        evidence.append({"metric": metric, "direction": None if not z else "up" if z > 0 else "down",
                         "steps": steps, "points_seen": len(steps), "z": None if z is None else round(z, 3),
                         "max_point_z": round(top_point, 3), "repeats": len(repeats),
                         "breached_first": metric in breached, "df": None if not math.isfinite(df) else df,
                         "z_reproduce": round(rule.z_reproduce(len(metrics), df), 3),
                         "z_point": round(rule.z_point(len(metrics), df), 3),
                         "z_clear": round(rule.z_clear(len(metrics), df), 3)})
    shifted = [e for e in evidence if e["z"] is not None and (abs(e["z"]) >= e["z_reproduce"]
                                                              or e["max_point_z"] >= e["z_point"])]
    if shifted:
        top = max(shifted, key=lambda e: max(abs(e["z"]) / e["z_reproduce"], e["max_point_z"] / e["z_point"]))
        which = "one of the first run's breaches" if top["breached_first"] else \
            "not a metric the first run breached before it ended"
        how = (f"|z| = {abs(top['z']):.2f} >= {top['z_reproduce']:.2f} over {top['points_seen']} point(s)"
               if abs(top["z"]) >= top["z_reproduce"] else
               f"one point's |z| = {top['max_point_z']:.2f} >= {top['z_point']:.2f}")
        return Decision(REPRODUCED, f"{top['metric']} is {'above' if top['z'] > 0 else 'below'} its reference "
                        f"again ({which}): over {len(repeats)} repeat(s), {how} (p = {rule.p_reproduce:g} over "
                        f"{len(metrics)} metrics{_df_words(top)})", evidence, text)
    undecided = [e for e in evidence if e["z"] is None or abs(e["z"]) >= e["z_clear"]]
    complete = any(r.complete for r in repeats)
    if not undecided and complete:
        said = ", ".join(f"{e['metric']} z = {e['z']:.2f}" for e in evidence)
        bounds = sorted({e["z_clear"] for e in evidence})
        below = f"{bounds[0]:.2f}" if len(bounds) == 1 else f"its bound ({bounds[0]:.2f} to {bounds[-1]:.2f})"
        return Decision(NOT_REPRODUCED, f"the first run's breach reads as noise: over {len(repeats)} repeat(s) no "
                        f"judged metric is off its reference beyond the noise ({said}; every |z| < {below}, "
                        f"p = {rule.p_clear:g} over {len(metrics)} metrics)", evidence, text)
    pending = [f"{e['metric']} z = {'n/a' if e['z'] is None else format(e['z'], '.2f')}" for e in undecided]
    if not complete:
        pending.append("no repeat ran to its end")
    if len(repeats) < budget:
        return Decision(None, f"undecided after {len(repeats)} repeat(s): {', '.join(pending)}; another repeat",
                        evidence, text)
    settle = "; ".join(pending)
    edge = undecided[0] if undecided else evidence[0]
    return Decision(INCONCLUSIVE, f"the budget of {budget} extra run(s) is spent and {settle} (|z| between "
                    f"{edge['z_clear']:.2f} and {edge['z_reproduce']:.2f} is neither noise nor a reproduction). "
                    "What would settle it: more "
                    "runs of this commit (trigger it again with a larger 'repeats'), or a baseline version "
                    "calibrated from more runs (its own error is shared by every repeat)", evidence, text)


def _df_words(e: Mapping[str, Any]) -> str:
    return "" if e.get("df") is None else f"; Student-t bounds: its spread is an estimate on {e['df']:g} df"


def stop_early(first: RunPoints, spread: Spread | None, rule: Rule = Rule()) -> dict[str, list[float]]:
    """What stops a repeat before its end: metric -> [sign (0: either way), the smallest |diff| of one of its
    points]. A certain FAIL of the metric by that much alone decides the outcome (with a spread: one point's
    |z| reaches :meth:`Rule.z_point`; without: the same metric breaching the same way); anything less lets
    the repeat run on, so that its other points are measured."""
    if spread is not None and first.points and all(p.metric in spread.sigma for p in first.points if p.breached):
        rule = _rule_for(rule, spread)
        metrics = _tested(spread)
        return {m: [0, rule.z_point(len(metrics), spread.df_of(m)) * spread.sigma[m] * math.sqrt(1 + 1 / spread.runs)]
                for m in metrics}
    breached = first.breached or {p.metric: _sign(p.diff) for p in first.points if p.breached}
    return {m: [s, 0.0] for m, s in breached.items()}


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

@dataclass(frozen=True)
class Layout:
    """Where a suite is judged: per metric its threshold and the steps of its points (a run's judged
    points); what the simulated estimates need besides the spread."""

    thresholds: Mapping[str, float]
    steps: Mapping[str, tuple[int, ...]]
    #: metric -> q when the run's verdict on it is the q-th percentile of its points' |differences| (GRPO's
    #: checker: p80 over the steps); otherwise any one point breaching fails it.
    percentiles: Mapping[str, float] = field(default_factory=dict)

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
    """Outcome rates and mean runs of the whole procedure (:func:`decide` itself) on simulated runs: normal
    noise with ``spread`` (AR(1) from point to point with its ``correlation``, else independent), the reference's
    own N-run error drawn once per verification, and ``shift`` (metric -> a constant shift at every point) added
    to every run."""
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(seed)
    metrics = [m for m in layout.thresholds if m in spread.sigma]
    keys = [(m, s) for m in metrics for s in layout.steps[m]]
    sig = np.array([spread.sigma[m] for m, _ in keys])
    delta = np.array([(shift or {}).get(m, 0.0) for m, _ in keys])
    thr = np.array([layout.thresholds[m] for m, _ in keys])
    # AR(1) from point to point within each metric when the spread says its noise persists (issue 51).
    rho = np.array([spread.correlation.get(m, 0.0) for m, _ in keys])
    carry = np.array([i > 0 and keys[i - 1][0] == keys[i][0] for i in range(len(keys))]) & (rho != 0)
    counts = {REPRODUCED: 0, NOT_REPRODUCED: 0, INCONCLUSIVE: 0, PASS: 0, FAIL: 0}
    runs_used = 0
    limit = rule.budget if budget is None else budget

    def noise(scale: Any) -> Any:
        z = rng.normal(0, 1, len(keys))
        if carry.any():
            for i in np.flatnonzero(carry):
                z[i] = rho[i] * z[i - 1] + math.sqrt(1 - rho[i] ** 2) * z[i]
        return z * scale

    for _ in range(samples):
        reference_error = noise(sig / math.sqrt(spread.runs))

        def run() -> RunPoints:
            d = noise(sig) - reference_error + delta
            over = {m for m, q in layout.percentiles.items() if m in metrics
                    and np.percentile(np.abs([v for (k, _), v in zip(keys, d) if k == m]), q) >= layout.thresholds[m]}
            pts = [Point(m, s, float(v), float(t), bool(abs(v) >= t) and (m not in layout.percentiles or m in over))
                   for (m, s), v, t in zip(keys, d, thr)]
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
