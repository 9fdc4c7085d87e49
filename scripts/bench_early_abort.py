"""Early abort, measured: where the verdict comes for each simulated regression, and false aborts.

    python -m scripts.bench_early_abort [--seeds 20]

Replays trackers made by the simulated node's own curves (the rows its replay trainer writes:
step-0 eval row, one summary row per step, the regression branches' shifts) through the live check,
one step at a time, the way the trigger sees them grow, and prints:

* per regression and suite: the step where the FAIL became certain, the training time to that step
  (the tracker's own ``time/step`` values, i.e. the runbook's scale: ~40 s/step for GRPO) against the
  whole run's, their ratio, the final comparison's verdict and whether it names the same metrics;
* over ``--seeds`` healthy seeded runs per suite, plain and with noise spikes (p80 metrics breaching
  at one step fewer than decide them, at random steps): the final verdicts and the false aborts
  (aborted although the full comparison is PASS; must be 0).

Times exclude what is the same with and without early abort (approval, launch, start-up before
step 1, fetch, compare, report) and the poll interval (5 s). No assertion: figures to read.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from rl_verify.engines import engine_of
from rl_verify.engines.grpo import compare_grpo, percentile_fail_count
from rl_verify.engines.opd import compare_opd
from rl_verify.engines import load_suite
from rl_verify.core.tracker import TrackerFeed
from simulator import checkout as sim_checkout
from simulator.common import load_curves

ROOT = Path(__file__).resolve().parents[1]
CHECKER_DIR = ROOT / "simulator" / "xtuner_checkout" / "autotest"
REGRESSIONS = {"grpo": ["init", "divergence", "mismatch"], "opd": ["init", "divergence", "teacher", "rewards"]}
EVAL_EVERY = {"grpo": 15, "opd": 5}


def _curves():
    """The simulated checkout's curves module (it lives in the checkout, not in a package): the simulator's one
    loader, ``simulator.common.load_curves``."""
    return load_curves()


def run_rows(curves, suite: str, regression: str | None, seed: str, steps: int, mode: str = "bounded") -> list[dict]:
    """The rows the simulated node's trainer writes for this run (``curves.run_rows``: the same
    function), without its mini-batch rows (no step-summary marker; nothing here reads them)."""
    rows = curves.run_rows(suite, seed, regression, mode, steps=steps, eval_every=EVAL_EVERY[suite])
    return [r for r in rows if r["step"] == 0 or "response/rewards/mean" in r]


def spiked(rows: list[dict], suite: str, seed: int) -> list[dict]:
    """Healthy rows with noise spikes: each p80 metric breaches at one step fewer than decide it."""
    if suite != "grpo":
        return rows
    spec = load_suite(suite)
    rng = random.Random(seed)
    out = [dict(r) for r in rows]
    for metric, bump in (("response/rewards/mean", 0.12), ("response/response_len/mean", None)):
        steps = rng.sample(range(1, spec.expected_steps + 1), percentile_fail_count(spec.expected_steps, 80) - 1)
        for row in out:
            if row["step"] in steps:
                row[metric] = row[metric] + bump if bump else row[metric] * 1.15
    return out


def replay(suite: str, rows: list[dict], baseline) -> tuple[int | None, float, float, list[str]]:
    """(step of the certain FAIL or None, training seconds to it, whole run's seconds, metrics named)."""
    spec = load_suite(suite)
    checker = engine_of(spec).live(spec, baseline, None)
    feed, elapsed = TrackerFeed("tracker.jsonl"), 0.0
    total = sum(r.get("time/step", 0.0) for r in rows)
    for row in rows:
        elapsed += row.get("time/step", 0.0)
        feed.feed((json.dumps(row) + "\n").encode())
        result = checker.check(feed.tracker, elapsed)
        if result.certain:
            return row["step"], elapsed, total, sorted({c.metric for c in result.certain})
    return None, total, total, []


def final(suite: str, rows: list[dict], base_path: Path, folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    cur = folder / "cur.jsonl"
    cur.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if suite == "grpo":
        return compare_grpo(base_path, cur, CHECKER_DIR, folder / "out", plot=False)
    return compare_opd(cur, folder / "out", plot=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)
    curves = _curves()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_path = tmp / "grpo-baseline.jsonl"
        base_path.write_text("".join(json.dumps(r) + "\n" for r in sim_checkout.grpo_baseline_rows(curves)))
        # What the training operator hands the live check: the baseline tracker's bytes (OPD: none).
        baselines = {"grpo": base_path.read_bytes(), "opd": None}

        print("| regression | suite | verdict at step | training time to verdict | whole run | ratio | "
              "final verdict | same metrics |")
        print("|---|---|---|---|---|---|---|---|")
        for suite, regressions in REGRESSIONS.items():
            steps = load_suite(suite).expected_steps
            for regression in regressions:
                rows = run_rows(curves, suite, regression, "bench", steps)
                step, to_verdict, whole, metrics = replay(suite, rows, baselines[suite])
                result = final(suite, rows, base_path, tmp / f"{suite}-{regression}")
                breached = {c.metric for c in result.checks if c.breached}
                same = "yes" if set(metrics) <= breached else f"no ({metrics} vs {sorted(breached)})"
                print(f"| {regression} | {suite} | {step if step is not None else 'end'} of {steps} | "
                      f"{to_verdict / 60:.1f} min | {whole / 60:.1f} min | {to_verdict / whole:.2f} | "
                      f"{result.verdict} ({result.failure_class}) | {same if step is not None else '-'} |")

        print()
        print("| healthy runs | suite | runs | final PASS | aborted | false aborts |")
        print("|---|---|---|---|---|---|")
        for suite in REGRESSIONS:
            steps = load_suite(suite).expected_steps
            for kind in ("plain", "spiked"):
                if kind == "spiked" and suite != "grpo":
                    continue  # OPD is judged at eval points only: there is no count to spike under
                passed = aborted = false = 0
                for seed in range(args.seeds):
                    rows = run_rows(curves, suite, None, f"healthy-{seed}", steps)
                    rows = spiked(rows, suite, seed) if kind == "spiked" else rows
                    step, *_ = replay(suite, rows, baselines[suite])
                    verdict = final(suite, rows, base_path, tmp / f"h-{suite}-{kind}-{seed}").verdict
                    passed += verdict == "PASS"
                    aborted += step is not None
                    false += step is not None and verdict == "PASS"
                print(f"| {kind} | {suite} | {args.seeds} | {passed} | {aborted} | {false} |")

        # What one look costs the triggerer's event loop: the check of a whole run's tracker.
        print()
        for suite in REGRESSIONS:
            spec = load_suite(suite)
            checker = engine_of(spec).live(spec, baselines[suite], None)
            feed = TrackerFeed("tracker.jsonl")
            feed.feed("".join(json.dumps(r) + "\n" for r in run_rows(curves, suite, None, "cost",
                                                                    spec.expected_steps)).encode())
            t0, n = time.process_time(), 200
            for _ in range(n):
                checker.check(feed.tracker, 100.0)
            print(f"live check of a full {spec.expected_steps}-step {suite} tracker: "
                  f"{(time.process_time() - t0) / n * 1000:.2f} ms CPU per poll (poll interval 5 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
