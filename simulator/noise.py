"""The simulated node's noise mode (``sim.json`` keys ``noise`` and ``baseline_error_seed``).

The mode decides how runs scatter around the node's true curve and what the share's baseline
trackers hold (see ``xtuner_checkout/xtuner/rlsim/curves.py``): ``bounded`` (default, a healthy run
always passes), ``realistic`` (unbounded normal noise with the runbook's measured spread and the
baseline's own error) or ``realistic-t`` (the same, heavier-tailed). Switching it here rewrites the
share's baselines with it, so runs and baselines always agree. Standard library only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.checkout import _build_share
from simulator.common import load_curves, _read_json, _root, _write_json


def noise_settings(state: Path) -> dict[str, Any]:
    """The node's noise mode and baseline_error_seed (the defaults when sim.json does not set them)."""
    curves = load_curves()
    sim = _read_json(_root(state) / "sim.json", {})
    return {"noise": sim.get("noise", curves.DEFAULT_NOISE),
            "baseline_error_seed": str(sim.get("baseline_error_seed", curves.DEFAULT_BASELINE_ERROR_SEED)),
            "spread_ratio": float(sim.get("spread_ratio", 1.0)), "correlation": float(sim.get("correlation", 0.0))}


def set_noise(state: Path, mode: str = "realistic", baseline_error_seed: str | int | None = None,
              spread_ratio: float | None = None, correlation: float | None = None) -> dict[str, Any]:
    """Switch the node under ``state`` to noise ``mode`` (one of curves.NOISE_MODES), optionally with a
    new ``baseline_error_seed`` (the draw of the baseline's own error: the node's true curve and its
    share's baselines), optionally a ``spread_ratio`` (the node's true run-to-run spread over the assumed
    one: curves.check_spread_ratio), optionally a ``correlation`` (the step-to-step correlation of a run's
    training-metric noise: curves.check_correlation), and return the settings now in force.

    Promises: sim.json holds the settings (they survive a restart of the node); the share's baseline
    trackers are rewritten for them at once (a baseline hidden by a missing-input fault is left
    alone); every later launch uses them, a training already running keeps its own. Raises
    ValueError for an unknown mode and RuntimeError when no node was built under ``state``.
    """
    root = _root(state)
    if not (root / "sim.json").exists():
        raise RuntimeError(f"no simulated node under {state}: start_node first")
    load_curves().check_noise_mode(mode)
    sim = _read_json(root / "sim.json", {})
    sim["noise"] = mode
    if baseline_error_seed is not None:
        sim["baseline_error_seed"] = str(baseline_error_seed)
    if spread_ratio is not None:
        sim["spread_ratio"] = load_curves().check_spread_ratio(spread_ratio)
    if correlation is not None:
        sim["correlation"] = load_curves().check_correlation(correlation)
    _write_json(root / "sim.json", sim)
    _build_share(root)
    return noise_settings(state)


#: The simulated node's environment as deterministic mode sees it (sim.json ``environment``; train.py's default).
DEFAULT_ENVIRONMENT = {"driver": "580.159.04", "torch": "2.8.0", "sglang": "0.5.3"}


def set_determinism(state: Path, reproducible: bool = True,
                    environment: dict[str, str] | None = None) -> dict[str, Any]:
    """Deterministic mode on the node under ``state`` (issue 33): ``reproducible`` False is the node fault
    "deterministic mode not reproducible" (every deterministic launch draws its own bits); ``environment``
    replaces the node's environment (a driver or package upgrade: other bits, the same statistics; None keeps
    it). Returns what sim.json now says. Every later launch uses it; a training already running keeps its own."""
    root = _root(state)
    if not (root / "sim.json").exists():
        raise RuntimeError(f"no simulated node under {state}: start_node first")
    sim = _read_json(root / "sim.json", {})
    sim["deterministic"] = bool(reproducible)
    if environment is not None:
        sim["environment"] = dict(environment)
    _write_json(root / "sim.json", sim)
    return {"deterministic": sim["deterministic"], "environment": sim.get("environment") or DEFAULT_ENVIRONMENT}


def set_worker_env(state: Path, scrubbed: bool = True) -> None:
    """The rollout worker of every later launch on the node under ``state`` starts without the launch's COVERAGE_*
    variables (``scrubbed``: a process the job's environment does not reach, as a Ray worker started before it
    would be), or with them (False). Its executed lines are then missing from the evidence (issue 44)."""
    root = _root(state)
    if not (root / "sim.json").exists():
        raise RuntimeError(f"no simulated node under {state}: start_node first")
    sim = _read_json(root / "sim.json", {})
    sim["worker_env"] = "scrubbed" if scrubbed else "inherited"
    _write_json(root / "sim.json", sim)
