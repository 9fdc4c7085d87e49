"""Executed-code evidence (core.evidence, core.blocks; issues 44 and 53): the node's own scripts read a diff from real
git (changed_lines.sh) and record what real coverage.py saw a real interpreter run (evidence_setup.sh,
evidence_read.sh, run with bash here); the verdict is judged at the unit Python executes, the block."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rl_verify.core import blocks, evidence
from rl_verify.node import evidence_scripts

NODE_PYTHON = "/usr/bin/python3"  # the simulated node's interpreter, coverage.py from Debian
pytestmark = pytest.mark.skipif(subprocess.run([NODE_PYTHON, "-c", "import coverage"], capture_output=True).returncode,
                                reason="the node's interpreter has no coverage.py (.ci/run installs python3-coverage)")


def _bash(script: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": f"{Path(NODE_PYTHON).parent}:{os.environ['PATH']}",
                               **(env or {})}).stdout


class Repo:
    """A git repository whose base commit a driver runs under the node's recording, and edits of it."""

    def __init__(self, root: Path, files: dict[str, str]) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.git("init", "-q")
        self.base = self.commit(files)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    def commit(self, files: dict[str, str | bytes | None], chmod: str = "") -> str:
        for path, text in files.items():
            target = self.root / path
            if text is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text if isinstance(text, bytes) else text.encode())
        if chmod:
            (self.root / chmod).chmod(0o755)
        self.git("add", "-A")
        self.git("commit", "-qm", "x", "--allow-empty")
        return self.git("rev-parse", "HEAD")

    def record(self, tmp: Path, full_args: str, lane_args: str) -> evidence.Evidence:
        """The base commit run twice under the node's recording: ``full_args`` then ``lane_args`` for main.py."""
        self.git("checkout", "-q", self.base)
        readings = []
        for name, args in (("full", full_args), ("lane", lane_args)):
            folder = tmp / name
            kv = dict(line.split("=", 1) for line in _bash(evidence_scripts.evidence_setup_script(
                str(folder / "evidence"), str(self.root))).splitlines() if "=" in line)
            (folder / "work").mkdir(parents=True)
            subprocess.run([NODE_PYTHON, "main.py", *args.split()], cwd=self.root, check=True,
                           env={**os.environ, "PYTHONPATH": kv["SITE"], "COVERAGE_PROCESS_START": kv["CONFIG"]})
            script = evidence_scripts.evidence_read_script(str(folder / "evidence"), str(self.root), "python3",
                                                 evidence.COMPILED_BODY.pattern, str(folder / "work"), "*.jsonl")
            readings.append(json.loads(_bash(script).strip().splitlines()[-1]))
        self.git("checkout", "-q", "-")
        full, lane = readings
        return evidence.Evidence.from_dict({
            "full": full["files"], "lane": lane["files"], "hashes": full["hashes"], "compiled": full["compiled"],
            "problems": full["problems"] + lane["problems"], "blocks": full["blocks"], "unparsed": full["unparsed"]})

    def changes(self, head: str) -> dict[str, evidence.Change]:
        return evidence.read_changes(_bash(evidence_scripts.changed_lines_script(str(self.root), self.base, head)))


