"""The bisection bench's plumbing into the confirmation bench (scripts/bench_bisect.py, bench_confirmation.py)."""
from __future__ import annotations

import pytest

from scripts import bench_confirmation as bc


def test_scaled_scenario_names_the_history_regression() -> None:
    name = bc.scaled("teacher", 1 / 3, 10)
    assert bc._scenario("opd", name) == (name, ("teacher", pytest.approx(1 / 3, rel=1e-5), 10), None)
    rows = bc._rows("opd", bc._scenario("opd", name)[1], None, ("b", "3-0"), 0, "realistic")
    plain = [r for r in bc.CURVES.run_rows("opd", "bisect-b-3-0-0", "teacher", "realistic", eval_every=5,
                                           baseline_error_seed="bisect-b", regression_scale=float(f"{1 / 3:.6g}"),
                                           regression_from=10) if r["step"] == 0 or "response/rewards/mean" in r]
    assert rows == plain
    assert bc._scenario("opd", "healthy") == ("healthy", None, None)
    with pytest.raises(KeyError):
        bc._scenario("opd", "nonsense x1 from step 3")


def test_probes_of_one_bisection_share_the_baseline_error_not_the_run_seed() -> None:
    assert bc._seeds(("b1", "3-0"), 0)[1] == bc._seeds(("b1", "7-1"), 2)[1] != bc._seeds(("b2", "3-0"), 0)[1]
    assert len({bc._seeds(("b1", p), a)[0] for p in ("3-0", "3-1", "4-0") for a in (0, 1)}) == 6
    assert bc._seeds(4, 1) == ("bench-4-1", "bench-4")  # the confirmation bench's own seeds are unchanged
