"""The shipped path rules on XTuner's real tree and history (issue 42; facts: tests/data/xtuner/history.json, read
from InternLM/xtuner by scripts/xtuner_history.py), decided by core.lane.judge as the DAG decides."""

from __future__ import annotations

import json

from rl_verify.core import lane
from rl_verify.engines import load_suite
from scripts import bench_shortcuts as bench

DATA = bench.load(bench.HISTORY)
NEWEST = DATA["commits"][-1]["tree"]
PR_1977 = DATA["trees"]["refs/pull/1977/head"]["files"]


def test_every_grpo_pattern_names_a_file_of_xtuners_newest_commit():
    assert lane.stale_rules(bench.rules_of("grpo"), NEWEST) == ((), ())


def test_opd_patterns_name_files_of_the_pull_request_that_holds_its_recipe_and_not_of_main():
    assert lane.stale_rules(bench.rules_of("opd"), PR_1977) == ((), ())
    assert lane.stale_rules(bench.rules_of("opd"), NEWEST) == (("recipe/on_policy_distillation/**",), ())


def test_no_commit_touching_the_lmdeploy_rollouts_python_is_lane_eligible_at_its_own_tree():
    touching = [v for v in bench.verifications(DATA, nightly=False)
                if any(bench.LMDEPLOY_ROLLOUT.match(p) for p in v["files"])]
    assert len(touching) == 26  # under xtuner/v1/ray/rollout/ before #1544, xtuner/v1/rl/rollout/ after
    decided = {v["sha"]: bench.decide("grpo", v["base"], v["files"], v["tree"]) for v in touching}
    assert [sha for sha, j in decided.items() if j.choice != "full"] == []
    # After the move the rule names the file itself; before it, the rule matches nothing there and turns the lane off.
    assert {j.rule for j in decided.values()} <= {"bitwise.disabled_by", "affects"}


def test_grpo_is_unchanged_for_a_fifth_of_xtuners_diffs_and_never_for_one_touching_what_it_reads():
    stream = bench.verifications(DATA, nightly=False)
    judged = [bench.decide("grpo", v["base"], v["files"], NEWEST) for v in stream]
    unchanged = [v for v, j in zip(stream, judged) if j.choice == "unchanged"]
    assert len(unchanged) / len(stream) >= 0.18
    assert not [v["sha"] for v in unchanged if any(bench.GRPO_READS.match(p) for p in v["files"])]


def test_the_history_file_records_where_its_facts_come_from():
    raw = json.loads(bench.HISTORY.read_text())
    assert raw["source"]["repository"] == "https://github.com/InternLM/xtuner" and raw["source"]["count"] == 400
    assert all(len(c["sha"]) == 40 and c["changes"] for c in raw["commits"][:10])
    assert load_suite("grpo").affects_source.startswith("XTuner main at b934f46")
