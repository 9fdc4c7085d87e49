"""The run-to-run spread, learned from the runs we make (issue 34; pure, no Airflow).

The confirmation rule (``core.confirm``) judges repeats against a sigma per metric. Taken once from
the baseline version's provenance (the runbook's max deviation over N=3 runs, read as normal noise),
that sigma is itself uncertain by ~25%, and a node's true spread may differ further. This module
combines, per suite and metric, three estimates of the same variance into one pooled estimate with
its degrees of freedom, so that the rule's bounds are Student-t's and a thin estimate asks for more
evidence instead of crying wolf:

* **the prior**: the provenance's sigma, on the degrees of freedom of the estimator behind it
  (:func:`core.deviation.max_dev_df`: ~8 for one max deviation over 3 runs and 6 points);
* **the repeats** of the verification being decided: the runs of one commit, each point's squared
  deviations from their mean at that point (free of the baseline's own error, which they share, and of
  any shift of the commit). The first run is left out: it was chosen for breaching, its deviation is
  not a fair draw;
* **the history**: every run of recent verifications that ended healthy (PASS, or PASS not reproduced)
  with the same spread key (suite, experiment fingerprint incl. the baseline version, node), pooled as
  one sample: each point's squared deviations from the history's mean at that point (the baseline's
  error is the same for all of them and falls out). Verifications that ended FAIL, FAIL (reproduced),
  INCONCLUSIVE or in an infrastructure failure are left out, and so is anything older than the age
  bound or beyond the count bound.

Pooled: ``sigma^2 = (df0 s0^2 + SS_repeats + SS_history) / (df0 + df_repeats + df_history)`` per metric
(one sigma per metric, its points pooled: the runbook gives one deviation per metric, not per eval
point). A metric's learned variance (repeats and history alone) is compared with the prior's by a
two-sided F test, Sidak-corrected over the metrics with data: the **drift alarm**, information for a
person (a noisier node, a changed library), not a FAIL.

**Step-to-step correlation** (issue 51). A run's deviation persists from step to step (a policy that drifts
above the mean at step t is still above at t + 1), so a run's points are not independent draws. From the same
residuals (each point's deviation from the per-point mean), the correlation of neighbouring judged points of a
run is estimated per metric (pooled lag-1 products), shrunk toward a conservative prior
(:data:`CORRELATION_PRIOR`, worth :data:`CORRELATION_PRIOR_PAIRS` pairs: with no data the rule assumes strong
persistence, so a cold node never overstates its evidence), and then used twice: the confirmation's Stouffer
sums are scaled by their own standard deviation (``core.confirm.sum_variance``), and the data's degrees of
freedom count effective points, ``(1 - rho^2) / (1 + rho^2)`` of each run's points (Bartlett: correlated squares
carry less information about the variance). With independent points (rho = 0, no correlation learned or given)
everything is as before. The history's older and newer halves are compared too: a learned correlation that
moved raises a drift alarm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Sequence

from rl_verify.core.confirm import NOT_REPRODUCED, PASS, RunPoints, Spread

#: What a drift alarm means, said once before its metrics (report, notification).
DRIFT_WORDS = ("Drift alarm (information, not a FAIL): the runs' spread left the prior's plausible range, a "
               "noisier node or a changed library? The rule decides with the pooled spread")

#: Outcomes of a verification whose runs are healthy evidence of the spread.
HEALTHY_OUTCOMES = (PASS, NOT_REPRODUCED)


@dataclass(frozen=True)
class Past:
    """One earlier verification of a suite as the spread history keeps it: its spread key, outcome, when
    it finished, and every run's judged points (first run first)."""

    label: str
    key: Mapping[str, Any]
    outcome: str | None
    finished_at: datetime
    runs: tuple[RunPoints, ...] = ()


#: The step-to-step correlation of neighbouring judged points the rule assumes while it has no data (issue 51):
#: conservative (strong persistence: a sum of points then weighs little), and worth this many pairs of
#: neighbouring residuals against the data's.
CORRELATION_PRIOR = 0.9
CORRELATION_PRIOR_PAIRS = 20


