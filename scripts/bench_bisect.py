"""Bisection, measured: right culprits, probes, training runs and time at realistic noise (issue 22).

    python -m scripts.bench_bisect [--quick | --positions 20] [--seed 0] [--sizes 1] [--recheck-ends] [--workers 2]

Every bisection is replayed through the real decision code. Its range is n commits after a good one (n = 8, 16,
32), the regression introduced at every position 1..n (``--quick``: 4 random positions per range; ``--positions K``:
K random positions, every one when n <= K; ``make bench``: K = 20), carried by every later commit: the
simulated bisection history's culprit (``simulator.common.BisectLayout``: the OPD
teacher path at ``--sizes`` x one runbook threshold, distillation KL +0.03 per threshold, from step 10). Each
probe is one simulated verification of one commit (``scripts.bench_confirmation.decide_all``: the simulator's
realistic noise through the engine's live check, early abort, the engine's comparison and ``core.confirm``'s rule,
repeats included); the probes of one bisection share their node's baseline error (one golden table), each has
its own run seeds. Its outcome becomes a reading (``core.bisect.reading``) and ``core.bisect.plan`` decides, with
P = 1 and P = 2 free nodes, event by event: whenever a probe ends the planner is asked again (it may launch on
the freed node and stop probes that can no longer change the answer). The P = 1 and P = 2 bisections of one
position see the same runs for the same (commit, k-th probe of it): a paired comparison.

Time at the runbook's scale: a run takes 15 min (OPD; GRPO 40) x the share of its steps it ran (early abort as
the replay measured), on 8 GPUs; a probe's runs follow each other on one node; a stopped probe counts to its stop.
Against it: a person's serial binary search of full runs on the same seeds (each probe the first run's runbook
verdict alone, no repeat, no re-check of the ends, a full 15 min run each).

Ends: by default both come from the record (the nightly's decided FAIL and the last verified PASS of the same
commit, baseline version and fingerprint, as after an automatic start); ``--recheck-ends`` probes them too.
Figures to read, no assertion.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from rl_verify import settings
from rl_verify.core import bisect, confirm
from rl_verify.engines import engine_of, load_suite
from scripts import bench_confirmation as bc
from simulator.common import BisectLayout

RANGES = (8, 16, 32)
SUITE = "opd"
_SPEC = load_suite(SUITE)
#: The runbook's scale, from the suite spec: minutes of one full run, its steps, GPUs of a node.
RUN_MINUTES = {SUITE: _SPEC.run_minutes}
STEPS = {SUITE: _SPEC.expected_steps}
GPUS = _SPEC.node.gpus or settings.GPUS_PER_RUN
HEALTHY = "healthy"  # scripts.bench_confirmation.SCENARIOS


@dataclass
class Result:
    """One bisection: its answer and what it used."""

    right: bool
    exact: bool
    probes: int = 0
    runs: int = 0
    waves: int = 0
    wall_min: float = 0.0
    gpu_min: float = 0.0
    stopped: int = 0
    answer: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _run_minutes(runs: bc.Runs, key: tuple) -> float:
    data = runs.cache[key]
    return RUN_MINUTES[SUITE] * data["steps"] / STEPS[SUITE]


@dataclass
class LaneModel:
    """The bitwise lane in a bisection's probes (issue 33), as the DAG runs it: a probe whose deterministic bits
    over the lane's ``steps`` equal the current reference's is GOOD after ``identical_min`` (no full verification);
    otherwise the lane costs ``differs_min`` and the full verification decides as today, and its PASS makes the
    new reference (``reference_min``). A commit's bits are its numerics version (``numerics``: the positions that
    change numerics) and, from the culprit on, the regression when it shows within the lane's steps
    (``visible``); a regression that shows later is the lane's blind spot (``visible`` False: bit-identical)."""

    numerics: frozenset[int]
    visible: bool
    identical_min: float
    differs_min: float
    reference_min: float

    def bits(self, commit: int, culprit: int) -> tuple[int, bool]:
        return sum(1 for p in self.numerics if p <= commit), self.visible and commit >= culprit


