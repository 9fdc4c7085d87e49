"""The path-aware skip (PASS (unchanged), issue 33) over many seeded commit histories: how many verifications
it answers without a training, the GPU-hours that saves, its false PASS rate and its blind spot.

Each history is a stream of commits drawn with the mix measured on InternLM/xtuner's last 400 first-parent
commits (issue 33): 24% touch only docs, CI or tests, 6% touch no RL, model or training code (other Python under
``xtuner/``, tools), 70% RL, model or training code. Their file lists are drawn from paths of those kinds. The
skip decides with the package's own rule: the shipped specs' ``affects``/``unaffecting`` patterns
(``core.paths.affecting``) over the union of the files changed since the suite's last trained PASS, as
``resolve_commit`` reads them from ``git diff``. GPU-hours per training are the specs' own (runbook minutes x
GPUs); OPD's trainings count the confirmation's measured mean of 1.53 runs (README: confirmation).

Assumptions, stated because the answer depends on them:
* a commit with code changes carries a regression with probability ``--regression-rate`` (default 3%);
  a regression is verified (FAIL) at the first verification that includes it, and fixed by the next commit;
* a fraction ``--hidden-rate`` (default 0.5%) of docs/CI/tests-only commits changes numbers anyway (a prompt
  template kept as Markdown, a test helper imported by training): the rule's own false PASS;
* the node's environment changes (driver, package upgrade) with probability ``--env-change-rate`` per
  verification (default 1/30): the skip does not look at it (its blind spot); reported as the share of
  skipped verifications whose base predates an environment change.

Two cadences: every commit verified (per pull request) and a nightly tip after ``--commits-per-night``
commits (Poisson mean, default 3; a night without a commit is not counted: its tip is the verified one, always
PASS (unchanged)). Prints one table; deterministic for given seeds.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass, field

from rl_verify.core import paths
from rl_verify.engines import load_suite

DOCS = ["docs/en/rl/grpo.md", "docs/zh_cn/get_started/installation.md", "README.md", "README_zh-CN.md",
        ".github/workflows/lint.yml", ".github/workflows/unit_test.yml", "tests/rl/test_grpo_loss.py",
        "tests/model/test_qwen3.py", "docs/en/conf.py", "CONTRIBUTING.md"]
OTHER_CODE = ["xtuner/v1/model/moe/deepseek_v3.py", "xtuner/v1/model/compose/intern_s1.py", "tools/convert_hf.py",
              "xtuner/v1/utils/logger.py", "xtuner/v1/datasets/sft_tokenize_fn.py", "setup.py"]
RL_CODE = ["xtuner/v1/rl/grpo/loss.py", "xtuner/v1/rl/base/worker.py", "xtuner/v1/ray/rollout/controller.py",
           "xtuner/v1/ray/rollout/lmdeploy.py", "xtuner/v1/train/rl_trainer.py", "xtuner/v1/model/dense/qwen3.py",
           "xtuner/v1/rl/utils.py", "examples/v1/config/rl_qwen3_8B_grpo.py",
           "recipe/on_policy_distillation/config/rl_qwen3_vl_2b_sampled_token_mopd_rollout_teacher.py"]
MIX = (("docs", 0.24, DOCS), ("other code", 0.06, OTHER_CODE), ("rl code", 0.70, RL_CODE))
OPD_MEAN_RUNS = 1.53


@dataclass
class Commit:
    kind: str
    files: list[str]
    regression: bool = False


@dataclass
class Tally:
    verifications: int = 0
    skipped: int = 0
    gpu_hours: float = 0.0
    gpu_hours_full: float = 0.0
    false_pass: int = 0
    blind: int = 0
    base_age: list[int] = field(default_factory=list)


def draw_commit(rng: random.Random, regression_rate: float, hidden_rate: float) -> Commit:
    kind, files = "rl code", RL_CODE
    u, acc = rng.random(), 0.0
    for name, share, pool in MIX:
        acc += share
        if u < acc:
            kind, files = name, pool
            break
    chosen = rng.sample(files, k=min(len(files), 1 + int(rng.random() < 0.4) + int(rng.random() < 0.15)))
    bad = rng.random() < (hidden_rate if kind == "docs" else regression_rate)
    return Commit(kind, chosen, bad)


def poisson(rng: random.Random, mean: float) -> int:
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def one_history(seed: int, args: argparse.Namespace, specs: list, cost: dict[str, float],
                nightly: bool) -> dict[str, Tally]:
    """Verifications of one seeded history, per suite: the skip's rule against a full training each time."""
    rng = random.Random(f"unchanged:{seed}:{nightly}")
    tallies = {spec.name: Tally() for spec in specs}
    # Per suite: the files changed since its last trained PASS, whether a regression is among those commits,
    # and whether the environment changed since that PASS; verification index of the base.
    since = {spec.name: {"files": set(), "regressed": False, "env_changed": False, "age": 0} for spec in specs}
    for _ in range(args.verifications):
        batch = [draw_commit(rng, args.regression_rate, args.hidden_rate)
                 for _ in range(max(1, poisson(rng, args.commits_per_night)) if nightly else 1)]
        env_changed = rng.random() < args.env_change_rate
        for spec in specs:
            state, t = since[spec.name], tallies[spec.name]
            for c in batch:
                state["files"].update(c.files)
                state["regressed"] |= c.regression
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
    p.add_argument("--env-change-rate", type=float, default=1 / 30)
    args = p.parse_args(argv)
    specs = [load_suite("grpo"), load_suite("opd")]
    cost = {s.name: s.run_minutes / 60 * (s.node.gpus or 8) * (OPD_MEAN_RUNS if s.name == "opd" else 1.0)
            for s in specs}
    print(f"# path-aware skip over {args.seeds} seeded histories of {args.verifications} verifications; commit mix "
          f"24/6/70 % (docs-CI-tests / other code / RL code); regression rate {args.regression_rate:.1%} per code "
          f"commit, hidden (numbers moved by an 'unaffecting' path) {args.hidden_rate:.1%} per docs commit; "
          f"environment change {args.env_change_rate:.1%} per verification")
    print("| cadence | suite | verifications answered PASS (unchanged) | GPU-h per verification, skip / always "
          "train | false PASS per skipped verification | skipped across an environment change (blind spot) | "
          "base age, median verifications |")
    print("|---|---|---|---|---|---|---|")
    for nightly in (False, True):
        total = {s.name: Tally() for s in specs}
        for seed in range(args.seeds):
            for name, t in one_history(seed, args, specs, cost, nightly).items():
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
