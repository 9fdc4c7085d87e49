"""Pins the CLI contract: exit 0 PASS / 1 FAIL / 2 cannot evaluate, report files in --out."""

from __future__ import annotations

import argparse
import json
import textwrap

import pytest

from conftest import dump_rows, grpo_rows, opd_rows
from rl_verify.cli import build_parser, main, register_compare


def grpo_args(tmp_path, checker_dir, cur_rows=None, tail="", extra=()):
    base = dump_rows(tmp_path / "base.jsonl", grpo_rows())
    cur = dump_rows(tmp_path / "cur.jsonl", cur_rows if cur_rows is not None else grpo_rows(), tail=tail)
    return ["compare", "grpo", "--baseline", str(base), "--current", str(cur), "--checker-dir", str(checker_dir),
            "--out", str(tmp_path / "out"), "--commit", "c0ffee" * 6 + "ab", *extra]


def test_grpo_pass_exits_0_and_writes_the_reports_and_plots(tmp_path, checker_dir):
    assert main(grpo_args(tmp_path, checker_dir, extra=["--wall-time-s", "1800"])) == 0
    out = tmp_path / "out"
    for name in ("report.json", "report.md", "report.html", "grpo_metrics.png"):
        assert (out / name).is_file()
    data = json.loads((out / "report.json").read_text())
    assert data["verdict"] == "PASS" and data["suite"] == "grpo" and data["commit"].startswith("c0ffee")
    assert {c["source"] for c in data["checks"]} == {"checker", "final-eval", "wall-time"}


def test_grpo_fail_exits_1(tmp_path, checker_dir):
    cur = grpo_rows(rewards=lambda i: 0.1)
    assert main(grpo_args(tmp_path, checker_dir, cur_rows=cur)) == 1
    assert json.loads((tmp_path / "out" / "report.json").read_text())["verdict"] == "FAIL"


def test_grpo_step_count_mismatch_exits_1_not_2(tmp_path, checker_dir):
    assert main(grpo_args(tmp_path, checker_dir, cur_rows=grpo_rows(steps=30))) == 1


def test_opd_pass_and_fail_exit_codes(tmp_path):
    cur = dump_rows(tmp_path / "cur.jsonl", opd_rows())
    assert main(["compare", "opd", "--current", str(cur), "--out", str(tmp_path / "a")]) == 0
    bad = dump_rows(tmp_path / "bad.jsonl", opd_rows(change=lambda m, s, v: v + 0.2 if m == "eval/gsm8k/acc" else v))
    assert main(["compare", "opd", "--current", str(bad), "--out", str(tmp_path / "b")]) == 1
    assert (tmp_path / "b" / "opd_metrics.png").is_file()


def test_missing_tracker_exits_2_naming_the_file_and_the_fix(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main(["compare", "opd", "--current", str(missing), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "Fix:" in err


def test_malformed_line_exits_2_naming_file_and_line(tmp_path, capsys):
    rows = [json.dumps(r) for r in opd_rows()]
    rows[3] = rows[3][:-5]
    cur = dump_rows(tmp_path / "cur.jsonl", rows)
    assert main(["compare", "opd", "--current", str(cur), "--out", str(tmp_path / "o")]) == 2
    assert f"{cur}:4" in capsys.readouterr().err


def test_partial_last_line_is_not_an_error(tmp_path, checker_dir):
    assert main(grpo_args(tmp_path, checker_dir, tail='{"step": 46, "respo')) == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any("partial last line" in a for a in data["abnormal"])


def test_hanging_checker_exits_2(tmp_path, capsys):
    utils = tmp_path / "slow" / "autotest" / "utils"
    utils.mkdir(parents=True)
    (utils / "check_metric.py").write_text(textwrap.dedent("""
        import time
        def check_rl_result(case_name, base_path, cur_path, assert_info, phase=None):
            time.sleep(600)
        """))
    assert main(grpo_args(tmp_path, utils.parent, extra=["--timeout-s", "1"])) == 2
    assert "timed out" in capsys.readouterr().err


def test_usage_error_exits_2(tmp_path):
    assert main(["compare", "grpo", "--current", "x"]) == 2


def test_parser_accepts_additional_subcommands_through_registrars():
    def register_hello(subparsers):
        sub = subparsers.add_parser("hello")
        sub.set_defaults(func=lambda args: 0)

    parser = build_parser([register_compare, register_hello])
    assert isinstance(parser, argparse.ArgumentParser)
    assert parser.parse_args(["hello"]).func(None) == 0
    assert parser.parse_args(["compare", "opd", "--current", "c", "--out", "o"]).suite == "opd"


# --- rl-verify shortcut (issue 42): the DAG's decision on a local clone ----------------------------------------

def _git(repo, *args):
    import subprocess

    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                    *args], check=True, capture_output=True)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A clone with the simulated checkout's files (every shipped path rule matches them) and four commits."""
    from simulator.checkout import checkout_files

    repo = tmp_path_factory.mktemp("xtuner")
    _git(repo, "init", "-q", "-b", "main")
    for rel in checkout_files():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"{rel}\n")
    shas = {"base": _git(repo, "add", "-A") and _git(repo, "commit", "-qm", "base")}
    (repo / ".claude/skills/trace").mkdir(parents=True)
    (repo / ".claude/skills/trace/helper.py").write_text("print('a skill')\n")
    shas["skills"] = _git(repo, "add", "-A") and _git(repo, "commit", "-qm", "skills")
    (repo / "xtuner/v1/rl/rollout/lmdeploy.py").write_text("# a change\n")
    shas["lmdeploy"] = _git(repo, "commit", "-qam", "lmdeploy")
    _git(repo, "mv", "xtuner/v1/rl/rollout/lmdeploy.py", "xtuner/v1/rl/rollout/turbomind.py")
    shas["renamed"] = _git(repo, "commit", "-qm", "rename")
    return repo, shas


