"""Each constant has one home (issue 31): short SHAs, record file names, settings' keys, the DAGs' start date."""

from __future__ import annotations

import re
from pathlib import Path

from rl_verify import settings
from rl_verify.core.names import SHORT_SHA, short_sha

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "include" / "rl_verify"


def _sources(*folders: str) -> dict[Path, str]:
    return {p: p.read_text() for folder in folders for p in (ROOT / folder).rglob("*.py")}


def test_short_sha_cuts_a_commit_to_the_length_people_are_shown():
    assert short_sha("0123456789abcdef0123") == "0123456789ab"
    assert len(short_sha("f" * 40)) == SHORT_SHA
    assert short_sha(None) == "" and short_sha("abc") == "abc"


def test_no_module_cuts_a_sha_by_hand():
    # A content digest (sha256) is not a commit: its own cut stays where it is made.
    cut = re.compile(r"\[:12\]")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p, text in _sources("include", "dags", "scripts", "harness").items()
                 for n, line in enumerate(text.splitlines(), 1)
                 if cut.search(line) and "sha256" not in line and "files[name]" not in line
                 and p != PACKAGE / "core" / "names.py"]
    assert offenders == [], f"use rl_verify.core.names.short_sha: {offenders}"


def test_the_baseline_tracker_file_name_is_written_once():
    offenders = [str(p.relative_to(ROOT)) for p, text in _sources("include", "dags").items()
                 if '"baseline.jsonl"' in text and p != PACKAGE / "settings.py"]
    assert offenders == [], f"use settings.BASELINE_TRACKER_FILE: {offenders}"
    assert settings.BASELINE_TRACKER_FILE == "baseline.jsonl"


def test_node_settings_keys_are_not_raw_strings_outside_settings():
    keys = "RL_VERIFY_(?:NODE_CHECKOUT|REMOTE_RUNS_DIR)"
    raw = re.compile(rf"""\[["']{keys}["']\]|^\s*["']{keys}["']\s*:""", re.M)
    offenders = [str(p.relative_to(ROOT)) for p, text in _sources("include", "dags").items()
                 if raw.search(text) and p != PACKAGE / "settings.py"]
    assert offenders == [], f"use settings.NODE_CHECKOUT_KEY / REMOTE_RUNS_DIR_KEY: {offenders}"


def test_every_dag_starts_on_the_settings_start_date():
    dags = sorted((ROOT / "dags").glob("rl_*.py"))
    assert len(dags) == 4
    for dag in dags:
        text = dag.read_text()
        assert "start_date=pendulum.datetime(*settings.DAGS_START_DATE" in text, dag.name
        assert not re.search(r"pendulum\.datetime\(\d{4}", text), dag.name