@dataclass(frozen=True)
class Squares:
    """Per metric: the sum of squared deviations from the per-point means, its degrees of freedom, and the
    runs it came from; and for the step-to-step correlation, the sums over neighbouring points of a run of
    ``r_i r_(i+1)``, ``r_i^2`` and ``r_(i+1)^2`` and their count (``lag``: metric -> [xy, xx, yy, pairs])."""

    ss: Mapping[str, float] = field(default_factory=dict)
    df: Mapping[str, int] = field(default_factory=dict)
    runs: int = 0
    lag: Mapping[str, tuple[float, float, float, int]] = field(default_factory=dict)

    def __add__(self, other: "Squares") -> "Squares":
        metrics = set(self.ss) | set(other.ss)
        lags = set(self.lag) | set(other.lag)
        return Squares({m: self.ss.get(m, 0.0) + other.ss.get(m, 0.0) for m in metrics},
                       {m: self.df.get(m, 0) + other.df.get(m, 0) for m in metrics}, self.runs + other.runs,
                       {m: tuple(a + b for a, b in zip(self.lag.get(m, (0.0, 0.0, 0.0, 0)),
                                                       other.lag.get(m, (0.0, 0.0, 0.0, 0))))  # type: ignore[misc]
                        for m in lags})

    def correlation(self, metric: str) -> tuple[float | None, int]:
        """(the pooled correlation of neighbouring residuals of ``metric``, the pairs it rests on); None without
        pairs."""
        xy, xx, yy, pairs = self.lag.get(metric, (0.0, 0.0, 0.0, 0))
        if not pairs or xx <= 0 or yy <= 0:
            return None, int(pairs)
        return max(-1.0, min(1.0, xy / math.sqrt(xx * yy))), int(pairs)


def squares(runs: Sequence[RunPoints]) -> Squares:
    """The within-sample squared deviations of ``runs`` (one sample: one mean per (metric, step)): per metric
    the sum over its points that have 2 or more finite diffs of sum (diff - mean)^2, on sum (n - 1) degrees
    of freedom. Points seen once add nothing."""
    by_point: dict[tuple[str, int], list[float]] = {}
    for run in runs:
        for p in run.points:
            if math.isfinite(p.diff):
                by_point.setdefault((p.metric, p.step), []).append(p.diff)
    ss: dict[str, float] = {}
    df: dict[str, int] = {}
    means: dict[tuple[str, int], float] = {}
    for (metric, step), values in by_point.items():
        if len(values) < 2:
            continue
        mean = means[(metric, step)] = sum(values) / len(values)
        ss[metric] = ss.get(metric, 0.0) + sum((v - mean) ** 2 for v in values)
        df[metric] = df.get(metric, 0) + len(values) - 1
    # Neighbouring judged points of one run (the metric's points in step order): their residuals' products.
    lag: dict[str, list[float]] = {}
    for run in runs:
        residuals: dict[str, list[float]] = {}
        for p in sorted(run.points, key=lambda q: (q.metric, q.step)):
            if math.isfinite(p.diff) and (p.metric, p.step) in means:
                residuals.setdefault(p.metric, []).append(p.diff - means[(p.metric, p.step)])
        for metric, r in residuals.items():
            acc = lag.setdefault(metric, [0.0, 0.0, 0.0, 0])
            for a, b in zip(r, r[1:]):
                acc[0] += a * b
                acc[1] += a * a
                acc[2] += b * b
                acc[3] += 1
    return Squares(ss, df, len(runs), {m: (v[0], v[1], v[2], int(v[3])) for m, v in lag.items()})


def learned_correlation(data: Squares, metric: str, prior: float = CORRELATION_PRIOR,
                        prior_pairs: int = CORRELATION_PRIOR_PAIRS) -> tuple[float, int]:
    """(the step-to-step correlation the rule uses for ``metric``, the pairs of residuals behind it): the data's
    pooled estimate shrunk toward the conservative ``prior`` (worth ``prior_pairs``), never below 0 (a negative
    correlation would make a sum of points weigh more than their count)."""
    estimate, pairs = data.correlation(metric)
    if estimate is None:
        return prior, 0
    return max(0.0, (prior_pairs * prior + pairs * estimate) / (prior_pairs + pairs)), pairs


