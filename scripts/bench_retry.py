"""Infrastructure retries, measured (issue 55): how many verifications and bisections still reach an accuracy
verdict when the simulated node's infrastructure faults strike, what the retries cost in GPU time, and that the
accuracy figures do not move.

    python -m scripts.bench_retry [--verifications 4000] [--bisections 1000] [--seed 1]

Each training attempt meets one fault kind of the simulated node with probability ``p`` (``--rates``, default 5%
and 20% an attempt): crash at launch, a teacher that did not come up (OPD), a hang (the node-side stall watchdog),
Slurm's preemption (``transient``: independent from attempt to attempt), and GPUs held by a foreign process (the
node's own fault: it stays for the verification). Whether a failed attempt trains again is decided by the real
policy code (``core.retry.classify`` over the failure's words as the training task sees them, then
``core.retry.decide`` with the shipped ``suites/data/infra_retry.json``), for 0 (before issue 55), the shipped 1,
and 2 retries. An SSH run has one eligible node, so a node fault is never retried.

Time at the runbook's scale (seed/runbook.md): a full GRPO run ~40 min (45 steps), an OPD run ~15 min (25 steps),
on one 8-GPU node. What a failed attempt costs before it ends (stated assumptions, not measurements): a crash at
launch 2 min (Ray and the model load) and OPD's two teachers 3 min more; a teacher that never comes up the launch
script's TEACHER_STARTUP_TIMEOUT_S, 600 s; a hang the steps before it (uniform) plus the stall watchdog
(RL_VERIFY_STALL_TIMEOUT_S, 900 s); a preemption the steps before it (uniform); GPUs held: refused at the launch,
0. Each verification trains one run per suite (the confirmation's mean runs at the assumed spread is 1.00: the
repeats are rare and meet the same faults).

Bisections: 16 commits after a verified PASS, the culprit at a uniform position, both ends from the record (as
after a nightly's reproduced FAIL); ``core.bisect.plan`` on one node, each probe's reading its commit's true one
(GOOD before the culprit, BAD from it) unless its training ended infrastructure after its retries (SKIP). Counted:
bisections whose answer is the culprit itself (not "one of a..b").

Accuracy figures: a retry trains the same run (its seed) again in a new job folder and a failed attempt never
reaches the confirmation rule (no points), so the rule sees the runs it would have seen with no fault. Shown on
the same seeds: false FAIL and detection of ``core.confirm.simulate`` among the verifications that reached a verdict,
faults and retries on, against no fault at all.

Figures to read, no assertion.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from rl_verify.core import bisect, retry
from rl_verify.engines import load_suite
from rl_verify.orchestration.training_job import retry_policy

#: Minutes a failed attempt of each fault kind costs on the node (see the module docstring), by suite.
LAUNCH_MIN = {"grpo": 2.0, "opd": 5.0}
TEACHER_TIMEOUT_MIN = 600 / 60
STALL_MIN = 900 / 60
GPUS = 8
#: fault kind -> (what the training task's failure says, the log's last line, Slurm's end, persistent on the node)
FAULTS = {
    "crash at launch": ("the {suite} job exited 1 (its last line: RuntimeError: NCCL error: unhandled system error)",
                        "", None, False),
    "teacher not up": ("the opd job exited 1 (its last line: teacher geo3k did not come up within 600 s)", "", None,
                       False),
    "hang": ("STALLED at step {step}: the tracker stopped growing", "", None, False),
    "preempted": ("the {suite} job: Slurm ended the job before the training did: preempted (PREEMPTED outside)", "",
                  "preempted", False),
    "GPUs held": ("busy: GPU memory held by a foreign process — not launching a second training on this node", "",
                  None, True),
}


@dataclass
class Tally:
    verdicts: int = 0
    trainings: int = 0
    wasted_node_min: float = 0.0
    first_try_node_min: float = 0.0


def run_minutes(suite: str) -> float:
    return float(load_suite(suite).run_minutes)


def failed_cost(kind: str, suite: str, rng: random.Random) -> tuple[float, int]:
    """(node-minutes a failed attempt of ``kind`` used, the step it failed at)."""
    steps = load_suite(suite).expected_steps
    step = rng.randint(1, steps)
    full = run_minutes(suite)
    if kind == "crash at launch":
        return LAUNCH_MIN[suite], 0
    if kind == "teacher not up":
        return LAUNCH_MIN["grpo"] + TEACHER_TIMEOUT_MIN, 0
    if kind == "hang":
        return LAUNCH_MIN[suite] + full * (step - 1) / steps + STALL_MIN, step
    if kind == "preempted":
        return LAUNCH_MIN[suite] + full * step / steps, step
    return 0.0, 0


def train(suite: str, kind: str, p: float, policy: retry.Policy, rng: random.Random) -> tuple[bool, int, float]:
    """One suite's training under fault ``kind`` striking each attempt with probability ``p``: (reached a verdict,
    trainings started, node-minutes spent on failed attempts)."""
    said, tail, ended, persistent = FAULTS[kind]
    node_fault = persistent and rng.random() < p
    earlier: list[dict] = []
    wasted = 0.0
    while True:
        strikes = node_fault or (not persistent and rng.random() < p)
        if not strikes:
            return True, len(earlier) + 1, wasted
        cost, step = failed_cost(kind, suite, rng)
        wasted += cost
        cause = retry.classify(policy, said.format(suite=suite, step=step), tail, scheduler_end=ended)
        go, _ = retry.decide(policy, earlier, cause, "rl_gpu_node")
        earlier.append({"kind": cause.kind, "node": "rl_gpu_node"})
        if not go:
            return False, len(earlier), wasted


def verifications(kind: str, p: float, policy: retry.Policy, n: int, seed: int) -> dict[str, float]:
    suites = ["opd"] if kind == "teacher not up" else ["grpo", "opd"]
    rng = random.Random(seed)
    reached = trainings = 0
    wasted = full = 0.0
    for _ in range(n):
        ok = True
        for suite in suites:
            got, started, spent = train(suite, kind, p, policy, rng)
            ok &= got
            trainings += started
            wasted += spent
            full += run_minutes(suite) if got else 0.0
        reached += ok
    return {"reached": reached / n, "wasted_gpu_h": wasted * GPUS / 60 / n, "full_gpu_h": full * GPUS / 60 / n,
            "trainings": trainings / n}


def bisections(kind: str, p: float, policy: retry.Policy, n: int, seed: int, commits: int = 16) -> dict[str, float]:
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(commits + 1)]
    exact = probes = 0
    wasted = full = 0.0
    for _ in range(n):
        culprit = rng.randint(1, commits)
        readings: dict[str, list[bisect.Reading]] = {}
        record = {names[0]: bisect.Reading.GOOD, names[-1]: bisect.Reading.BAD}
        while True:
            plan = bisect.plan(names, readings, free=1, record=record)
            if plan.answer is not None:
                break
            commit = plan.probe[0]
            got, _, spent = train("opd", kind, p, policy, rng)
            wasted += spent
            full += run_minutes("opd") if got else 0.0
            probes += 1
            index = names.index(commit)
            reading = (bisect.Reading.BAD if index >= culprit else bisect.Reading.GOOD) if got else bisect.Reading.SKIP
            readings.setdefault(commit, []).append(reading)
        found = plan.answer.culprit
        exact += found is not None and found.commits == (names[culprit],)
    return {"exact": exact / n, "probes": probes / n, "wasted_gpu_h": wasted * GPUS / 60 / n,
            "full_gpu_h": full * GPUS / 60 / n}


def accuracy_figures(n: int, seed: int, kind: str, p: float, policy: retry.Policy) -> dict[str, tuple[float, float]]:
    """False FAIL and detection (a 1.2-threshold shift; noise sigma 0.7 threshold) of the confirmation rule over
    ``n`` verifications (each its own seed), with no fault, and among those that still reached a verdict with
    ``kind`` at ``p`` and ``policy``: a retry trains the same run (its seed), so a verification's outcome is its
    seed's either way."""
    from rl_verify.core import confirm

    layout = confirm.Layout(thresholds={"m": 1.0}, steps={"m": tuple(range(0, 30, 5))})
    spread = confirm.Spread(sigma={"m": 0.7}, runs=5, source="bench", df={"m": 20.0})
    out = {}
    for name, shift in (("false FAIL", None), ("detection", {"m": 1.2})):
        rng = random.Random(seed)
        failing, reached = [], []
        for i in range(n):
            rates = confirm.simulate(layout, spread, confirm.Rule(budget=2), shift=shift, samples=1, seed=seed + i,
                                     budget=2)
            failing.append(rates[confirm.FAIL] + rates[confirm.REPRODUCED] > 0.5)
            reached.append(train("opd", kind, p, policy, rng)[0])
        kept = [f for f, r in zip(failing, reached) if r]
        out[name] = (sum(failing) / n, sum(kept) / max(1, len(kept)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifications", type=int, default=4000)
    parser.add_argument("--bisections", type=int, default=1000)
    parser.add_argument("--rates", default="0.05,0.2", help="chances a fault strikes an attempt, comma-separated")
    parser.add_argument("--accuracy", type=int, default=1000, help="verifications for the accuracy figures")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    shipped = retry_policy()
    policies = {f"{k} retr{'y' if k == 1 else 'ies'}": retry.Policy(
        retries=k, delay_s=shipped.delay_s, patterns=shipped.patterns, scheduler_ends=shipped.scheduler_ends,
        default=shipped.default) for k in (0, shipped.retries, 2)}
    rates = [float(r) for r in args.rates.split(",")]
    print(f"Infrastructure retries (issue 55): {args.verifications} verifications (GRPO + OPD) and {args.bisections} "
          f"16-commit OPD bisections per cell, seed {args.seed}; policy {', '.join(policies)} (shipped: "
          f"{shipped.retries}).\n")
    print("| fault | p an attempt | policy | verifications reaching an accuracy verdict | trainings started | "
          "GPU-h / verification (of which failed attempts) | bisections naming the culprit | probes | GPU-h / "
          "bisection (of which failed attempts) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in FAULTS:
        for p in rates:
            for name, policy in policies.items():
                v = verifications(kind, p, policy, args.verifications, args.seed)
                b = bisections(kind, p, policy, args.bisections, args.seed)
                print(f"| {kind} | {p:.0%} | {name} | {v['reached']:.1%} | {v['trainings']:.2f} | "
                      f"{v['full_gpu_h'] + v['wasted_gpu_h']:.2f} ({v['wasted_gpu_h']:.2f}) | {b['exact']:.1%} | "
                      f"{b['probes']:.1f} | {b['full_gpu_h'] + b['wasted_gpu_h']:.1f} ({b['wasted_gpu_h']:.2f}) |")
    print()
    for kind in ("crash at launch", "hang"):
        figures = accuracy_figures(args.accuracy, args.seed, kind, max(rates), shipped)
        for name, (clean, faulted) in figures.items():
            print(f"Accuracy, {name} of the confirmation rule over {args.accuracy} verifications (normal model, each "
                  f"its own seed): no fault {clean:.2%}; {kind} at {max(rates):.0%} an attempt with the shipped "
                  f"policy, among the verdicts reached {faulted:.2%} (difference {faulted - clean:+.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
