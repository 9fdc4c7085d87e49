"""Executed-code evidence (core.evidence, issue 44): a diff's touched lines on the reference's side, and what the
lines a reference's runs executed say of them."""

from __future__ import annotations

import subprocess

from rl_verify.core import evidence


def _diff(tmp_path, before: dict[str, str], after: dict[str, str]) -> str:
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for files in (before, after):
        for path in list(p.relative_to(repo).as_posix() for p in repo.rglob("*.py")):
            if path not in files:
                (repo / path).unlink()
        for path, text in files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        git("add", "-A")
        git("commit", "-qm", "x", "--allow-empty")
    return git("diff", "-U0", "--no-renames", "HEAD~1", "HEAD")


BASE = "def a():\n    return 1\n\n\ndef late(step):\n    return 1.0\n"


def test_a_changed_line_touches_itself_and_an_insertion_touches_its_neighbours(tmp_path):
    after = "def a():\n    return 1\n\n\ndef late(step):\n    return 1.3\n"
    touched = evidence.parse_diff(_diff(tmp_path, {"m.py": BASE}, {"m.py": after}))
    assert touched["m.py"].lines == {6}
    inserted = evidence.parse_diff(_diff(tmp_path / "b", {"m.py": BASE},
                                         {"m.py": BASE.replace("    return 1\n", "    x = 2\n    return 1\n", 1)}))
    assert inserted["m.py"].lines == {1, 2}  # after line 1: lines 1 and 2 are its neighbours


def test_new_and_deleted_files_are_named(tmp_path):
    touched = evidence.parse_diff(_diff(tmp_path, {"m.py": BASE, "old.py": "x = 1\n"}, {"m.py": BASE,
                                                                                      "new.py": "y = 2\n"}))
    assert touched["old.py"].deleted and touched["old.py"].lines == {1}
    assert touched["new.py"].added


FULL = evidence.Evidence(full={"m.py": (1, 2, 5, 6)}, lane={"m.py": (1, 2)}, hashes={"m.py": "h1"})


def test_a_line_the_full_run_ran_and_the_lane_did_not_makes_the_lane_blind_to_it():
    touched = {"m.py": evidence.Touched("m.py", frozenset({6}))}
    assert [b.words() for b in evidence.lane_blind(FULL, touched)] == ["m.py:6"]
    early = {"m.py": evidence.Touched("m.py", frozenset({2}))}
    assert evidence.lane_blind(FULL, early) == []


def test_a_line_no_process_ran_is_not_run_and_a_compiled_file_counts_whole():
    touched = {"m.py": evidence.Touched("m.py", frozenset({3, 4}))}
    assert evidence.ran_lines(FULL, touched) == []
    compiled = evidence.Evidence(full={"k.py": (1,)}, lane={}, compiled=("k.py",))
    kernel = {"k.py": evidence.Touched("k.py", frozenset({40}))}
    assert evidence.ran_lines(compiled, kernel) == ["k.py (its bodies compile: the whole file counts as run)"]
    assert [b.words() for b in evidence.lane_blind(compiled, kernel)] == ["k.py:40"]


def test_evidence_missing_a_process_or_measured_on_other_content_is_named():
    problems = evidence.completeness({"train.py": (1,)}, {"train.py": (1,)}, ["train.py", "worker.py"],
                                     {"full run": 1, "lane's steps": 1})
    assert problems and all("worker.py" in p for p in problems)
    assert evidence.completeness({}, {}, ["train.py"], {"full run": 0, "lane's steps": 2})[0].startswith(
        "the full run recorded nothing")
    assert evidence.stale_files(FULL, {"m.py": "h2"}, ["m.py"]) == ["m.py"]
    assert evidence.stale_files(FULL, {"m.py": "h1"}, ["m.py"]) == []
    assert evidence.Evidence.from_dict(FULL.to_dict()) == FULL
