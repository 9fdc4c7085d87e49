"""The simulated checkout's linear bisection history (issue 22, item 6): its layout, as git sees it, without sshd.

The launches themselves (healthy before the culprit, regressed from it, the launch failure) are pinned over SSH
in tests/integration/test_bisect_history.py.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from simulator.checkout import bisect_history, build_checkout
from simulator.common import (
    BISECT_BAD_TAG,
    BISECT_BRANCH,
    BISECT_GOOD_TAG,
    LAUNCH_HELPER,
    BisectLayout,
    load_curves,
)

SCRIPTS = ("examples/v1/scripts/run_rl.sh", "recipe/on_policy_distillation/scripts/run_sampled_token_mopd.sh")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def build(tmp_path: Path, layout: dict | None = None) -> tuple[Path, dict]:
    root = tmp_path / "node"
    (root / "state").mkdir(parents=True)
    if layout is not None:
        (root / "sim.json").write_text(json.dumps({"bisect": layout}))
    build_checkout(root)
    return root / "xtuner", bisect_history(root)


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return build(tmp_path_factory.mktemp("bisect-default"))


def test_default_layout_is_the_documented_one(default: tuple[Path, dict]) -> None:
    _, b = default
    assert b["layout"] == {"commits": 16, "culprit": 11, "launch_fails": 4, "regression": "teacher",
                           "scale": 1 / 3, "from_step": 10}
    assert (b["culprit_at"], b["launch_fails_at"], b["from_step"], b["suite"]) == (11, 4, 10, "opd")
    assert b["commits"][11] == b["culprit"] and b["commits"][4] == b["launch_fails"]
    assert b["healthy"] == list(range(11))


def test_history_is_linear_first_parent_with_stable_refs(default: tuple[Path, dict]) -> None:
    repo, b = default
    assert b["good"] == git(repo, "rev-parse", "main") == git(repo, "rev-parse", f"{BISECT_GOOD_TAG}^{{commit}}")
    assert b["bad"] == git(repo, "rev-parse", f"{BISECT_BAD_TAG}^{{commit}}") == git(repo, "rev-parse", BISECT_BRANCH)
    listed = git(repo, "rev-list", "--first-parent", "--reverse", f"{BISECT_GOOD_TAG}..{BISECT_BAD_TAG}").split()
    assert len(listed) >= 16 and listed == b["commits"][1:]
    assert git(repo, "rev-list", "--merges", f"{BISECT_GOOD_TAG}..{BISECT_BAD_TAG}") == ""
    # every commit has exactly its predecessor as its only parent
    for parent, child in zip(b["commits"], b["commits"][1:]):
        assert git(repo, "rev-parse", f"{child}^@") == parent
    subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", b["good"], b["bad"]], check=True)


def test_commits_have_real_subjects_authors_and_increasing_dates(default: tuple[Path, dict]) -> None:
    repo, b = default
    log = git(repo, "log", "--reverse", "--format=%H%x00%s%x00%an%x00%ae%x00%at",
              f"{BISECT_GOOD_TAG}..{BISECT_BAD_TAG}").splitlines()
    rows = [line.split("\0") for line in log]
    assert [r[0] for r in rows] == b["commits"][1:]
    assert [r[1] for r in rows] == b["subjects"][1:]
    assert len(set(r[1] for r in rows)) == len(rows)  # no two subjects alike
    assert len({r[2] for r in rows}) >= 3 and all("@" in r[3] for r in rows)
    times = [int(r[4]) for r in rows]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert "teacher" in b["subjects"][11] and "launch" in b["subjects"][4]


def test_behaviour_and_launch_scripts_per_commit(default: tuple[Path, dict]) -> None:
    repo, b = default
    for pos, sha in enumerate(b["commits"]):
        behaviour = json.loads(git(repo, "show", f"{sha}:xtuner/rlsim/behaviour.json"))
        if pos < 11:
            assert behaviour["regression"] is None, pos
        else:
            assert (behaviour["regression"], behaviour["scale"], behaviour["from_step"]) == ("teacher", 1 / 3, 10), pos
        files = set(git(repo, "ls-tree", "-r", "--name-only", sha).split())
        sources = [git(repo, "show", f"{sha}:{s}") for s in SCRIPTS]
        sourcing = [LAUNCH_HELPER in text for text in sources]
        # the helper is sourced from commit 4 on and exists from commit 5 on: only commit 4 breaks the launch
        assert sourcing == [pos >= 4] * 2, pos
        assert (LAUNCH_HELPER in files) == (pos >= 5), pos


def test_launch_failing_commit_exits_before_anything_runs(default: tuple[Path, dict], tmp_path: Path) -> None:
    repo, b = default
    for sha, rc in ((b["launch_fails"], 1), (b["commits"][5], None)):
        wt = tmp_path / sha[:8]
        git(repo, "worktree", "add", "-q", "--detach", str(wt), sha)
        for script in SCRIPTS:
            # Without a node the healthy script stops later, at its own checks: only the broken one says "launch_env".
            res = subprocess.run(["bash", script, "x", "y", "z", "w"], cwd=wt, capture_output=True, text=True,
                                 env={"PATH": "/usr/bin:/bin", "RLSIM_NODE": str(tmp_path / "no-node")})
            broken = f"{LAUNCH_HELPER}: No such file or directory" in res.stderr
            assert broken == (rc is not None), (script, res.stderr[-500:])
            if rc is not None:
                assert res.returncode == rc and "ray" not in res.stderr.split(LAUNCH_HELPER)[1]


def test_a_configured_layout(tmp_path: Path) -> None:
    repo, b = build(tmp_path, {"commits": 8, "culprit": 3, "launch_fails": 6, "from_step": 5, "scale": 0.5})
    assert len(b["commits"]) == 9 and (b["culprit_at"], b["launch_fails_at"], b["from_step"]) == (3, 6, 5)
    assert git(repo, "rev-list", "--count", f"{BISECT_GOOD_TAG}..{BISECT_BAD_TAG}") == "8"
    behaviour = json.loads(git(repo, "show", f"{b['commits'][8]}:xtuner/rlsim/behaviour.json"))
    assert (behaviour["scale"], behaviour["from_step"]) == (0.5, 5)
    assert json.loads(git(repo, "show", f"{b['commits'][2]}:xtuner/rlsim/behaviour.json"))["regression"] is None
    # no launch failure at all
    _, none = build(tmp_path / "none", {"launch_fails": 0})
    assert none["launch_fails"] is None and len(none["commits"]) == 17


@pytest.mark.parametrize("layout, word", [({"culprit": 0}, "culprit"), ({"culprit": 17}, "culprit"),
                                           ({"launch_fails": 11}, "launch_fails"),
                                           ({"launch_fails": 16}, "launch_fails"), ({"commits": 1}, "commits"),
                                           ({"regression": "nope"}, "regression"), ({"scale": 0}, "scale"),
                                           ({"colprit": 3}, "colprit")])
def test_a_bad_layout_is_refused_naming_the_key(layout: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        BisectLayout.from_sim({"bisect": layout})


def test_sources_unchanged_keep_the_shas(tmp_path: Path, default: tuple[Path, dict]) -> None:
    _, again = build(tmp_path)
    assert again["commits"] == default[1]["commits"]


# ------------------------------------------------------------------------------------------------------------------
# The scaled, step-gated regression the culprit carries (curves.regression_applier through run_rows)
CURVES = load_curves()
KL, ABS, REWARDS = ("distillation/reduced_distillation_kl", "distillation/reduced_distillation_abs_loss",
                    "response/rewards/mean")


def summaries(rows: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in rows if REWARDS in r}


@pytest.mark.parametrize("mode", ["bounded", "realistic"])
def test_scaled_regression_from_a_step(mode: str) -> None:
    healthy = summaries(CURVES.run_rows("opd", "s1", None, mode))
    full = summaries(CURVES.run_rows("opd", "s1", "teacher", mode))
    third = summaries(CURVES.run_rows("opd", "s1", "teacher", mode, regression_scale=1 / 3, regression_from=10))
    for step in healthy:
        if step < 10:
            assert third[step] == healthy[step], step
        else:
            for key in (KL, ABS):
                assert third[step][key] - healthy[step][key] == pytest.approx(
                    (full[step][key] - healthy[step][key]) / 3, abs=1e-12)
            assert third[step][KL] - healthy[step][KL] == pytest.approx(0.03)
            assert third[step][REWARDS] == healthy[step][REWARDS]


def test_default_shape_is_the_plain_regression() -> None:
    for suite, regression in (("grpo", "init"), ("opd", "divergence"), ("grpo", None)):
        plain = CURVES.run_rows(suite, "x", regression, "realistic")
        assert CURVES.run_rows(suite, "x", regression, "realistic", regression_scale=1.0, regression_from=0) == plain
        assert CURVES.run_rows(suite, "x", regression) == CURVES.run_rows(suite, "x", regression, regression_scale=1)