def effective_share(correlation: float) -> float:
    """The share of a run's correlated points that counts as independent squares for its variance (Bartlett:
    ``(1 - rho^2) / (1 + rho^2)`` for AR(1) points; 1 when independent)."""
    rho2 = correlation * correlation
    return (1.0 - rho2) / (1.0 + rho2)


def left_out(past: Past, key: Mapping[str, Any], now: datetime, max_age: timedelta,
             current: str | None = None) -> str | None:
    """Why ``past`` is not evidence of the spread for a verification with spread ``key`` at ``now`` (None: it
    is): the verification being decided itself, another key (suite, experiment, baseline version, node), an
    outcome that is not healthy, older than ``max_age`` (or finished in the future), no runs."""
    if current is not None and past.label == current:
        return "the verification being decided"
    if dict(past.key) != dict(key):
        return "another experiment, baseline version or node"
    if past.outcome not in HEALTHY_OUTCOMES:
        return f"ended {past.outcome or 'without an outcome'}"
    age = now - past.finished_at
    if age > max_age or age < timedelta(0):
        return "older than the age bound" if age > max_age else "finished after now"
    if not past.runs:
        return "no runs kept"
    return None


def select(pasts: Iterable[Past], key: Mapping[str, Any], now: datetime, max_age: timedelta, max_count: int,
           current: str | None = None) -> tuple[list[Past], dict[str, int]]:
    """The newest ``max_count`` admissible verifications (newest first), and how many were left out, by
    reason."""
    kept, skipped = [], {}
    for past in sorted(pasts, key=lambda p: p.finished_at, reverse=True):
        why = left_out(past, key, now, max_age, current)
        if why is None and len(kept) >= max_count:
            why = f"beyond the newest {max_count}"
        if why is None:
            kept.append(past)
        else:
            skipped[why] = skipped.get(why, 0) + 1
    return kept, skipped


def learn(prior: Spread, repeats: Sequence[RunPoints], history: Sequence[Past] = (),
          drift_p: float | None = 0.01) -> Spread:
    """``prior`` (its ``df``: the degrees of freedom of each metric's sigma; none: exact) combined with the
    repeats' and the history's squared deviations (module docstring): the pooled sigma per metric of the prior,
    its degrees of freedom, its sources in words, and the drift alarm. With no data for a metric its prior
    stands, on the prior's degrees of freedom. ``drift_p`` None: no drift test (simulations)."""
    prior_df = prior.df
    from_repeats = squares(repeats)
    from_history = squares([run for past in history for run in past.runs])
    data = from_repeats + from_history
    sigma, df, correlation, pairs = {}, {}, {}, {}
    for metric, s0 in prior.sigma.items():
        df0 = float(prior_df.get(metric, math.inf))
        ss, dfd = data.ss.get(metric, 0.0), data.df.get(metric, 0)
        if not math.isfinite(df0):  # an exact prior: data cannot move it (its correlation as given)
            sigma[metric], df[metric] = s0, math.inf
            if metric in prior.correlation:
                correlation[metric] = prior.correlation[metric]
            continue
        rho, pairs[metric] = learned_correlation(data, metric, prior.correlation.get(metric, CORRELATION_PRIOR))
        correlation[metric] = rho
        effective = dfd * effective_share(rho)
        sigma[metric] = math.sqrt((df0 * s0 * s0 + ss * effective / dfd) / (df0 + effective)) if dfd else s0
        df[metric] = df0 + effective
    sources = [f"prior: {prior.source} (df {_df_text(prior_df, 'exact')})"]
    if from_repeats.runs:
        sources.append(f"{_count(from_repeats.runs, 'repeat')} of this commit (df {_df_text(from_repeats.df)})")
    if history:
        nights = len({past.finished_at.date() for past in history})
        sources.append(f"{_count(from_history.runs, 'run')} of {_count(len(history), 'healthy verification')} over "
                       f"{_count(nights, 'day')} (df {_df_text(from_history.df)})")
    if correlation:
        sources.append("step-to-step correlation of neighbouring points: " + ", ".join(
            f"{m} {rho:.2f} ({f'{pairs[m]} pairs' if pairs.get(m) else 'the prior: no data'})"
            for m, rho in sorted(correlation.items())))
    alarms = drift(prior, prior_df, data, drift_p) + correlation_drift(history, drift_p) if drift_p is not None else []
    return replace(prior, sigma=sigma, df=df, sources=tuple(sources), prior_sigma=dict(prior.sigma),
                   drift=tuple(alarms), correlation=correlation)