def bisection(n: int, culprit: int, free: int, base: str, scenario: str, record: dict[str, bisect.Reading],
              runs: bc.Runs, lane: LaneModel | None = None) -> Generator[list[tuple], dict, Result]:
    """One bisection, event by event. Yields the verifications it launches (``(suite, (base, probe), scenario)``),
    receives their outcomes (``decide_all``'s), returns its :class:`Result`. With ``lane``, each probe runs the
    bitwise lane first (:class:`LaneModel`); the reference starts as the good end's."""
    commits = [str(i) for i in range(n + 1)]
    readings: dict[str, list[bisect.Reading]] = {}
    probed: dict[str, int] = {}
    running: dict[str, tuple[float, float, bisect.Reading, int]] = {}  # commit -> (start, end, reading, runs)
    now = probes = used = waves = stopped = 0
    gpu = bad_gpu = 0.0  # bad_gpu: what probes that read BAD used (no shortcut to GOOD can save it)
    reference = lane.bits(0, culprit) if lane else None
    while True:
        step = bisect.plan(commits, readings, running.keys(), free - len(running), record=record)
        for c in step.stop:
            start, _, _, n_runs = running.pop(c)
            gpu += (now - start) * GPUS
            stopped += 1
        if step.done:
            answer = step.answer
            assert not running
            right = answer.kind == bisect.CULPRIT and answer.culprit.first <= culprit <= answer.culprit.last
            return Result(right=right and answer.culprit.exact, exact=bool(answer.culprit and answer.culprit.exact),
                          probes=probes, runs=used, waves=waves, wall_min=now, gpu_min=gpu, stopped=stopped,
                          answer=answer.kind, extra={"bad_gpu_min": bad_gpu})
        if step.probe:
            waves += 1
            wanted, lane_min = [], {}
            for c in step.probe:
                k = probed.get(c, 0)
                probed[c] = k + 1
                if lane is not None and lane.bits(int(c), culprit) == reference:
                    running[c] = (now, now + lane.identical_min, bisect.Reading.GOOD, 0)  # PASS (bitwise)
                    probes += 1
                    continue
                lane_min[c] = lane.differs_min if lane is not None else 0.0
                wanted.append((SUITE, (base, f"{c}-{k}"), HEALTHY if int(c) < culprit else scenario))
            outcomes = yield wanted if wanted else []
            for c, v in zip([c for c in step.probe if c in lane_min], wanted):
                outcome, keys = outcomes[v]
                minutes = lane_min[c] + sum(_run_minutes(runs, key) for key in keys)
                reading = bisect.reading(outcome, runs.cache[keys[0]]["failure_class"])
                if lane is not None and reading == bisect.Reading.GOOD:
                    minutes += lane.reference_min  # its PASS makes the new reference (2 runs of the lane's steps)
                    reference = lane.bits(int(c), culprit)
                running[c] = (now, now + minutes, reading, len(keys))
                probes, used = probes + 1, used + len(keys)
        if not running:
            raise RuntimeError(f"bisection of {n} commits (culprit {culprit}, P={free}) stalled: {step}")
        now = min(end for _, end, _, _ in running.values())
        for c in [c for c, (_, end, _, _) in running.items() if end <= now]:
            start, end, reading, n_runs = running.pop(c)
            readings.setdefault(c, []).append(reading)
            gpu += (end - start) * GPUS
            if reading != bisect.Reading.GOOD:
                bad_gpu += (end - start) * GPUS


def person(n: int, culprit: int, base: str, scenario: str, runs: bc.Runs) -> Generator[list[tuple], dict, Result]:
    """A person's serial binary search of full runs: each probe one run, its runbook verdict taken as it is (the
    first run of the same verification the bisection would launch first at that commit)."""
    commits = [str(i) for i in range(n + 1)]
    record = {commits[0]: bisect.Reading.GOOD, commits[-1]: bisect.Reading.BAD}
    readings: dict[str, list[bisect.Reading]] = {}
    probes = 0
    while True:
        step = bisect.plan(commits, readings, (), 1, record=record, settings=bisect.Settings(confirm=1))
        if step.done:
            c = step.answer.culprit
            right = step.answer.kind == bisect.CULPRIT and c.exact and c.first == culprit
            minutes = probes * RUN_MINUTES[SUITE]
            return Result(right=right, exact=bool(c and c.exact), probes=probes, runs=probes, waves=probes,
                          wall_min=minutes, gpu_min=minutes * GPUS, answer=step.answer.kind)
        [c] = step.probe
        key = (SUITE, (base, f"{c}-0"), 0, HEALTHY if int(c) < culprit else scenario, "")
        got = yield [key]
        verdict = got[key]["verdict"]
        readings[c] = [bisect.Reading.BAD if verdict == "FAIL" else bisect.Reading.GOOD]
        probes += 1


def drive(gens: list[Generator], runs: bc.Runs, rule: confirm.Rule, spreads: dict) -> list[Result]:
    """Run every bisection in lockstep: each round, the verifications all of them launch are decided together
    (in the pool); a person's single runs are evaluated together too."""
    results: list[Result | None] = [None] * len(gens)
    pending: dict[int, list[tuple]] = {}
    for i, g in enumerate(gens):
        pending[i] = next(g)
    while pending:
        verifications = [v for want in pending.values() for v in want if len(v) == 3]
        singles = [v for want in pending.values() for v in want if len(v) == 5]
        decided = bc.decide_all(runs, verifications, rule, spreads) if verifications else {}
        if singles:
            runs.get(singles)
        nxt: dict[int, list[tuple]] = {}
        for i, want in pending.items():
            reply = {v: decided[v] if len(v) == 3 else runs.cache[v] for v in want}
            try:
                nxt[i] = gens[i].send(reply)
            except StopIteration as stop:
                results[i] = stop.value
        pending = nxt
    return [r for r in results if r is not None]


