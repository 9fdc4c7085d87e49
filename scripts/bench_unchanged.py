"""The path-aware skip (PASS (unchanged), issue 33) over many seeded commit histories: how many verifications
it answers without a training, the GPU-hours that saves, its false PASS rate and its blind spot.

Each history is a stream of commits drawn (with replacement) from XTuner's real last 400 first-parent commits on main
(``tests/data/xtuner/history.json``, issue 42): their real file lists. The skip decides with the package's own rule:
the shipped specs' ``affects``/``unaffecting`` patterns (``core.paths.affecting``) over the union of the files
changed since the suite's last trained PASS, as ``resolve_commit`` reads them from ``git diff`` (every pattern
matching, as at main's newest commit: ``scripts/bench_shortcuts.py`` replays each commit's own tree).

Assumptions, stated because the answer depends on them:
* a commit touching code a suite reads (``xtuner/``, a suite's launch script, config or checker, its recipe,
  requirements, packaging, patches) carries a regression with probability ``--regression-rate`` (default 3%); a
  regression is verified (FAIL) at the first verification that includes it, and fixed by the next commit;
* a commit touching other code only (another recipe, CI scripts, tools, skills) moves a suite's numbers anyway with
  probability ``--outside-rate`` (default 0.5%), and a docs/CI/tests-only one with ``--hidden-rate`` (default 0.5%:
  a prompt template kept as Markdown): the rule's own false PASS;
* the node's environment changes (driver, package upgrade) with probability ``--env-change-rate`` per
  verification (default 1/30): the skip does not look at it (its blind spot); reported as the share of
  skipped verifications whose base predates an environment change.

Two cadences: every commit verified (per pull request) and a nightly tip after ``--commits-per-night``
commits (Poisson mean, default 3; a night without a commit is not counted: its tip is the verified one, always
PASS (unchanged)). Prints one table; deterministic for given seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rl_verify.core import paths
from rl_verify.engines import load_suite

HISTORY = Path(__file__).resolve().parents[1] / "tests" / "data" / "xtuner" / "history.json"
#: Code each suite reads (what a regression of its numbers can live in): facts of XTuner's tree, not the specs' rules.
_INSTALL = r"requirements|pyproject\.toml$|setup\.cfg$|MANIFEST\.in$|patch/"
READ = {"grpo": re.compile(r"^(xtuner/|examples/v1/scripts/run_rl\.sh$|autotest/config/rl_qwen3_gsm8k_grpo\.py$|"
                           r"autotest/utils/(check_metric|metric_report)\.py$|" + _INSTALL + ")"),
        "opd": re.compile(r"^(xtuner/|recipe/on_policy_distillation/|" + _INSTALL + ")")}
OPD_MEAN_RUNS = 1.53


def real_commits() -> list[list[str]]:
    """The changed paths of each of XTuner's 400 real commits (``scripts/xtuner_history.py``'s data file)."""
    data = json.loads(HISTORY.read_text(encoding="utf-8"))
    return [[c.split("\t", 1)[1] for c in commit["changes"]] for commit in data["commits"] if commit["changes"]]


def kind_of(files: list[str], suite: str) -> str:
    if any(READ[suite].match(f) for f in files):
        return "read code"
    if all(paths.matches(f, paths.DEFAULT_UNAFFECTING) for f in files):
        return "docs"
    return "other code"


@dataclass
class Commit:
    files: list[str]
    #: suite -> whether this commit regresses its numbers
    regression: dict[str, bool]


@dataclass
class Tally:
    verifications: int = 0
    skipped: int = 0
    gpu_hours: float = 0.0
    gpu_hours_full: float = 0.0
    false_pass: int = 0
    blind: int = 0
    base_age: list[int] = field(default_factory=list)


def draw_commit(rng: random.Random, pool: list[list[str]], args: argparse.Namespace) -> Commit:
    files = rng.choice(pool)
    rates = {"read code": args.regression_rate, "other code": args.outside_rate, "docs": args.hidden_rate}
    draw = rng.random()  # one draw: a commit regressing the code both suites read regresses both
    return Commit(files, {suite: draw < rates[kind_of(files, suite)] for suite in READ})


def poisson(rng: random.Random, mean: float) -> int:
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def one_history(seed: int, args: argparse.Namespace, specs: list, cost: dict[str, float],
                nightly: bool, pool: list[list[str]]) -> dict[str, Tally]:
    """Verifications of one seeded history, per suite: the skip's rule against a full training each time."""
    rng = random.Random(f"unchanged:{seed}:{nightly}")
    tallies = {spec.name: Tally() for spec in specs}
    # Per suite: the files changed since its last trained PASS, whether a regression is among those commits,
    # and whether the environment changed since that PASS; verification index of the base.
    since = {spec.name: {"files": set(), "regressed": False, "env_changed": False, "age": 0} for spec in specs}
    for _ in range(args.verifications):
        batch = [draw_commit(rng, pool, args)
                 for _ in range(max(1, poisson(rng, args.commits_per_night)) if nightly else 1)]
        env_changed = rng.random() < args.env_change_rate
        for spec in specs:
            state, t = since[spec.name], tallies[spec.name]
            for c in batch:
                state["files"].update(c.files)
                state["regressed"] |= c.regression[spec.name]
            state["env_changed"] |= env_changed
            state["age"] += 1
            t.verifications += 1
            t.gpu_hours_full += cost[spec.name]
            if not paths.affecting(sorted(state["files"]), spec.affects, spec.unaffecting):
                t.skipped += 1
                t.base_age.append(state["age"])
                t.false_pass += state["regressed"]  # a regression the skip let through
                t.blind += state["env_changed"]
                continue
            t.gpu_hours += cost[spec.name]
            # A training: a PASS becomes the new base; a FAIL is fixed by the next commit, whose PASS is the base.
            since[spec.name] = {"files": set(), "regressed": False, "env_changed": False, "age": 0}
    return tallies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=400)
    p.add_argument("--verifications", type=int, default=60, help="verifications per history")
    p.add_argument("--commits-per-night", type=float, default=3.0)
    p.add_argument("--regression-rate", type=float, default=0.03)
    p.add_argument("--hidden-rate", type=float, default=0.005)
    p.add_argument("--outside-rate", type=float, default=0.005)
    p.add_argument("--env-change-rate", type=float, default=1 / 30)
    args = p.parse_args(argv)
    specs = [load_suite("grpo"), load_suite("opd")]
    cost = {s.name: s.run_minutes / 60 * (s.node.gpus or 8) * (OPD_MEAN_RUNS if s.name == "opd" else 1.0)
            for s in specs}
    pool = real_commits()
    kinds = Counter(kind_of(f, "grpo") for f in pool)
    print(f"# path-aware skip over {args.seeds} seeded histories of {args.verifications} verifications drawn from "
          f"XTuner's {len(pool)} real commits (for GRPO: {kinds['docs']} docs/CI/tests only, {kinds['other code']} "
          f"other code, {kinds['read code']} code it reads); regression rate {args.regression_rate:.1%} per commit "
          f"touching code the suite reads, {args.outside_rate:.1%} per other-code commit, hidden (numbers moved by an "
          f"'unaffecting' path) {args.hidden_rate:.1%} per docs commit; environment change "
          f"{args.env_change_rate:.1%} per verification")
    print("| cadence | suite | verifications answered PASS (unchanged) | GPU-h per verification, skip / always "
          "train | false PASS per skipped verification | skipped across an environment change (blind spot) | "
          "base age, median verifications |")
    print("|---|---|---|---|---|---|---|")
    for nightly in (False, True):
        total = {s.name: Tally() for s in specs}
        for seed in range(args.seeds):
            for name, t in one_history(seed, args, specs, cost, nightly, pool).items():
                agg = total[name]
                agg.verifications += t.verifications
                agg.skipped += t.skipped
                agg.gpu_hours += t.gpu_hours
                agg.gpu_hours_full += t.gpu_hours_full
                agg.false_pass += t.false_pass
                agg.blind += t.blind
                agg.base_age += t.base_age
        for name, t in total.items():
            ages = sorted(t.base_age)
            median = ages[len(ages) // 2] if ages else 0
            print(f"| {'nightly tip' if nightly else 'every commit'} | {name} | {t.skipped / t.verifications:.1%} | "
                  f"{t.gpu_hours / t.verifications:.2f} / {t.gpu_hours_full / t.verifications:.2f} "
                  f"({1 - t.gpu_hours / t.gpu_hours_full:.1%} saved) | "
                  f"{t.false_pass / max(t.skipped, 1):.2%} ({t.false_pass} of {t.skipped}) | "
                  f"{t.blind / max(t.skipped, 1):.1%} | {median} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