def correlation_drift(history: Sequence[Past], p: float = 0.01) -> list[str]:
    """The metrics whose step-to-step correlation moved between the history's older and newer half: Fisher z of
    the two pooled estimates, each on its effective pairs, two-sided, Sidak over the metrics, family-wise ``p``."""
    ordered = sorted(history, key=lambda past: past.finished_at)
    half = len(ordered) // 2
    if half < 2:
        return []
    older = squares([run for past in ordered[:half] for run in past.runs])
    newer = squares([run for past in ordered[half:] for run in past.runs])
    tested = []
    for metric in sorted(set(older.lag) & set(newer.lag)):
        (a, n_a), (b, n_b) = older.correlation(metric), newer.correlation(metric)
        if a is None or b is None:
            continue
        # pairs within a run are themselves correlated: count them as effective ones
        e_a, e_b = n_a * effective_share(max(a, 0.0)), n_b * effective_share(max(b, 0.0))
        if e_a > 3 and e_b > 3:
            tested.append((metric, a, b, e_a, e_b))
    if not tested:
        return []
    from statistics import NormalDist

    per_test = 1 - (1 - p) ** (1 / len(tested))
    out = []
    for metric, a, b, e_a, e_b in tested:
        clip = 0.999
        z = (math.atanh(max(-clip, min(clip, b))) - math.atanh(max(-clip, min(clip, a)))) / \
            math.sqrt(1 / (e_a - 3) + 1 / (e_b - 3))
        both = 2 * (1 - NormalDist().cdf(abs(z)))
        if both < per_test:
            out.append(f"{metric} step-to-step correlation moved from {a:.2f} to {b:.2f} between the older and the "
                       f"newer half of the history (p = {both:.2g} < {per_test:.2g})")
    return out


def drift(prior: Spread, prior_df: Mapping[str, float], data: Squares, p: float = 0.01) -> list[str]:
    """The metrics whose learned variance (repeats and history alone) left the prior's plausible range: a
    two-sided F test of ``SS/df`` against the prior's ``s0^2`` on (df, df0), Sidak over the metrics with data,
    family-wise ``p``. One phrase per metric ("<metric> 3.10x the prior's spread (noisier; F test ...)"), the
    largest departure first; :data:`DRIFT_WORDS` says what it means."""
    from scipy.stats import f  # kept out of DAG parsing

    tested = [m for m in prior.sigma if data.df.get(m, 0) > 0 and prior.sigma[m] > 0
              and math.isfinite(prior_df.get(m, math.inf))]
    if not tested:
        return []
    per_test = 1 - (1 - p) ** (1 / len(tested))
    out = []
    for metric in tested:
        dfd, df0 = data.df[metric], float(prior_df[metric])
        ratio = math.sqrt(data.ss[metric] / dfd) / prior.sigma[metric]
        both = 2 * min(f.cdf(ratio * ratio, dfd, df0), f.sf(ratio * ratio, dfd, df0))
        if both < per_test:
            out.append((abs(math.log(ratio)), f"{metric} {ratio:.2f}x the prior's spread "
                        f"({'noisier' if ratio > 1 else 'quieter'}; F test p = {both:.2g} < {per_test:.2g}, "
                        f"df {dfd} vs {df0:g})"))
    return [text for _, text in sorted(out, reverse=True)]


def moved(spread: Spread) -> dict[str, float]:
    """Per metric: the sigma the rule used over the prior's (1.0: unmoved)."""
    return {m: spread.sigma[m] / s0 for m, s0 in spread.prior_sigma.items() if s0 > 0 and m in spread.sigma}


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _df_text(df: Mapping[str, float], none: str = "0") -> str:
    """"8", "5-6 by metric", or ``none`` when no metric has finite degrees of freedom."""
    values = sorted({round(float(v), 1) for v in df.values() if math.isfinite(float(v))})
    if not values:
        return none
    return f"{values[0]:g}" if len(values) == 1 else f"{values[0]:g}-{values[-1]:g} by metric"