MOD = '''"""The module the driver imports."""
SCALE = 1.0


def mean(values, mode):
    if mode == "a":
        total = sum(values)
    else:
        total = sum(values) * SCALE
    return total / len(values)


def late(step):
    weights = [
        1.0,
        2.0,
    ]
    return sum(weights) * step


def never_called():
    return 0
'''
MAIN = '''import sys
import mod

steps = int(sys.argv[1])
print(mod.mean([1.0, 2.0], "b"))
if steps > 5:
    print(mod.late(steps))
'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The base recorded: the full run (10 steps: ``late`` runs) and the lane (3 steps: it does not)."""
    tmp = tmp_path_factory.mktemp("evidence")
    repo = Repo(tmp / "repo", {"mod.py": MOD, "main.py": MAIN, "README.md": "docs\n",
                               "data.bin": b"\x00\x01\x02"})
    return repo, repo.record(tmp, "10", "3")


def _edit(repo: Repo, old: str, new: str, path: str = "mod.py") -> str:
    text = (repo.root / path).read_text() if (repo.root / path).exists() else ""
    assert old in text
    head = repo.commit({path: text.replace(old, new, 1)})
    repo.git("reset", "-q", "--hard", repo.base)
    return head


def _read(repo: Repo, head: str, found: evidence.Evidence) -> evidence.Reading:
    return evidence.read_diff(found, repo.changes(head))


def test_else_turned_into_elif_counts_as_run_though_no_touched_line_has_bytecode(recorded):
    repo, found = recorded
    reading = _read(repo, _edit(repo, "    else:\n", '    elif mode == "b":\n'), found)
    assert reading.ran == ("mod.py:8",) and "mod.py" not in reading.judged()


def test_a_module_level_insertion_between_the_blank_lines_before_a_def_counts_as_run(recorded):
    repo, found = recorded
    head = _edit(repo, "    return total / len(values)\n\n\n",
                 "    return total / len(values)\n\nmean = lambda values, mode: 0.85 * sum(values) / len(values)\n\n")
    reading = _read(repo, head, found)
    assert reading.ran and "mod.py" not in reading.judged()


def test_a_change_on_a_closing_bracket_line_counts_as_run_and_the_lane_is_blind_to_it(recorded):
    repo, found = recorded
    reading = _read(repo, _edit(repo, "        2.0,\n    ]\n", "        2.0,\n    ] + [0.5]\n"), found)
    assert reading.ran == ("mod.py:17",)
    assert reading.lane_unseen == ("mod.py:17",)  # late() runs after the lane's steps only


def test_a_removed_line_beginning_with_two_dashes_does_not_lose_its_file(tmp_path):
    repo = Repo(tmp_path / "r", {"notes.txt": "keep\n-- a removed line\n", "m.py": "x = 1\n"})
    head = repo.commit({"notes.txt": "keep\n++ an added line\n", "m.py": "x = 2\n"})
    changes = repo.changes(head)
    assert set(changes) == {"notes.txt", "m.py"} and changes["notes.txt"].hunks == ((2, 1),)


def test_binary_mode_only_and_empty_new_files_are_touched_whole(tmp_path):
    repo = Repo(tmp_path / "r", {"data.bin": b"\x00\x01", "run.py": "x = 1\n"})
    head = repo.commit({"data.bin": b"\x00\x02", "empty.py": ""}, chmod="run.py")
    changes = repo.changes(head)
    assert set(changes) == {"data.bin", "run.py", "empty.py"}
    assert changes["data.bin"].whole == "binary"
    assert changes["run.py"].whole == "a mode change only" and changes["run.py"].base_lines(1) == {1}
    assert changes["empty.py"].status == "A" and changes["empty.py"].whole


def test_a_mode_only_change_of_a_module_that_ran_counts_as_run(tmp_path):
    repo = Repo(tmp_path / "r", {"mod.py": MOD, "main.py": MAIN})
    found = repo.record(tmp_path, "10", "3")
    head = repo.commit({}, chmod="mod.py")
    reading = _read(repo, head, found)
    assert "mod.py:1" in reading.ran and "mod.py" not in reading.judged()


def test_a_new_py_file_is_unknown_to_the_evidence(recorded):
    repo, found = recorded
    head = repo.commit({"plugin.py": "import mod\nmod.SCALE = 0.5\n"})
    repo.git("reset", "-q", "--hard", repo.base)
    reading = _read(repo, head, found)
    assert reading.unknown == ("plugin.py (a new file: nothing recorded it)",) and not reading.judged()


def test_a_change_to_a_function_no_process_ran_is_unrun_and_so_is_only_it(recorded):
    repo, found = recorded
    reading = _read(repo, _edit(repo, "    return 0\n", "    return 1\n"), found)
    assert reading.unrun == ("mod.py:22",) and not reading.ran and reading.judged() == {"mod.py"}


def test_content_other_than_the_measured_one_or_a_syntax_error_at_the_head_is_not_judged(recorded):
    repo, found = recorded
    other = evidence.Evidence(found.full, found.lane, {**found.hashes, "mod.py": "0" * 40}, (), (), found.blocks)
    head = _edit(repo, "    return 0\n", "    return 1\n")
    assert "not the content measured" in _read(repo, head, other).unknown[0]
    broken = _edit(repo, "    return 0\n", "    return (\n")
    assert "does not parse" in _read(repo, broken, found).unknown[0]


def test_incomplete_evidence_judges_nothing(recorded):
    repo, found = recorded
    head = _edit(repo, "    return 0\n", "    return 1\n")
    lacking = evidence.Evidence(found.full, found.lane, found.hashes, (), ("the lane's steps recorded nothing",),
                                found.blocks)
    reading = _read(repo, head, lacking)
    assert reading.problems and not reading.judged()


def test_a_docstring_only_function_is_judged_by_the_block_that_defines_it():
    source = 'def stub():\n    """only a docstring"""\n\n\ndef other():\n    return 1\n'
    found = blocks.blocks_of(source)
    assert found is not None and found[1] == (2, 2, 0, False)  # no line of its body is one Python reports
    assert blocks.judged_block(found, 2) == 0 and blocks.judged_block(found, 6) == 2
    assert blocks.blocks_of("def broken(:\n") is None
    assert blocks.blocks_of("")[0][3] is False  # an empty module: nothing could ever show it ran


def test_evidence_round_trips_through_its_dict(recorded):
    _, found = recorded
    assert evidence.Evidence.from_dict(json.loads(json.dumps(found.to_dict()))) == found


def test_the_node_output_must_carry_gits_file_list():
    with pytest.raises(ValueError, match="RAW"):
        evidence.read_changes("HUNK 0 @@ -1 +1 @@\n")


@pytest.fixture(autouse=True, scope="module")
def _git_available():
    if not shutil.which("git"):
        pytest.skip("git is not installed")


def test_code_only_the_lanes_launch_runs_counts_as_run_not_unrun():
    source = "def respond(step):\n    return 1.0\n"
    found = evidence.Evidence(full={}, lane={"sglang.py": (1, 2)}, hashes={"sglang.py": "b" * 40},
                              blocks=evidence.merged_blocks({"sglang.py": [[1, 2, -1, True]]},
                                                            {"sglang.py": blocks.blocks_of(source)}))
    change = evidence.Change("sglang.py", "M", base_blob="b" * 40, hunks=((2, 1),), head_parses=True)
    reading = evidence.read_diff(found, {"sglang.py": change})
    assert reading.ran == ("sglang.py:2",) and reading.lane_unseen == () and not reading.judged()


def test_a_statement_that_first_runs_after_the_lane_inside_a_block_the_lane_runs_turns_the_lane_off():
    # apply() runs every step; its line 5 (a branch from step 5) ran in the full run only
    source = "def apply(step):\n    x = 1\n    if step >= 5:\n        x = 2\n    return x\n"
    found = evidence.Evidence(full={"m.py": (1, 2, 3, 4, 5)}, lane={"m.py": (1, 2, 3, 5)},
                              hashes={"m.py": "c" * 40}, blocks={"m.py": blocks.blocks_of(source)})

    def read(start: int, count: int) -> evidence.Reading:
        change = evidence.Change("m.py", "M", base_blob="c" * 40, hunks=((start, count),), head_parses=True)
        return evidence.read_diff(found, {"m.py": change})

    assert read(4, 1).lane_unseen == ("m.py:4",)  # the branch's own statement
    assert read(4, 0).lane_unseen == ("m.py:4", "m.py:5")  # a line inserted into the branch
    assert read(2, 1).lane_unseen == ()  # a statement every step runs, the lane's steps included


def test_a_change_to_the_experiments_config_turns_the_lane_off_though_the_lanes_steps_ran_it():
    """Found by the mutation benchmark: GRPO's config sets ``rollout_steps`` at load, so every process and the lane's
    steps run its changed line, yet the step count moves only at step 46. A file that defines the experiment (the
    spec's launch script and checkout inputs: ``Rules.read``) keeps the lane off whatever the evidence says."""
    from rl_verify.core import lane
    from rl_verify.engines import load_suite
    from rl_verify.suites.rules import rules_of

    config = "autotest/config/rl_qwen3_gsm8k_grpo.py"
    source = "total_epochs = 3\nrollout_steps = total_epochs * 15\n"
    found = evidence.Evidence(full={config: (1, 2)}, lane={config: (1, 2)}, hashes={config: "d" * 40},
                              blocks={config: blocks.blocks_of(source)})
    change = evidence.Change(config, "M", base_blob="d" * 40, hunks=((1, 1),), head_parses=True)
    reading = evidence.read_diff(found, {config: change})
    assert reading.ran == (f"{config}:1",) and reading.lane_unseen == ()  # the evidence alone would allow the lane
    spec = load_suite("grpo")
    tree = [p.replace("**", "x/y.py").replace("*", "x") for p in [*spec.affects, *spec.bitwise.disabled_by]]
    judged = lane.judge(rules_of(spec), lane.Facts(changed_since_reference=[config], tree=tree, reference="trusted",
                                                   reference_sha="a" * 40, evidence=reading))
    assert (judged.choice, judged.rule) == ("full", "experiment") and config in judged.why
    other = "xtuner/rlsim/train_loop.py"  # the same reading for a file that does not define the experiment
    moved = evidence.Evidence(full={other: (1, 2)}, lane={other: (1, 2)}, hashes={other: "d" * 40},
                              blocks={other: blocks.blocks_of(source)})
    reading = evidence.read_diff(moved, {other: evidence.Change(other, "M", base_blob="d" * 40, hunks=((1, 1),),
                                                                head_parses=True)})
    assert lane.judge(rules_of(spec), lane.Facts(changed_since_reference=[other], tree=tree, reference="trusted",
                                                 reference_sha="a" * 40, evidence=reading)).choice == "bitwise"
