"""The node's readiness for the launch scripts (suite specs' ``node``), a launch that died before its
tracker explained in its own words (core.launch), and the GPU wait's log rule that ends it by count."""

from __future__ import annotations

import json

import pytest

from rl_verify.core import launch
from rl_verify.core.live import LiveWatch, describe_hit
from rl_verify.engines import live_config, load_suite
from rl_verify.node.ops import merged_needs, parse_prerequisites, readiness_problems
from rl_verify.orchestration.notify import suite_line, suite_summary
from rl_verify.core.model import SuiteResult
from rl_verify.suites.spec import NodeNeeds

GRPO = load_suite("grpo")
OPD = load_suite("opd")
ULIMIT = "run_rl.sh: line 30: ulimit: open files: cannot modify limit: Operation not permitted"


# ----------------------------------------------------------------------------- the specs' needs
def test_the_launch_scripts_needs_are_data_in_the_specs():
    assert GRPO.node == NodeNeeds(nofile=65536, gpus=8, ray_ports=(6379, 8265), python="python",
                                  ray_log="/tmp/ray_log")
    assert OPD.node.gpus == 8


def test_merged_needs_take_the_largest_limit_every_port_and_the_nodes_own_ports():
    needs = merged_needs([GRPO, OPD])
    assert (needs.nofile, needs.gpus, needs.ray_ports) == (65536, 8, (6379, 8265))
    adapted = merged_needs([GRPO], ray_ports=(16379, 18265), ray_log="/srv/tmp/ray_log")
    assert adapted.ray_ports == (16379, 18265) and adapted.ray_log == "/srv/tmp/ray_log"
    assert merged_needs([OPD]).ray_ports == ()  # OPD's script binds no fixed Ray port: none checked


def test_a_ready_node_has_no_problem():
    seen = parse_prerequisites("NOFILE\t1048576\nGPUS\t8\t<unset>\nPYTHON\t/usr/bin/python\n"
                               "PORT\t6379\troot\t412\tours\trlsim-ray-head\nRAYLOG\t/runs/a/ray_1\t-\n").readiness
    assert readiness_problems(GRPO.node, seen) == []
    assert readiness_problems(GRPO.node, parse_prerequisites("NOFILE\tunlimited\n").readiness) == []


def test_every_unready_fact_is_its_own_problem_with_its_fix():
    out = ("NOFILE\t20000\nGPUS\t7\t0,1\nPYTHON\t\n"
           "PORT\t6379\tnobody\t977\tother\t/opt/ray/gcs_server --gcs_server_port=6379\n"
           "PORT\t8265\tnobody\t-\tother\t-\n"
           "RAYLOG\t/runs/k/grpo/ray_120100\t/runs/k/jobs/grpo\n")
    problems = readiness_problems(GRPO.node, parse_prerequisites(out).readiness, "ci")
    assert len(problems) == 7, problems
    assert all("Fix:" in p for p in problems)
    text = "\n".join(problems)
    assert "ci's hard open-files limit is 20000, below the 65536" in text
    assert "shows 7 GPU(s)" in text and "CUDA_VISIBLE_DEVICES='0,1'" in text
    assert "`python` does not resolve on ci's PATH" in text
    assert "process 977 of nobody (/opt/ray/gcs_server --gcs_server_port=6379)" in text
    assert "a process of nobody (pid not visible to ci)" in text
    assert text.count("`ray stop --force` would kill it") == 2
    assert "/tmp/ray_log links to /runs/k/grpo/ray_120100, inside the folder of a live training" in text


def test_a_suite_without_needs_checks_nothing():
    seen = parse_prerequisites("NOFILE\t1024\nGPUS\t0\t3\nPYTHON\t\n").readiness
    assert readiness_problems(NodeNeeds(), seen) == []


# ----------------------------------------------------------------------------- a launch in its own words
def test_explain_quotes_the_failing_command_its_message_and_the_known_fix():
    trace = "+ set -e\n+ ulimit -n 65536\n"
    output = f"[rl-verify] job started\n{ULIMIT}\n[rl-verify] job exited 1\n"
    said = launch.explain(output, trace, [r.model_dump() for r in GRPO.log_rules])
    assert said.startswith("its last command `ulimit -n 65536` printed: `" + ULIMIT + "`")
    assert "Fix: raise the SSH user's hard nofile limit" in said


def test_explain_without_a_known_cause_still_quotes_and_says_nothing_of_a_fix():
    said = launch.explain("cp: cannot stat 'x': No such file or directory\n", "+ cp x y\n",
                          [r.model_dump() for r in GRPO.log_rules])
    assert said == "its last command `cp x y` printed: `cp: cannot stat 'x': No such file or directory`"
    assert launch.explain("", "") is None


def test_the_last_printed_lines_skip_rl_verifys_own_and_keep_three():
    assert launch.last_lines("a\nb\n\nc\nd\n[rl-verify] exit 1\n") == ["b", "c", "d"]
    assert launch.last_command("no trace here") is None


# ----------------------------------------------------------------------------- the GPU wait, by count
def _grpo_watch(early_abort: bool = True) -> LiveWatch:
    config = json.loads(json.dumps(live_config(GRPO, "/w", early_abort, None, None, "/b.jsonl")))
    watch = LiveWatch({**config, "tracker_glob": "*/t.jsonl"})
    watch.start()
    return watch


@pytest.mark.parametrize("early_abort", [True, False])
def test_the_gpu_wait_is_acted_on_at_its_counted_line_whatever_early_abort_says(early_abort):
    rule = next(r for r in GRPO.log_rules if "Waiting for GPU" in r.pattern)
    assert rule.count == 15 and rule.stop == "always"
    watch = _grpo_watch(early_abort)
    wait = "Waiting for GPU count to be 8, current: 7\n"
    assert watch.log_hit("+ ray start --head\n" + wait * (rule.count - 1)) is None
    hit = watch.log_hit("+ sleep 2\n" + wait)
    assert hit is not None and hit["seen"] == rule.count and hit["stop"] == "always"
    words = describe_hit(hit)
    assert "log line seen 15 times: Waiting for GPU count to be 8, current: 7" in words
    assert "Fix: check nvidia-smi" in words
    assert watch.log_hit(wait * 3) is None  # acted on once


# ----------------------------------------------------------------------------- the cause, quoted
def test_an_infrastructure_fail_names_its_cause_in_the_verdict_line():
    result = SuiteResult.infrastructure("grpo", "the launch ended before any tracker (exit code 1): its last "
                                                "command `ulimit -n 65536` printed: `...`. Fix: raise it")
    line = suite_line(suite_summary(result))
    assert line.startswith("grpo the launch ended before any tracker (exit code 1): its last command `ulimit -n 65536`")
    assert "Fix: raise it" in line


def test_a_long_cause_is_cut_with_an_ellipsis():
    line = suite_line(suite_summary(SuiteResult.infrastructure("opd", "x" * 5000)))
    assert len(line) < 700 and line.endswith("…")
