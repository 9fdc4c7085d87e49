"""PASS (unchanged) by executed-code evidence in the DAG's resolve_commit (orchestration.unchanged, issue 53): it rests
only on the trusted reference of the node's environment now, and never against the record."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone

import pytest

from rl_verify.core import bitwise, evidence
from rl_verify.engines import load_suite
from rl_verify.node import evidence_scripts
from rl_verify.orchestration import bitwise_lane, unchanged
from rl_verify.store import references

ENV_A = {"gpu": "NVIDIA H100", "gpu_count": 8, "driver": "580.159.04", "cuda": "13.0", "packages": {"torch": "2.8.0"}}
ENV_B = {**ENV_A, "driver": "580.200.01"}
UNUSED = "xtuner/v1/model/moe/unused.py"
SOURCE = "def never():\n    return 0\n"


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def kept(tmp_path, monkeypatch):
    """A checkout whose second commit changes a function no process ran, and OPD's reference of its first commit on
    ENV_A with evidence that says so; the diff read by the node's own script, run here with bash."""
    from rl_verify import settings

    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path / "records"))
    repo = tmp_path / "repo"
    (repo / "xtuner/v1/model/moe").mkdir(parents=True)
    _git(repo.parent, "init", "-q", str(repo))
    (repo / UNUSED).write_text(SOURCE)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    blob = _git(repo, "rev-parse", f"HEAD:{UNUSED}")
    (repo / UNUSED).write_text(SOURCE.replace("0", "1"))
    _git(repo, "commit", "-qam", "head")
    head = _git(repo, "rev-parse", "HEAD")

    def changed_lines(client, checkout, a, b):  # node.ops.changed_lines without SSH: the same script, here
        done = subprocess.run(["bash", "-c", evidence_scripts.changed_lines_script(str(repo), a, b)],
                              capture_output=True, text=True)
        if done.returncode:
            raise unchanged.node.NodeError(done.stderr)
        return done.stdout

    monkeypatch.setattr(unchanged.node, "changed_lines", changed_lines)
    spec = load_suite("opd")
    key = bitwise.reference_key("opd", "fo", bitwise.fingerprint(ENV_A), bitwise_lane.lane_config(spec))
    made_at = "2026-12-01T00:00:00+00:00"
    references.put(key, {"state": references.TRUSTED, "sha": base, "made_at": made_at, "rows": [],
                         "environment": bitwise.fingerprint(ENV_A)})
    found = evidence.Evidence(full={"xtuner/other.py": (1,)}, lane={"xtuner/other.py": (1,)},
                              hashes={UNUSED: blob}, blocks={UNUSED: [(1, 2, -1, True)]})
    references.put_evidence(key, {**found.to_dict(), "sha": base, "made_at": made_at})
    (repo / UNUSED).write_text(SOURCE.replace("0", "2"))
    _git(repo, "commit", "-qam", "same executed code as the reference")
    same = _git(repo, "rev-parse", "HEAD")
    (repo / "xtuner/new.py").write_text("x = 1\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a new module")
    other = _git(repo, "rev-parse", "HEAD")
    return spec, base, head, same, other


def _tree(spec) -> list[str]:
    """A checkout tree with a file for every ``affects`` pattern (no rule out of date)."""
    return [p.replace("**", "x/y.py").replace("*", "x") for p in spec.affects]


def _decide(spec, head, environment, verdicts=()):
    return unchanged._by_evidence(None, "/checkout", head, spec, "fo", _tree(spec), list(verdicts), False,
                                  datetime(2026, 12, 7, tzinfo=timezone.utc), lambda: environment)


def test_a_change_no_process_ran_is_unchanged_on_the_references_own_environment(kept):
    spec, base, head, *_ = kept
    entry = _decide(spec, head, ENV_A)
    assert entry is not None and entry["sha"] == base and entry["evidence"]["lines"] == [f"{UNUSED}:2"]


def test_evidence_recorded_on_another_environment_grants_no_pass_unchanged(kept):
    spec, _, head, *_ = kept
    assert _decide(spec, head, ENV_B) is None
    assert _decide(spec, head, None) is None  # an environment that cannot be read: no evidence either
    why = unchanged._evidence_of_this_environment(spec, "fo", ENV_B)
    assert isinstance(why, str) and "no trusted bitwise reference on this environment" in why


def test_a_later_fail_of_the_same_executed_code_turns_the_evidence_shortcut_off(kept):
    spec, _, head, *_ = kept
    later = {"suite": "opd", "sha": head[::-1], "doubting": True, "outcome": "FAIL", "run_id": "r", "report": "-",
             "written_at": datetime(2026, 12, 5, tzinfo=timezone.utc).timestamp()}
    assert _decide(spec, head, ENV_A, [{**later, "sha": head}]) is None  # a FAIL of this very commit
    assert _decide(spec, head, ENV_A, [later]) is None  # a commit the checkout lacks: not known to differ


def test_the_record_check_compares_executed_blocks_not_files(kept):
    spec, _, head, same, other = kept
    failed = {"suite": "opd", "doubting": True, "outcome": "FAIL", "run_id": "r", "report": "-",
              "written_at": datetime(2026, 12, 5, tzinfo=timezone.utc).timestamp()}
    # a later FAIL of a commit whose changed blocks never ran either: the same executed code FAILed
    assert _decide(spec, head, ENV_A, [{**failed, "sha": same}]) is None
    # a later FAIL of a commit with a new module (code the reference never had): not the same code
    assert _decide(spec, head, ENV_A, [{**failed, "sha": other}]) is not None
