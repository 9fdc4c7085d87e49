"""Healthy nights for tests of the learned spread (issue 34): runs of a simulated node, judged by the suite's
engine exactly as a verification judges them, kept in the record store's spread history as a verification
that ended PASS would keep them. Saves an end-to-end test a dozen nightly DAG runs; the DAG's own entries are
written and read by the same code (``orchestration.spread_history``)."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

from rl_verify.core.confirm import RunPoints
from rl_verify.engines import engine_of, load_suite
from rl_verify.orchestration import spread_history
from simulator.common import CHECKOUT_SRC, load_curves


def healthy_run(suite: str, seed: str, baseline_error_seed: str, spread_ratio: float = 1.0) -> RunPoints:
    """One healthy realistic run of ``suite`` on a node with ``baseline_error_seed`` and ``spread_ratio``, judged
    against the shipped baseline by the engine (its run points, as a verification's compare records them)."""
    curves = load_curves()
    spec = load_suite(suite)
    engine = engine_of(spec)
    rows = curves.run_rows(suite, seed, None, "realistic", baseline_error_seed=baseline_error_seed,
                           spread_ratio=spread_ratio)
    baseline = curves.baseline_rows(suite, "realistic", baseline_error_seed=baseline_error_seed,
                                    spread_ratio=spread_ratio)
    with tempfile.TemporaryDirectory(prefix="rl-verify-night-") as tmp:
        folder = Path(tmp)
        (folder / "tracker.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "baseline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in baseline))
        (folder / "checker").mkdir()  # GRPO's verdict is the checkout's checker: the simulated checkout's double
        (folder / "checker" / "autotest").symlink_to(CHECKOUT_SRC / "autotest")
        result = engine.compare_archived(spec, folder, folder / "out", {"wall_time_s": None}, None, {}, plot=False)
        return engine.run_points(spec, folder, result, {})


def keep_nights(suite: str, resolved: Mapping[str, Any], count: int, baseline_error_seed: str,
                spread_ratio: float = 1.0, tag: str = "night") -> list[str]:
    """Keep ``count`` healthy nights (one run each, one a day before now) in the spread history under the key
    a verification with ``resolved`` (its ``baselines`` and ``suite_nodes``) reads; return their labels."""
    key = spread_history.spread_key(load_suite(suite), resolved)
    now = datetime.now(timezone.utc)
    labels = []
    for n in range(count):
        label = f"scheduled__{tag}-{n}"
        run = healthy_run(suite, f"{tag}-{n}", baseline_error_seed, spread_ratio)
        spread_history.keep(suite, label, key, "PASS", [run], now=now - timedelta(days=n + 1, hours=1))
        labels.append(label)
    return labels
