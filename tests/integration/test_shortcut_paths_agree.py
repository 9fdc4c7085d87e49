"""Issue 53: ``rl-verify shortcut --evidence`` and the DAG give the same decision on the mutation benchmark's cases.

The simulated checkout's base records its executed-code evidence for real (GRPO and OPD, the node's scripts and
coverage.py, as ``scripts.bench_mutation`` does); a seeded mutant of every operator (the shadowing new files
included) and 3 mutants of each suite's config are committed, and each suite's decision is taken both ways
(``scripts.decision_paths``: the DAG's ``unchanged_on_node`` then ``bitwise_lane.decide``; the CLI's JSON).
``make bench`` compares them on every mutant."""

from __future__ import annotations

import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from rl_verify.engines import load_suite
from scripts import bench_mutation, decision_paths, evidence_rig
from scripts.mutants import generate
from simulator.checkout import build_checkout

pytestmark = pytest.mark.integration
SUITES = ("grpo", "opd")
PER_OPERATOR = 1


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """(repo, base, {suite: evidence dict}, [(mutant, sha)]): PER_OPERATOR mutants of each operator and 3 of each
    suite's config, seeded (kept small: an integration test's deadline is 300 s on a busy machine)."""
    tmp = tmp_path_factory.mktemp("shortcut-paths")
    build_checkout(tmp / "node")
    repo = tmp / "node" / "xtuner"
    base = _git(repo, "rev-parse", "main")
    base_wt, wt = tmp / "base", tmp / "mutants"
    _git(repo, "worktree", "add", "-q", "--detach", str(base_wt), base)
    _git(repo, "worktree", "add", "-q", "--detach", str(wt), base)
    env = {(suite, mode): evidence_rig.node_env(RLSIM_SEED=bench_mutation.SEED,
                                                **evidence_rig.suite_env(load_suite(suite), mode == "lane"))
           for suite in SUITES for mode in bench_mutation.MODES}
    recorded = {}
    for suite in SUITES:
        found, summary = bench_mutation._evidence(base_wt, tmp, env, suite)
        assert not found.problems, summary  # complete evidence, or the comparison would be of the path rules only
        recorded[suite] = found.to_dict()
    mutants, _, _ = generate(base_wt, [f for f in bench_mutation.FILES if (base_wt / f).exists()], 0, 66, None)
    by_op: dict[str, list] = {}
    for m in mutants:
        by_op.setdefault(m.op, []).append(m)
    rng = random.Random(53)
    sample = [m for op in sorted(by_op) for m in rng.sample(by_op[op], min(PER_OPERATOR, len(by_op[op])))]
    # and of each suite's config, which defines its experiment (the DAG once judged it without that rule)
    for config in evidence_rig.CONFIG.values():
        edits = [m for m in mutants if m.path == config and m not in sample]
        sample += rng.sample(edits, min(3, len(edits)))
    return repo, base, recorded, [(m, bench_mutation._commit(wt, m, base)) for m in sample], tmp


def test_the_cli_and_the_dag_decide_alike_on_every_sampled_mutant_of_every_operator(cases):
    repo, base, recorded, committed, tmp = cases
    files = {suite: decision_paths.write_evidence(tmp, suite, base, recorded[suite]) for suite in SUITES}
    disagree, seen = [], Counter()
    with decision_paths.dag_offline(repo, tmp / "records"):
        for suite in SUITES:
            decision_paths.keep_base(suite, base, recorded[suite])
        for m, sha in committed:
            for suite in SUITES:
                dag = decision_paths.dag_choice(repo, suite, base, sha)
                said = decision_paths.cli_choice(repo, suite, base, sha, files[suite])
                seen[dag] += 1
                if dag != said:
                    disagree.append(f"{suite} {m.op} {m.path}:{m.line} {m.text}: DAG {dag}, CLI {said}")
    assert disagree == [], "\n".join(disagree)
    # not a comparison of one answer: the sample reaches every decision
    assert set(seen) == {"unchanged", "bitwise", "full"}, seen
    assert len({m.op for m, _ in committed}) >= 15, sorted({m.op for m, _ in committed})