def _shortcut(capsys, repo, base, head, *extra):
    status = main(["shortcut", "--checkout", str(repo), "--base", base, "--head", head, *extra])
    return status, capsys.readouterr()


def test_shortcut_says_unchanged_for_a_diff_no_rule_of_the_suite_names(clone, capsys):
    repo, shas = clone
    status, out = _shortcut(capsys, repo, shas["base"], shas["skills"], "--json")
    found = json.loads(out.out)
    assert status == 0 and found["files"] == [".claude/skills/trace/helper.py"]
    assert {s: v["choice"] for s, v in found["suites"].items()} == {"grpo": "unchanged", "opd": "unchanged"}


def test_shortcut_says_full_naming_the_rule_for_the_lmdeploy_rollout(clone, capsys):
    repo, shas = clone
    status, out = _shortcut(capsys, repo, shas["skills"], shas["lmdeploy"], "--suite", "grpo")
    assert status == 0
    assert "grpo: full (rule: bitwise.disabled_by): the diff touches code the deterministic mode bypasses: " \
           "xtuner/v1/rl/rollout/lmdeploy.py" in out.out
    assert "  files: xtuner/v1/rl/rollout/lmdeploy.py" in out.out


def test_shortcut_names_a_pattern_the_head_does_not_have(clone, capsys):
    repo, shas = clone
    status, out = _shortcut(capsys, repo, shas["lmdeploy"], shas["renamed"], "--suite", "grpo")
    assert status == 0 and "grpo: full (rule: bitwise.disabled_by): the lane's rule cannot be trusted" in out.out
    assert "  stale: bitwise.disabled_by xtuner/v1/rl/rollout/lmdeploy.py" in out.out


def test_shortcut_refuses_a_commit_the_clone_lacks_naming_the_flag(clone, capsys):
    repo, _ = clone
    status, out = _shortcut(capsys, repo, "main", "f" * 40)
    assert status == 2 and "--head 'ffff" in out.err and "is not a commit of this checkout" in out.err


def _repo_with_checkout_files(root, skip=()):
    from simulator.checkout import checkout_files

    _git(root, "init", "-q", "-b", "main")
    for rel in checkout_files():
        if rel not in skip:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(f"{rel}\n")
    return _git(root, "add", "-A") and _git(root, "commit", "-qm", "files")


def test_shortcut_says_rules_newer_than_an_old_commit_are_not_out_of_date(tmp_path, capsys):
    launch = "examples/v1/scripts/run_rl.sh"
    old = _repo_with_checkout_files(tmp_path, skip=(launch,))
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs/x.md").write_text("docs\n")
    docs = _git(tmp_path, "add", "-A") and _git(tmp_path, "commit", "-qm", "docs")
    (tmp_path / launch).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / launch).write_text("run\n")
    _git(tmp_path, "add", "-A") and _git(tmp_path, "commit", "-qm", "the launch script arrives")
    status, out = _shortcut(capsys, tmp_path, old, docs, "--suite", "grpo")
    assert status == 0 and "grpo: full (rule: affects): the suite's path rules are newer than this commit" in out.out
    assert f"'{launch}' name files this commit does not have yet" in out.out and "out of date" not in out.out


def test_shortcut_with_evidence_judges_the_diff_as_the_dag_does(tmp_path, capsys):
    import subprocess

    unused = "xtuner/v1/model/moe/deepseek_v3.py"
    base = _repo_with_checkout_files(tmp_path)
    blob = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", f"HEAD:{unused}"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / unused).write_text(f"{unused}\nrouter = 0.5\n")
    head = _git(tmp_path, "commit", "-qam", "a module no process ran")
    recorded = {"full": {"xtuner/rlsim/train.py": [1]}, "lane": {"xtuner/rlsim/train.py": [1]},
                "hashes": {unused: blob}, "blocks": {unused: [[1, 1, -1, True]]}, "sha": base, "problems": []}
    (tmp_path / "evidence.json").write_text(json.dumps(recorded))
    status, out = _shortcut(capsys, tmp_path, base, head, "--suite", "grpo", "--evidence",
                            str(tmp_path / "evidence.json"), "--json")
    found = json.loads(out.out)["suites"]["grpo"]
    assert status == 0 and (found["choice"], found["rule"]) == ("unchanged", "evidence"), found
    assert found["evidence"]["unrun"] == [f"{unused}:1"]  # an insertion at the end touches the last line
    status, out = _shortcut(capsys, tmp_path, base, head, "--suite", "grpo")  # the path rules alone: no skip
    assert "grpo: unchanged" not in out.out
    (tmp_path / "other.json").write_text(json.dumps({**recorded, "sha": head}))
    status, out = _shortcut(capsys, tmp_path, base, head, "--evidence", str(tmp_path / "other.json"))
    assert status == 2 and "recorded at" in out.err and "--base" in out.err
