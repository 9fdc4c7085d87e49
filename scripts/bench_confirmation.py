"""The confirmation rule, measured: false alarms, detection and runs used at realistic noise.

    python -m scripts.bench_confirmation [--healthy 200] [--regressed 100] [--mode realistic]

Every verification is replayed through the real decision code: the simulated node's own rows
(``curves.run_rows`` in the realistic noise mode: unbounded normal noise at the runbook's measured
spread, the reference's own N-run error drawn once per verification and shared by its repeats), the
engine's live check one step at a time (a run is cut where early abort would stop it), the engine's
comparison (GRPO: the checkout's checker double in its subprocess; OPD: every eval point against the
golden table), the engine's points and spread, and ``core.confirm.decide``: repeats with new seeds until
it decides or the budget is spent. It prints, per suite:

* over ``--healthy`` healthy verifications: the single-run FAIL rate (the runbook's verdict alone), the
  final FAIL rate after confirmation, INCONCLUSIVE, and the mean training runs per verification;
* for each regression (the simulated checkout's, and marginal ones just past a threshold), over
  ``--regressed`` verifications: the detection rate (a final FAIL) and the mean runs;
* the same for other budgets and a looser and a stricter rule (the trade-off), from the same runs.

Figures to read, no assertion. Runs are cached per (verification, attempt, what stops it early), so the trade-off rows
re-decide the same runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import tempfile
import time
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path
from typing import Any, Callable

from rl_verify.core import confirm
from rl_verify.core.live import aborted_result, confirming
from rl_verify.core.tracker import TrackerFeed
from rl_verify.engines import engine_of, load_suite

ROOT = Path(__file__).resolve().parents[1]
CHECKER_DIR = ROOT / "simulator" / "xtuner_checkout" / "autotest"
KL, GSM, REWARDS = "distillation/reduced_distillation_kl", "eval/gsm8k/acc", "response/rewards/mean"


def _curves() -> Any:
    path = ROOT / "simulator" / "xtuner_checkout" / "xtuner_sim" / "curves.py"
    spec = importlib.util.spec_from_file_location("rlsim_curves", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CURVES = _curves()


def _shift(metric: str, amount: Callable[[int], float]) -> Callable[[list[dict]], list[dict]]:
    """A marginal regression: ``amount(step)`` added to ``metric`` wherever a row carries it."""
    def apply(rows: list[dict]) -> list[dict]:
        return [{**r, metric: r[metric] + amount(r["step"])} if metric in r else r for r in rows]
    return apply


#: suite -> [(name, simulated regression or None, extra shift or None)]
SCENARIOS: dict[str, list[tuple[str, str | None, Any]]] = {
    "opd": [("healthy", None, None), ("sim init", "init", None), ("sim divergence", "divergence", None),
            ("sim teacher", "teacher", None), ("sim rewards", "rewards", None),
            ("gsm8k -0.04 from step 10", None, _shift(GSM, lambda s: -0.04 if s >= 10 else 0.0)),
            ("distill_kl +0.04 from step 5", None, _shift(KL, lambda s: 0.04 if s >= 5 else 0.0)),
            ("rewards drifting to -0.12 by step 25", None, _shift(REWARDS, lambda s: -0.12 * s / 25))],
    "grpo": [("healthy", None, None), ("sim init", "init", None), ("sim divergence", "divergence", None),
             ("sim mismatch", "mismatch", None)],
}
EVAL_EVERY = {"grpo": 15, "opd": 5}


def _rows(suite: str, regression: str | None, shift: Any, verification: int, attempt: int, mode: str) -> list[dict]:
    rows = CURVES.run_rows(suite, f"bench-{verification}-{attempt}", regression, mode,
                           eval_every=EVAL_EVERY[suite], baseline_error_seed=f"bench-{verification}")
    rows = [r for r in rows if r["step"] == 0 or "response/rewards/mean" in r]  # mini-batch rows: never read
    return shift(rows) if shift else rows


def _baseline(suite: str, verification: int, mode: str) -> bytes:
    rows = CURVES.baseline_rows(suite, mode, baseline_error_seed=f"bench-{verification}")
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _evaluate(args: tuple[str, int, int, str, str, dict[str, int] | None]) -> tuple[tuple, dict]:
    """One run of one verification, through the engine: (key, its RunPoints as a dict + the abort step).

    ``confirms`` (a repeat: the first run's breached metrics and directions): as in the DAG's repeats, only a
    certain FAIL of one of them stops the run early (``core.live.confirming``)."""
    suite, index, attempt, scenario, mode, confirms = args
    name, regression, shift = next(s for s in SCENARIOS[suite] if s[0] == scenario)
    spec = load_suite(suite)
    engine = engine_of(spec)
    rows = _rows(suite, regression, shift, index, attempt, mode)
    baseline = _baseline(suite, index, mode)
    live = engine.live(spec, baseline, None)
    feed, elapsed, abort = TrackerFeed("tracker.jsonl"), 0.0, None
    for i, row in enumerate(rows):
        elapsed += row.get("time/step", 0.0)
        feed.feed((json.dumps(row) + "\n").encode())
        found = live.check(feed.tracker, elapsed) if live is not None else None
        if found is not None and found.certain and (not confirms or confirming(found.certain, confirms)):
            abort = {"step": row["step"], "expected_steps": spec.expected_steps,
                     "certain": [{k: getattr(c, k) for k in c.__dataclass_fields__} for c in found.certain]}
            rows = rows[:i + 1]
            break
    with tempfile.TemporaryDirectory(prefix="bench-confirm-") as tmp:
        folder = Path(tmp)
        (folder / "tracker.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "baseline.jsonl").write_bytes(baseline)
        (folder / "checker").mkdir()
        (folder / "checker" / "autotest").symlink_to(CHECKER_DIR)
        if abort is not None:
            result = aborted_result(suite, abort, engine.rules)
        else:
            result = engine.compare_archived(spec, folder, folder / "out", {"wall_time_s": None}, "bench", {})
        points = engine.run_points(spec, folder, result, {})
    return (suite, index, attempt, scenario), {
        "verdict": points.verdict, "failure_class": points.failure_class,
        "points": [p.__dict__ for p in points.points], "breached": points.breached,
        "not_repeatable": points.not_repeatable, "aborted_at": abort["step"] if abort else None,
        "complete": abort is None,
        "steps": len([r for r in rows if r["step"] > 0])}


def _points(data: dict) -> confirm.RunPoints:
    return confirm.RunPoints(data["verdict"], data["failure_class"], [confirm.Point(**p) for p in data["points"]],
                             data["breached"], data["not_repeatable"], data["complete"])


class Runs:
    """Evaluated runs, computed on demand (in a process pool) and kept."""

    def __init__(self, mode: str, workers: int) -> None:
        self.mode, self.pool, self.cache = mode, Pool(workers), {}

    def get(self, keys: list[tuple[str, int, int, str, str]]) -> None:
        """Evaluate the runs ``(suite, verification, attempt, scenario, stop)`` not yet kept; ``stop`` is the
        repeat's ``core.confirm.stop_early`` as JSON ("" for a first run)."""
        todo = [k for k in dict.fromkeys(keys) if k not in self.cache]
        args = [(*k[:4], self.mode, json.loads(k[4]) if k[4] else None) for k in todo]
        for (key, value), k in zip(self.pool.imap(_evaluate, args, chunksize=4), todo):
            self.cache[k] = value


def verify(runs: Runs, suite: str, scenario: str, count: int, rule: confirm.Rule,
           spread: confirm.Spread | None) -> dict[str, float]:
    """``count`` verifications of one scenario under ``rule``: outcome rates and mean runs."""
    alive = list(range(count))
    repeats: dict[int, list[confirm.RunPoints]] = {i: [] for i in alive}
    outcomes: dict[int, str] = {}
    runs.get([(suite, i, 0, scenario, "") for i in alive])
    firsts = {i: _points(runs.cache[(suite, i, 0, scenario, "")]) for i in alive}
    stops = {i: json.dumps(confirm.stop_early(firsts[i], spread, rule), sort_keys=True) for i in alive}
    attempt = 0
    while alive:
        keys = {i: (suite, i, attempt, scenario, stops[i] if attempt else "") for i in alive}
        runs.get(list(keys.values()))
        still = []
        for i in alive:
            if attempt:
                repeats[i].append(_points(runs.cache[keys[i]]))
            decision = confirm.decide(firsts[i], repeats[i], spread, rule)
            if decision.outcome is None:
                still.append(i)
            else:
                outcomes[i] = decision.outcome
        alive, attempt = still, attempt + 1
    first_fail = sum(firsts[i].verdict == "FAIL" for i in range(count)) / count
    final_fail = sum(o in confirm.FAILING for o in outcomes.values()) / count
    return {"first_fail": first_fail, "final_fail": final_fail,
            "inconclusive": sum(o == confirm.INCONCLUSIVE for o in outcomes.values()) / count,
            "runs": (count + sum(len(r) for r in repeats.values())) / count}


def _ci(p: float, n: int) -> str:
    """p with its 95% Wilson interval."""
    z = 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{p:.1%} ({max(0.0, centre - half):.1%}-{min(1.0, centre + half):.1%})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthy", type=int, default=200, help="healthy verifications per suite")
    parser.add_argument("--regressed", type=int, default=100, help="verifications per regression")
    parser.add_argument("--mode", default="realistic", help="the simulator's noise mode (realistic, realistic-t)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    runs = Runs(args.mode, args.workers)
    rule = confirm.Rule()
    spreads = {}
    for suite in SCENARIOS:
        spec = load_suite(suite)
        provenance, _ = engine_of(spec).shipped(spec)
        spreads[suite] = engine_of(spec).spread(spec, provenance.model_dump(mode="json"))
    print(f"Confirmation rule, {args.mode} noise (simulator), shipped baselines (v1); rule: {rule.describe()}.\n")
    print("| suite | scenario | verifications | single-run FAIL | final FAIL | INCONCLUSIVE | mean runs |")
    print("|---|---|---|---|---|---|---|")
    for suite, scenarios in SCENARIOS.items():
        for name, _, _ in scenarios:
            count = args.healthy if name == "healthy" else args.regressed
            r = verify(runs, suite, name, count, rule, spreads[suite])
            print(f"| {suite} | {name} | {count} | {_ci(r['first_fail'], count)} | {_ci(r['final_fail'], count)} | "
                  f"{r['inconclusive']:.1%} | {r['runs']:.2f} |", flush=True)
    print("\nTrade-off (OPD; the same runs re-decided): final FAIL of healthy verifications, detection of the "
          "marginal regressions, mean runs")
    print("| rule | healthy final FAIL | healthy mean runs | gsm8k -0.04 | distill_kl +0.04 | rewards drift |")
    print("|---|---|---|---|---|---|")
    variants = [("default (budget 2)", rule), ("budget 1", replace(rule, budget=1)),
                ("budget 3", replace(rule, budget=3)),
                ("looser: p_reproduce 0.05", replace(rule, p_reproduce=0.05)),
                ("stricter: p_reproduce 0.001", replace(rule, p_reproduce=0.001)),
                ("p_clear 0.01: PASS unless reproduced", replace(rule, p_clear=0.01))]
    marginal = [name for name, reg, shift in SCENARIOS["opd"] if shift is not None]
    for label, variant in variants:
        healthy = verify(runs, "opd", "healthy", args.healthy, variant, spreads["opd"])
        detect = [verify(runs, "opd", name, args.regressed, variant, spreads["opd"])["final_fail"] for name in marginal]
        print(f"| {label} | {healthy['final_fail']:.1%} | {healthy['runs']:.2f} | "
              + " | ".join(f"{d:.1%}" for d in detect) + " |", flush=True)
    print(f"\n{len(runs.cache)} training runs evaluated in {time.monotonic() - t0:.0f} s")
    runs.pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
