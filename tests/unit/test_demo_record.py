"""`make demo` starts from an empty record, the earlier demo's moved aside (issue 54: a second demo in a row
found its commits verified and PASS (unchanged) of themselves, and its story stopped)."""

from __future__ import annotations

from scripts.demo import set_aside


def test_an_earlier_record_is_moved_aside_and_only_the_newest_three_are_kept(tmp_path):
    records, into = tmp_path / "records", tmp_path / "aside"
    moved = []
    for i in range(5):
        (records / "rl_accuracy_verification").mkdir(parents=True)
        (records / "rl_accuracy_verification" / "report.md").write_text(f"demo {i}")
        moved.append(set_aside(records, into))
        assert not records.exists() and (moved[-1] / "rl_accuracy_verification" / "report.md").read_text() == \
            f"demo {i}"
    assert sorted(p.name for p in into.iterdir()) == sorted(m.name for m in moved[-3:])


def test_no_record_or_an_empty_one_is_left_where_it_is(tmp_path):
    assert set_aside(tmp_path / "records", tmp_path / "aside") is None
    (tmp_path / "records").mkdir()
    assert set_aside(tmp_path / "records", tmp_path / "aside") is None and (tmp_path / "records").is_dir()
