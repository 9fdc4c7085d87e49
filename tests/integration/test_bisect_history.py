"""The simulated node's bisection history over SSH (issue 22, item 6): every commit checks out, commits before
the culprit train healthy, the culprit and later ones show the regression from its step, the launch-failing commit
fails as a launch (exit 1, nothing started, no tracker). The layout itself: tests/unit/test_sim_bisect_history.py."""
from __future__ import annotations

import json
import shlex

import pytest

from sim_ssh import REPO, Node, simnode
from test_simulated_node import exp_dirs, parse, run_suite, summaries, tracker_of

pytestmark = pytest.mark.integration

KL, ABS, REWARDS = ("distillation/reduced_distillation_kl", "distillation/reduced_distillation_abs_loss",
                    "response/rewards/mean")
GOLDEN = json.loads((REPO / "include/rl_verify/suites/data/opd_golden_2026-10-26.json").read_text())["golden"]


def test_node_json_names_the_history_and_every_commit_checks_out(sim_node: Node) -> None:
    b = sim_node.info["bisect"]
    assert len(b["commits"]) - 1 >= 16 and b["commits"][0] == b["good"] == sim_node.info["commits"]["good"]
    assert sim_node.info["refs"]["bisect-good"] == b["refs"]["good"] == "sim/bisect-good"
    assert sim_node.info["refs"]["bisect-bad"] == b["refs"]["bad"] == "sim/bisect-bad"
    repo = shlex.quote(sim_node.checkout)
    rc, out, err = sim_node.run(f"git -C {repo} rev-list --first-parent --reverse sim/bisect-good..sim/bisect-bad")
    assert rc == 0 and out.split() == b["commits"][1:], err
    for pos, sha in enumerate(b["commits"]):
        wt = sim_node.worktree(sha, f"bisect-{pos}")
        rc, out, err = sim_node.run(f"git -C {shlex.quote(wt)} rev-parse HEAD && cat {shlex.quote(wt)}/xtuner/rlsim/"
                                    "behaviour.json")
        head, behaviour = out.split("\n", 1)
        assert rc == 0 and head == sha, err
        assert (json.loads(behaviour)["regression"] is not None) == (pos >= b["culprit_at"]), pos
        sim_node.run(f"git -C {repo} worktree remove --force {shlex.quote(wt)}")


def kl_diffs(node: Node, ref: str, name: str) -> dict[int, tuple[float, float, float]]:
    """Per OPD eval point: (distill KL, abs loss, rewards) of one run at ``ref`` minus the golden table."""
    rc, work_dir = run_suite(node, "opd", ref, name)
    assert rc == 0, (work_dir / "launch.out").read_text()[-2000:]
    summ = summaries(parse(tracker_of(work_dir).read_text())[0])
    assert sorted(summ) == list(range(1, 26))
    return {s: tuple(summ[s][k] - GOLDEN[str(s)][k] for k in (KL, ABS, REWARDS)) for s in (5, 10, 15, 20, 25)}


def test_healthy_before_the_culprit_regressed_from_it_on(sim_node: Node) -> None:
    # bounded noise (the session node's default): a run's KL stays within 0.009 of the golden table
    b = sim_node.info["bisect"]
    at, step = b["culprit_at"], b["from_step"]
    for pos in (at - 1, at, len(b["commits"]) - 1):
        diffs = kl_diffs(sim_node, b["commits"][pos], f"bisect-opd-{pos}")
        for s, (kl, abs_loss, rewards) in diffs.items():
            if pos < at or s < step:
                assert abs(kl) < 0.01 and abs(abs_loss) < 0.01, (pos, s, kl, abs_loss)
            else:  # one threshold (0.03) on KL, 1/3 of sim/regress-teacher's shifts
                assert 0.02 < kl < 0.04 and 0.017 < abs_loss < 0.037, (pos, s, kl, abs_loss)
            assert abs(rewards) < 0.03  # rewards healthy throughout


def test_the_launch_failing_commit_fails_as_a_launch(faults: Node) -> None:
    b = faults.info["bisect"]
    for suite in ("grpo", "opd"):
        rc, work_dir = run_suite(faults, suite, b["launch_fails"], f"bisect-launch-{suite}")
        out = (work_dir / "launch.out").read_text()
        assert rc == 1 and "scripts/launch_env.sh: No such file or directory" in out, out[-2000:]
        assert exp_dirs(work_dir) == [] and not list(work_dir.glob("training_log_*"))
        assert "ray start" not in out and "rlsim-teacher" not in out
        assert not simnode.ray_running(faults.state) and faults.processes("rlsim-teacher") == []
    # the next commit adds the helper: it launches and trains
    rc, work_dir = run_suite(faults, "grpo", b["commits"][b["launch_fails_at"] + 1], "bisect-launch-fixed")
    assert rc == 0 and len(summaries(parse(tracker_of(work_dir).read_text())[0])) == 45


def test_a_configured_culprit_and_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    from sim_ssh import STEP_SECONDS, pinned_client
    state = tmp_path_factory.mktemp("rlsim-bisect-layout")
    info = simnode.start_node(state, step_seconds=STEP_SECONDS,
                              bisect={"commits": 8, "culprit": 2, "launch_fails": 5, "from_step": 5})
    node = Node(state=state, info=info, client=pinned_client(info))
    try:
        b = info["bisect"]
        assert len(b["commits"]) == 9 and b["culprit"] == b["commits"][2] and b["launch_fails"] == b["commits"][5]
        assert json.loads((node.root / "sim.json").read_text())["bisect"]["culprit"] == 2
        diffs = kl_diffs(node, b["commits"][2], "layout-culprit")
        assert all(0.02 < diffs[s][0] < 0.04 for s in (5, 10, 15, 20, 25)), diffs
        diffs = kl_diffs(node, b["commits"][1], "layout-before")
        assert all(abs(diffs[s][0]) < 0.01 for s in (5, 10, 15, 20, 25)), diffs
    finally:
        node.client.close()
        simnode.stop_node(state)