def _h(minutes: float) -> str:
    return f"{minutes / 60:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 random positions per range size instead of every one")
    parser.add_argument("--positions", type=int, default=0,
                        help="at most this many random positions per range size (0: every position)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the runs and the --quick positions")
    parser.add_argument("--sizes", default="1", help="regression sizes in thresholds, comma-separated (e.g. 1,1.5)")
    parser.add_argument("--recheck-ends", action="store_true", help="probe both ends (default: taken from the record)")
    parser.add_argument("--mode", default="realistic", help="the simulator's noise mode (realistic, realistic-t)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    layout = BisectLayout()
    runs = bc.Runs(args.mode, args.workers)
    rule = confirm.Rule()
    spec = load_suite(SUITE)
    provenance, _ = engine_of(spec).shipped(spec)
    spreads = {SUITE: engine_of(spec).spread(spec, provenance.model_dump(mode="json"))}
    rng = random.Random(args.seed)
    sizes = [float(s) for s in args.sizes.split(",")]
    print(f"Bisection, {args.mode} noise (simulator), OPD, the regression of the simulated history "
          f"({layout.regression} path from step {layout.from_step}) at {', '.join(f'{s:g}' for s in sizes)} "
          f"threshold(s); ends {'re-checked' if args.recheck_ends else 'from the record'}; seed {args.seed}; "
          f"confirmation rule: budget {rule.budget}; planner: {bisect.Settings()}.")
    print(f"Time at the runbook's scale: {RUN_MINUTES[SUITE]:g} min per full OPD run (early abort as replayed), "
          f"{GPUS} GPUs a node. Person: serial binary search of full runs, one run's runbook verdict per probe.\n")
    print("| size | n | P | positions | right culprit | probes mean (max) | runs mean (max) | ceil(log2 n) | "
          "planner worst case probes / rounds | waves mean (max) | wall h mean (max) | GPU h mean | "
          "person: runs | person wall h | person GPU h | person right |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        scenario = bc.scaled(layout.regression, layout.scale * size, layout.from_step)
        for n in RANGES:
            most = 4 if args.quick else args.positions or n
            positions = list(range(1, n + 1)) if most >= n else sorted(rng.sample(range(1, n + 1), most))
            commits = [str(i) for i in range(n + 1)]
            record = {} if args.recheck_ends else {commits[0]: bisect.Reading.GOOD, commits[-1]: bisect.Reading.BAD}
            gens: list[Generator] = []
            for free in (1, 2):
                gens += [bisection(n, c, free, f"s{args.seed}-x{size:g}-n{n}-c{c}", scenario, record, runs)
                         for c in positions]
            gens += [person(n, c, f"s{args.seed}-x{size:g}-n{n}-c{c}", scenario, runs) for c in positions]
            results = drive(gens, runs, rule, spreads)
            k = len(positions)
            people = results[2 * k:]
            for free in (1, 2):
                rs = results[(free - 1) * k:free * k]
                worst = bisect.worst_case(n, free, good_known=not args.recheck_ends, bad_known=not args.recheck_ends)
                right = sum(r.right for r in rs)
                print(f"| {size:g} | {n} | {free} | {k} | {right}/{k} ({right / k:.0%}) | "
                      f"{sum(r.probes for r in rs) / k:.1f} ({max(r.probes for r in rs)}) | "
                      f"{sum(r.runs for r in rs) / k:.1f} ({max(r.runs for r in rs)}) | {math.ceil(math.log2(n))} | "
                      f"{worst.probes} / {worst.rounds} | "
                      f"{sum(r.waves for r in rs) / k:.1f} ({max(r.waves for r in rs)}) | "
                      f"{_h(sum(r.wall_min for r in rs) / k)} ({_h(max(r.wall_min for r in rs))}) | "
                      f"{_h(sum(r.gpu_min for r in rs) / k)} | "
                      f"{sum(p.runs for p in people) / k:.1f} | {_h(sum(p.wall_min for p in people) / k)} | "
                      f"{_h(sum(p.gpu_min for p in people) / k)} | "
                      f"{sum(p.right for p in people)}/{k} ({sum(p.right for p in people) / k:.0%}) |", flush=True)
                wrong = [(c, r.answer) for c, r in zip(positions, rs) if not r.right]
                if wrong:
                    print(f"|  |  |  |  | wrong at positions {wrong} |  |  |  |  |  |  |  |  |  |  |  |")
    print(f"\n{len(runs.cache)} training runs evaluated in {time.monotonic() - t0:.0f} s")
    runs.pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
