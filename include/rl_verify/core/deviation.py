"""What run-to-run noise means for a suite's thresholds (issue 21; pure): the factor between a measured max (or
percentile) deviation and sigma, the degrees of freedom such a sigma is worth, and the chance that a healthy run
breaches a threshold. Normal, independent noise; numpy only inside the functions (kept out of DAG parsing)."""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

_NORMAL = NormalDist()


def healthy_breach_rate(sigma: float, threshold: float, points: int, runs: int,
                        percentile: float | None = None) -> float:
    """The chance that a healthy run breaches a metric at one of its ``points`` (normal, independent noise;
    the reference an N-run mean, so a difference has variance sigma^2 (1 + 1/N)); with ``percentile``, that the
    q-th percentile of the |differences| over its points breaches (GRPO's checker: p80 over the steps), by
    simulation."""
    if sigma <= 0:
        return 0.0
    if percentile is not None:
        return _percentile_breach_rate(sigma * math.sqrt(1 + 1 / runs), threshold, points, float(percentile))
    inside = 2 * _NORMAL.cdf(threshold / (sigma * math.sqrt(1 + 1 / runs))) - 1
    return float(1 - inside ** points)


@lru_cache(maxsize=256)
def _percentile_breach_rate(sd: float, threshold: float, points: int, q: float, samples: int = 20_000) -> float:
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(20261206)
    stat = np.percentile(np.abs(rng.normal(0, sd, (samples, points))), q, axis=1)
    return float((stat >= threshold).mean())


@lru_cache(maxsize=64)
def percentile_dev_factor(runs: int, points: int, q: float, samples: int = 50_000) -> tuple[float, float]:
    """(E, df) of the max over ``runs`` runs of the q-th percentile over ``points`` points of |x - mean of the
    runs| for unit normal noise: the factor between such a deviation (what GRPO's checker compares) and sigma,
    and the degrees of freedom a sigma read from one of them is worth (as :func:`max_dev_df`)."""
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(20261206)
    x = rng.standard_normal((samples, points, runs))
    dev = np.percentile(np.abs(x - x.mean(axis=2, keepdims=True)), q, axis=1).max(axis=1)
    cv = float(dev.std() / dev.mean())
    return float(dev.mean()), round(1 / (2 * cv * cv), 1)


@lru_cache(maxsize=64)
def max_dev_factor(runs: int, points: int, samples: int = 100_000) -> float:
    """E[max over ``points`` points and ``runs`` runs of |x - mean of the runs|] for unit normal noise: the
    factor between a measured max deviation and sigma (runbook's N=3: 1.61 at 5 points, 1.68 at 6)."""
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(20261026)
    x = rng.standard_normal((samples, points, runs))
    dev = np.abs(x - x.mean(axis=2, keepdims=True)).max(axis=(1, 2))
    return float(dev.mean())


@lru_cache(maxsize=64)
def max_dev_df(runs: int, points: int, samples: int = 100_000) -> float:
    """The degrees of freedom a sigma read from one max deviation (:func:`max_dev_factor`) is worth: those of
    a sample standard deviation with the same relative spread, 1 / (2 cv^2) (runbook's N=3 at 6 points: ~8;
    its ~25% uncertainty)."""
    import numpy as np  # kept out of DAG parsing

    rng = np.random.default_rng(20261204)
    x = rng.standard_normal((samples, points, runs))
    dev = np.abs(x - x.mean(axis=2, keepdims=True)).max(axis=(1, 2))
    cv = float(dev.std() / dev.mean())
    return round(1 / (2 * cv * cv), 1)


def sigma_from_max_dev(max_dev: float, runs: int, points: int) -> float:
    """The sigma a measured max run-to-run deviation over ``runs`` runs and ``points`` points means."""
    return max_dev / max_dev_factor(runs, max(1, points))
