"""The confirmation rule, measured: false alarms, detection and runs used at realistic noise.

    python -m scripts.bench_confirmation [--healthy 200] [--regressed 100] [--mode realistic] [--suites grpo,opd]

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
import json
import math
import re
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from multiprocessing import Pool
from pathlib import Path
from typing import Any, Callable

from rl_verify.core import confirm, spread
from rl_verify.core.live import aborted_result, confirming
from rl_verify.core.model import SuiteResult
from rl_verify.core.tracker import TrackerFeed
from rl_verify.engines import engine_of, load_suite
from simulator.common import load_curves

ROOT = Path(__file__).resolve().parents[1]
CHECKER_DIR = ROOT / "simulator" / "xtuner_checkout" / "autotest"
KL, GSM, REWARDS = "distillation/reduced_distillation_kl", "eval/gsm8k/acc", "response/rewards/mean"


CURVES = load_curves()  # the simulated checkout's curves module, loaded by path


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


_SCALED = re.compile(r"^(?P<kind>\w+) x(?P<scale>[0-9.]+) from step (?P<step>\d+)$")


def scaled(regression: str, scale: float, from_step: int) -> str:
    """The scenario name of a simulated regression kind at ``scale`` x its shifts from step ``from_step`` on
    (``curves.run_rows``' regression_scale / regression_from, as the simulated bisection history's culprit)."""
    return f"{regression} x{scale:.6g} from step {int(from_step)}"


def _scenario(suite: str, name: str) -> tuple[str, Any, Any]:
    """``(name, regression, shift)`` of a scenario: one of SCENARIOS, or a :func:`scaled` name (its regression
    then is ``(kind, scale, from_step)``)."""
    for scenario in SCENARIOS[suite]:
        if scenario[0] == name:
            return scenario
    match = _SCALED.match(name)
    if match is None or match["kind"] not in CURVES.REGRESSIONS:
        raise KeyError(f"unknown scenario {name!r} of suite {suite}")
    return name, (match["kind"], float(match["scale"]), int(match["step"])), None


def _seeds(verification: int | tuple[str, str], attempt: int) -> tuple[str, str]:
    """(the run's seed, the baseline error's seed) of one run. A verification is an int (its own baseline
    error draw), ``("night", i, n)``: the n-th healthy night before verification i on its node (its baseline
    error), ``(baseline, probe)``: verifications of one bisection share their node's baseline error; ``("on-node",
    node, i)`` and ``("node-night", node, n)``: verification i and the n-th healthy night of a node that several
    verifications share (its baseline error, its nights)."""
    if isinstance(verification, (tuple, list)) and verification[0] == "on-node":  # ("on-node", node, i)
        _, node, index = verification
        return f"node{node}-{index}-{attempt}", f"node{node}"
    if isinstance(verification, (tuple, list)) and verification[0] == "node-night":  # ("node-night", node, n)
        _, node, night = verification
        return f"node{node}-night{night}-{attempt}", f"node{node}"
    if isinstance(verification, (tuple, list)) and len(verification) == 3:
        _, index, night = verification
        return f"bench-{index}-night{night}-{attempt}", f"bench-{index}"
    if isinstance(verification, (tuple, list)):
        base, probe = verification
        return f"bisect-{base}-{probe}-{attempt}", f"bisect-{base}"
    return f"bench-{verification}-{attempt}", f"bench-{verification}"


def _tail(ratio: float = 1.0, correlation: float = 0.0) -> tuple:
    """The end of a run's cache key: the node's true spread over the assumed one and its step-to-step correlation
    (issue 51), left out at their defaults (the keys of the independent, assumed-spread node stay as before)."""
    if correlation:
        return (ratio, correlation)
    return (ratio,) if ratio != 1.0 else ()


def _rows(suite: str, regression: Any, shift: Any, verification: Any, attempt: int, mode: str,
          ratio: float = 1.0, correlation: float = 0.0) -> list[dict]:
    seed, error_seed = _seeds(verification, attempt)
    kind, shape = regression, {}
    if isinstance(regression, tuple):
        kind, scale, from_step = regression
        shape = {"regression_scale": scale, "regression_from": from_step}
    rows = CURVES.run_rows(suite, seed, kind, mode, eval_every=EVAL_EVERY[suite], baseline_error_seed=error_seed,
                           spread_ratio=ratio, correlation=correlation, **shape)
    rows = [r for r in rows if r["step"] == 0 or "response/rewards/mean" in r]  # mini-batch rows: never read
    return shift(rows) if shift else rows


def _baseline(suite: str, verification: Any, mode: str, ratio: float = 1.0, correlation: float = 0.0) -> bytes:
    rows = CURVES.baseline_rows(suite, mode, baseline_error_seed=_seeds(verification, 0)[1], spread_ratio=ratio,
                                correlation=correlation)
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _evaluate(args: tuple) -> tuple[tuple, dict]:
    """One run of one verification, through the engine: (key, its RunPoints as a dict + the abort step).

    ``confirms`` (a repeat: the first run's breached metrics and directions): as in the DAG's repeats, only a
    certain FAIL of one of them stops the run early (``core.live.confirming``)."""
    suite, index, attempt, scenario, mode, confirms, *rest = args
    ratio = rest[0] if rest else 1.0  # the node's true spread over the assumed one (curves.check_spread_ratio)
    correlation = rest[1] if len(rest) > 1 else 0.0  # its noise's step-to-step correlation (issue 51)
    name, regression, shift = _scenario(suite, scenario)
    spec = load_suite(suite)
    engine = engine_of(spec)
    rows = _rows(suite, regression, shift, index, attempt, mode, ratio, correlation)
    baseline = _baseline(suite, index, mode, ratio, correlation)
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
        elif isinstance(index, (tuple, list)) and index[0] in ("night", "node-night"):
            # A healthy night is kept for its points alone (the history pools their differences, whatever the
            # night's verdict): no comparison, no checker subprocess.
            result = SuiteResult(suite=suite, verdict="PASS", failure_class=None, checks=[])
        else:
            result = engine.compare_archived(spec, folder, folder / "out", {"wall_time_s": None}, "bench", {},
                                            plot=False)
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

    def get(self, keys: list[tuple]) -> None:
        """Evaluate the runs ``(suite, verification, attempt, scenario, stop[, ratio])`` not yet kept; ``stop`` is
        the repeat's ``core.confirm.stop_early`` as JSON ("" for a first run), ``ratio`` the node's true spread over
        the assumed one (default 1.0)."""
        todo = [k for k in dict.fromkeys(keys) if k not in self.cache]
        args = [(*k[:4], self.mode, json.loads(k[4]) if k[4] else None, *k[5:]) for k in todo]
        for (key, value), k in zip(self.pool.imap(_evaluate, args, chunksize=4), todo):
            self.cache[k] = value


#: The spread key every simulated night of a bench node shares (``orchestration.spread_history.spread_key``).
BENCH_KEY = {"bench": True}


def history(runs: Runs, suite: str, indices: list[int], nights: int, ratio: float,
            correlation: float = 0.0) -> dict[int, list[spread.Past]]:
    """Per verification: ``nights`` healthy nights on its node before it (its baseline error, the same true
    spread), one run each, each through the engine like any first run, as the spread history would hold them."""
    if not nights:
        return {i: [] for i in indices}
    keys = {(i, n): (suite, ("night", i, n), 0, "healthy", "", ratio, *_tail(ratio, correlation)[1:])
            for i in indices for n in range(nights)}
    runs.get(list(keys.values()))
    today = datetime(2026, 12, 4, tzinfo=timezone.utc)
    return {i: [spread.Past(f"night-{n}", BENCH_KEY, confirm.PASS, today - timedelta(days=nights - n),
                            (_points(runs.cache[keys[(i, n)]]),)) for n in range(nights)] for i in indices}


def decide_all(runs: Runs, verifications: list[tuple[str, Any, str]], rule: confirm.Rule,
               spreads: dict[str, confirm.Spread | None], ratio: float = 1.0,
               pasts: dict[Any, list[spread.Past]] | None = None,
               learn: bool = True, correlation: float = 0.0) -> dict[tuple[str, Any, str], tuple[str, list[tuple]]]:
    """Verifications ``(suite, verification, scenario)`` decided by ``core.confirm`` as the DAG does: the first
    run, then repeats (each stopped early only as ``confirm.stop_early`` allows) until ``confirm.decide`` gives an
    outcome. With ``learn`` (default), every decision and stop uses the spread the DAG would: the version's,
    learned from the repeats so far and ``pasts[verification]`` (``core.spread.learn``); without, the version's.
    Returns, per verification, its outcome and the cache keys of its runs (first run first), evaluated together in
    the pool, one attempt at a time."""
    alive = list(dict.fromkeys(verifications))
    keys_of: dict[tuple, list[tuple]] = {v: [] for v in alive}
    outcomes: dict[tuple, str] = {}
    tail = _tail(ratio, correlation)
    runs.get([(suite, i, 0, scenario, "", *tail) for suite, i, scenario in alive])
    firsts = {v: _points(runs.cache[(v[0], v[1], 0, v[2], "", *tail)]) for v in alive}
    repeats: dict[tuple, list[confirm.RunPoints]] = {v: [] for v in alive}

    def spread_of(v: tuple) -> confirm.Spread | None:
        prior = spreads[v[0]]
        if not learn or prior is None:
            return prior
        return spread.learn(prior, repeats[v], (pasts or {}).get(v[1], []))

    attempt = 0
    while alive:
        keys = {v: (v[0], v[1], attempt, v[2],
                    json.dumps(confirm.stop_early(firsts[v], spread_of(v), rule), sort_keys=True) if attempt else "",
                    *tail) for v in alive}
        runs.get(list(keys.values()))
        still = []
        for v in alive:
            keys_of[v].append(keys[v])
            if attempt:
                repeats[v].append(_points(runs.cache[keys[v]]))
            decision = confirm.decide(firsts[v], repeats[v], spread_of(v), rule)
            if decision.outcome is None:
                still.append(v)
            else:
                outcomes[v] = decision.outcome
        alive, attempt = still, attempt + 1
    return {v: (outcomes[v], keys_of[v]) for v in keys_of}


def node_history(runs: Runs, suite: str, nodes: int, nights: int, ratio: float,
                 correlation: float = 0.0) -> dict[int, list[spread.Past]]:
    """Per node of ``nodes``: its ``nights`` healthy nights, one run each (the verifications on that node learn
    from them), as :func:`history` keeps them."""
    keys = {(k, n): (suite, ("node-night", k, n), 0, "healthy", "", ratio, *_tail(ratio, correlation)[1:])
            for k in range(nodes) for n in range(nights)}
    runs.get(list(keys.values()))
    today = datetime(2026, 12, 4, tzinfo=timezone.utc)
    return {k: [spread.Past(f"night-{n}", BENCH_KEY, confirm.PASS, today - timedelta(days=nights - n),
                            (_points(runs.cache[keys[(k, n)]]),)) for n in range(nights)] for k in range(nodes)}


def verify(runs: Runs, suite: str, scenario: str, count: int, rule: confirm.Rule,
           spread_: confirm.Spread | None, ratio: float = 1.0, nights: int | None = None,
           correlation: float = 0.0, per_node: int = 1) -> dict[str, float]:
    """``count`` verifications of one scenario under ``rule``: outcome rates and mean runs. ``nights`` None: the
    rule as before issue 34 (the version's spread taken as exact); 0: learned from the repeats alone (cold);
    n: and from n healthy nights of history on the same node. ``per_node`` > 1: that many verifications share a
    node (its baseline error and its nights), as a node verifies commit after commit: the nights cost 1/per_node
    of the runs."""
    if per_node > 1:
        ids: list[Any] = [("on-node", i // per_node, i) for i in range(count)]
        by_node = node_history(runs, suite, -(-count // per_node), nights or 0, ratio, correlation) \
            if nights and spread_ is not None else {}
        pasts = {v: by_node.get(v[1], []) for v in ids} if by_node else {}
    else:
        ids = list(range(count))
        pasts = history(runs, suite, ids, nights or 0, ratio, correlation) if nights and spread_ is not None else {}
    decided = decide_all(runs, [(suite, i, scenario) for i in ids], rule, {suite: spread_}, ratio, pasts,
                         learn=nights is not None, correlation=correlation)
    outcomes = {v[1]: outcome for v, (outcome, _) in decided.items()}
    repeats = {v[1]: keys[1:] for v, (_, keys) in decided.items()}
    firsts = {v[1]: _points(runs.cache[keys[0]]) for v, (_, keys) in decided.items()}
    first_fail = sum(firsts[i].verdict == "FAIL" for i in ids) / count
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


def correlation_grid(runs: Runs, suites: list[str], rule: confirm.Rule, spreads: dict[str, confirm.Spread | None],
                     correlations: list[float], ratios: list[float], healthy: int, regressed: int,
                     nights: int, per_node: int = 10) -> None:
    """Issue 51: healthy verifications on a node whose noise persists from step to step (AR(1) with each
    correlation, at each true/assumed spread), cold and after ``nights`` healthy nights, and detection of every
    simulated regression at each correlation (assumed spread, after the nights). ``per_node`` verifications share a
    node (its baseline error, its nights)."""
    if not correlations:
        return
    print("Correlated noise (issue 51): the node's run noise on every training metric AR(1) from step to step with "
          "the given correlation (the same marginal sigma; eval accuracies independent), the baseline's own error "
          "alike. The rule learns the correlation from the repeats and the nights (cold: the conservative prior "
          f"{spread.CORRELATION_PRIOR:g}). {per_node} verifications share a node: its baseline error and its "
          f"{nights} nights.\n")
    print("| suite | step-to-step correlation | true/assumed spread | rule | verifications | single-run FAIL | "
          "final FAIL | INCONCLUSIVE | mean runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for suite in suites:
        for rho in correlations:
            for ratio in ratios:
                for label, night_count in (("cold", 0), (f"{nights} nights", nights)):
                    r = verify(runs, suite, "healthy", healthy, rule, spreads[suite], ratio, night_count, rho,
                               per_node)
                    print(f"| {suite} | {rho:g} | {ratio:g} | {label} | {healthy} | {_ci(r['first_fail'], healthy)} | "
                          f"{_ci(r['final_fail'], healthy)} | {r['inconclusive']:.1%} | {r['runs']:.2f} |",
                          flush=True)
    print(f"\nRegressions on a correlated node (assumed spread, {nights} nights): detection = a final FAIL.\n")
    print("| suite | scenario | step-to-step correlation | verifications | detection | INCONCLUSIVE | mean runs |")
    print("|---|---|---|---|---|---|---|")
    for suite in suites:
        for name, _, _ in SCENARIOS[suite][1:]:
            for rho in correlations:
                r = verify(runs, suite, name, regressed, rule, spreads[suite], 1.0, nights, rho, per_node)
                print(f"| {suite} | {name} | {rho:g} | {regressed} | {_ci(r['final_fail'], regressed)} | "
                      f"{r['inconclusive']:.1%} | {r['runs']:.2f} |", flush=True)
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthy", type=int, default=200, help="healthy verifications per suite")
    parser.add_argument("--regressed", type=int, default=100, help="verifications per regression")
    parser.add_argument("--mode", default="realistic", help="the simulator's noise mode (realistic, realistic-t)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ratios", default="0.8,1.0,1.25,1.5",
                        help="true/assumed spreads to measure healthy verifications at (comma-separated)")
    parser.add_argument("--nights", type=int, default=20, help="healthy nights of spread history (issue 34)")
    parser.add_argument("--suites", default=",".join(SCENARIOS),
                        help=f"comma-separated suites to measure (default: all, {','.join(SCENARIOS)}); the "
                             "trade-off table needs opd")
    parser.add_argument("--correlations", default="0,0.5,0.7,0.9,0.95",
                        help="step-to-step correlations of the node's noise for the correlated-noise grid (issue 51)")
    parser.add_argument("--grid-ratios", default="1.0,1.5", help="true/assumed spreads of the correlated-noise grid")
    parser.add_argument("--grid-only", action="store_true", help="only the correlated-noise grid (issue 51)")
    parser.add_argument("--per-node", type=int, default=10,
                        help="correlated-noise grid: verifications that share a node (its baseline error and nights)")
    args = parser.parse_args(argv)
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = sorted(set(suites) - set(SCENARIOS))
    if unknown or not suites:
        parser.error(f"--suites {args.suites!r}: unknown suite(s) {unknown or '(none given)'}; "
                     f"choose from {', '.join(SCENARIOS)}")
    t0 = time.monotonic()
    runs = Runs(args.mode, args.workers)
    rule = confirm.Rule()
    spreads = {}
    for suite in suites:
        spec = load_suite(suite)
        provenance, _ = engine_of(spec).shipped(spec)
        spreads[suite] = engine_of(spec).spread(spec, provenance.model_dump(mode="json"))
    exact = {s: None if sp is None else replace(sp, df={}) for s, sp in spreads.items()}
    ratios = [float(r) for r in args.ratios.split(",") if r.strip()]
    print(f"Confirmation rule, {args.mode} noise (simulator), shipped baselines (v1); rule: {rule.describe()}.\n")
    correlation_grid(runs, suites, rule, spreads, [float(c) for c in args.correlations.split(",") if c.strip()],
                     [float(r) for r in args.grid_ratios.split(",") if r.strip()], args.healthy, args.regressed,
                     args.nights, args.per_node)
    if args.grid_only:
        print(f"\n{len(runs.cache)} training runs evaluated in {time.monotonic() - t0:.0f} s")
        runs.pool.close()
        return 0
    print("Healthy verifications at a true run-to-run spread of ratio x the assumed one (the simulator's "
          "spread_ratio: run noise and the baseline's own error alike). Rules: 'exact' = before issue 34 (the "
          "version's sigma taken as exact, normal bounds); 'cold' = learned from the repeats alone (Student-t on the "
          f"prior's df); '{args.nights} nights' = and from that many healthy nights on the same node.\n")
    print("| suite | true/assumed spread | rule | verifications | single-run FAIL | final FAIL | INCONCLUSIVE | "
          "mean runs |")
    print("|---|---|---|---|---|---|---|---|")
    for suite in suites:
        for ratio in ratios:
            for label, nights, sp in (("exact", None, exact[suite]), ("cold", 0, spreads[suite]),
                                      (f"{args.nights} nights", args.nights, spreads[suite])):
                if sp is None and nights is not None:
                    label += " (= exact: no spread)"
                r = verify(runs, suite, "healthy", args.healthy, rule, sp, ratio, nights)
                print(f"| {suite} | {ratio:g} | {label} | {args.healthy} | {_ci(r['first_fail'], args.healthy)} | "
                      f"{_ci(r['final_fail'], args.healthy)} | {r['inconclusive']:.1%} | {r['runs']:.2f} |", flush=True)
    print("\nRegressions at a true spread of 1.0 (the assumed one): detection = a final FAIL.\n")
    print("| suite | scenario | verifications | rule | detection | INCONCLUSIVE | mean runs |")
    print("|---|---|---|---|---|---|---|")
    for suite in suites:
        for name, _, _ in SCENARIOS[suite][1:]:
            for label, nights, sp in (("exact", None, exact[suite]), ("cold", 0, spreads[suite]),
                                      (f"{args.nights} nights", args.nights, spreads[suite])):
                r = verify(runs, suite, name, args.regressed, rule, sp, 1.0, nights)
                print(f"| {suite} | {name} | {args.regressed} | {label} | {_ci(r['final_fail'], args.regressed)} | "
                      f"{r['inconclusive']:.1%} | {r['runs']:.2f} |", flush=True)
    if "opd" not in suites:
        print(f"\n{len(runs.cache)} training runs evaluated in {time.monotonic() - t0:.0f} s")
        runs.pool.close()
        return 0
    print(f"\nTrade-off (OPD, true spread 1.0, {args.nights} nights of history; the same runs re-decided): final "
          "FAIL of healthy verifications, detection of the "
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
        healthy = verify(runs, "opd", "healthy", args.healthy, variant, spreads["opd"], 1.0, args.nights)
        detect = [verify(runs, "opd", name, args.regressed, variant, spreads["opd"], 1.0, args.nights)["final_fail"]
                  for name in marginal]
        print(f"| {label} | {healthy['final_fail']:.1%} | {healthy['runs']:.2f} | "
              + " | ".join(f"{d:.1%}" for d in detect) + " |", flush=True)
    print(f"\n{len(runs.cache)} training runs evaluated in {time.monotonic() - t0:.0f} s")
    runs.pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
