"""Versioned baselines in the record store (issue 9 items 4 and 5): import, add, promote, load, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import GOLDEN, dump_rows, grpo_rows, opd_rows
from rl_verify import settings
from rl_verify.store import baseline_files, baselines
from rl_verify.store.baselines import Provenance
from rl_verify.cli import main
from rl_verify.core.errors import InputError
from rl_verify import engines
from rl_verify.engines import load_suite

RUNBOOK = Path("/work/shared/seed/runbook.md")


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """A plain-folder record store as RL_VERIFY_RECORD_ROOT."""
    root = tmp_path / "records"
    monkeypatch.setattr(settings, "RECORD_ROOT", str(root))
    return root


def calibration(**overrides) -> Provenance:
    values = dict(source="calibration", commit="a" * 40, runs=3, dag_run_ids=("cal__1",), dates=("2026-11-30",),
                  node="sim_node", hardware="8x simulated H200", approved_by="alice",
                  statistics={"max_dev": {"eval/gsm8k/acc": 0.01}}, note="test calibration")
    return Provenance(**{**values, **overrides})


def golden_bytes(gsm8k_at_25: float = 0.6811) -> bytes:
    data = json.loads(GOLDEN.read_text())
    data["golden"]["25"]["eval/gsm8k/acc"] = gsm8k_at_25
    return json.dumps(data).encode()


def version_dir(store: Path, suite: str, n: int) -> Path:
    return store / "baselines" / suite / f"v{n}"


# ----------------------------------------------------------------------------- import_shipped

def test_import_shipped_opd_is_v1_with_the_runbook_provenance_and_becomes_current(store):
    done = baselines.import_shipped("opd")
    rec = done.record
    assert (done.created, done.made_current) == (True, True)
    assert (rec.suite, rec.version, rec.source) == ("opd", 1, "shipped")
    assert (rec.commit, rec.runs, rec.dates) == ("4e7db028", 3, ("2026-10-26",))
    assert rec.statistics["total_train_steps"] == 25
    assert rec.statistics["threshold_rule"] == "measured max run-to-run deviation x 1.5 margin, N=3, 25 steps"
    assert "3-run mean measured 2026-10-26" in rec.note and rec.approved_by is None
    assert (version_dir(store, "opd", 1) / "golden.json").read_bytes() == GOLDEN.read_bytes()
    pointer = baselines.current("opd")
    assert (pointer.version, pointer.promoted_by, pointer.previous) == (1, baselines.IMPORT_PROMOTER, None)


def test_import_shipped_grpo_references_the_share_baseline_named_by_the_suite_spec(store):
    rec = baselines.import_shipped("grpo").record
    assert rec.baseline_ref == load_suite("grpo").baseline == "${CI_SHARE_BASELINE}/qwen3-rl-lmdeploy/tracker.jsonl"
    assert (rec.runs, rec.commit, rec.files) == (5, None, {})
    assert "Average of 5 historical runs." in rec.note
    assert sorted(p.name for p in version_dir(store, "grpo", 1).iterdir()) == ["version.json"]


def test_runs_importing_v1_together_wait_for_its_writer_instead_of_calling_it_an_interrupted_write(store,
                                                                                                  monkeypatch):
    """A bisection's probes start together on a fresh store: one writes v1 (version.json last), the others wait."""
    import threading

    real_put, started = baseline_files.put, threading.Event()

    def slow_put(path, data, root):
        if path.name == "version.json":
            started.set()
            threading.Event().wait(1.0)  # the writer is slow: another run looks meanwhile
        return real_put(path, data, root)

    monkeypatch.setattr(baseline_files, "put", slow_put)
    writer = threading.Thread(target=baselines.import_shipped, args=("opd",))
    writer.start()
    assert started.wait(10)
    other = baselines.in_use(["opd"], {})  # v1's folder exists, its version.json not yet
    writer.join()
    assert other["opd"]["version"] == 1 and other["opd"]["current"]


def test_a_v1_folder_left_without_its_version_json_is_still_an_interrupted_write_after_the_wait(store, monkeypatch):
    monkeypatch.setattr(settings, "BASELINE_WRITE_WAIT_S", 0.3)
    version_dir(store, "opd", 1).mkdir(parents=True)
    with pytest.raises(InputError, match="interrupted write"):
        baselines.in_use(["opd"], {})


def test_import_shipped_is_idempotent_and_never_writes_a_second_v1(store):
    first = baselines.import_shipped("opd")
    before = (version_dir(store, "opd", 1) / "version.json").read_bytes()
    again = baselines.import_shipped("opd")
    assert (again.created, again.made_current) == (False, False)
    assert again.record == first.record
    assert (version_dir(store, "opd", 1) / "version.json").read_bytes() == before
    assert [e.version for e in baselines.list_versions("opd")] == [1]


@pytest.mark.skipif(not RUNBOOK.is_file(), reason="the runbook share is not mounted here")
def test_shipped_provenance_quotes_the_runbook_verbatim():
    text = " ".join(RUNBOOK.read_text(encoding="utf-8").split())
    quotes = []
    for suite in ("grpo", "opd"):
        provenance, _ = engines.get(suite).shipped(load_suite(suite))
        quotes.append(provenance.note.split(': "', 1)[1].removesuffix('"'))  # the note ends in the quote
    quotes.append(engines.get("opd").shipped(load_suite("opd"))[0].statistics["threshold_rule"])
    assert quotes[0] == "Average of 5 historical runs."
    for quote in quotes:
        assert quote in text, quote


# ----------------------------------------------------------------------------- add_version

def test_add_version_numbers_v2_then_v3_in_new_folders_and_never_overwrites(store):
    baselines.import_shipped("opd")
    assert baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)}) == 2
    v2_record = (version_dir(store, "opd", 2) / "version.json").read_bytes()
    v2_golden = (version_dir(store, "opd", 2) / "golden.json").read_bytes()
    assert baselines.add_version("opd", calibration(commit="b" * 40), {"golden.json": golden_bytes(0.71)}) == 3
    assert (version_dir(store, "opd", 2) / "version.json").read_bytes() == v2_record
    assert (version_dir(store, "opd", 2) / "golden.json").read_bytes() == v2_golden
    assert [(e.version, e.record.source) for e in baselines.list_versions("opd")] == [
        (1, "shipped"), (2, "calibration"), (3, "calibration")]
    assert baselines.current("opd").version == 1  # adding never promotes


def test_add_version_to_an_empty_suite_imports_the_shipped_v1_first(store):
    assert baselines.add_version("opd", calibration(), {"golden.json": golden_bytes()}) == 2
    assert baselines.show("opd", 1).source == "shipped"


def test_add_version_skips_a_left_over_incomplete_folder_and_lists_it_as_unusable(store):
    baselines.import_shipped("opd")
    version_dir(store, "opd", 2).mkdir()  # an interrupted write: no version.json
    assert baselines.add_version("opd", calibration(), {"golden.json": golden_bytes()}) == 3
    entries = {e.version: e for e in baselines.list_versions("opd")}
    assert entries[2].record is None and "v2/version.json" in entries[2].problem
    assert "interrupted write" in entries[2].problem
    assert entries[3].problem is None


def test_add_version_refuses_an_invalid_golden_table_and_writes_nothing(store):
    baselines.import_shipped("opd")
    broken = json.loads(GOLDEN.read_text())
    del broken["thresholds"]["eval/gsm8k/acc"]
    with pytest.raises(InputError, match="eval/gsm8k/acc has no threshold") as err:
        baselines.add_version("opd", calibration(), {"golden.json": json.dumps(broken)})
    assert "nothing was written" in str(err.value)
    with pytest.raises(InputError, match="has no golden.json"):
        baselines.add_version("opd", calibration(), {"stats.csv": "a,b\n"})
    assert [e.version for e in baselines.list_versions("opd")] == [1]


def test_add_version_refuses_golden_values_at_other_eval_points_than_the_spec(store):
    other = json.loads(GOLDEN.read_text())
    other["golden"]["30"] = other["golden"]["25"]
    with pytest.raises(InputError, match="eval_points"):
        baselines.add_version("opd", calibration(), {"golden.json": json.dumps(other)})


def test_calibration_provenance_needs_n_of_at_least_2_and_a_commit():
    with pytest.raises(ValidationError, match="N >= 2"):
        calibration(runs=1)
    with pytest.raises(ValidationError, match="reference commit"):
        calibration(commit=None)


def test_add_version_refuses_the_shipped_source_and_reserved_file_names(store):
    with pytest.raises(InputError, match="only import_shipped"):
        baselines.add_version("opd", Provenance(source="shipped"), {"golden.json": golden_bytes()})
    with pytest.raises(InputError, match="cannot be a data file name"):
        baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(), "version.json": b"{}"})
    with pytest.raises(InputError, match="cannot be a data file name"):
        baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(), "../x": b""})


def test_grpo_calibration_version_holds_a_baseline_tracker_with_the_spec_step_count(store, tmp_path):
    tracker = dump_rows(tmp_path / "mean.jsonl", grpo_rows())
    n = baselines.add_version("grpo", calibration(runs=5), {"baseline.jsonl": tracker})
    assert n == 2 and baselines.read_data("grpo", n, "baseline.jsonl") == tracker.read_bytes()
    short = dump_rows(tmp_path / "short.jsonl", grpo_rows(steps=30))
    with pytest.raises(InputError, match="30 step-summary rows but suite grpo trains 45"):
        baselines.add_version("grpo", calibration(runs=5), {"baseline.jsonl": short})
    with pytest.raises(InputError, match="neither baseline.jsonl nor a baseline_ref"):
        baselines.add_version("grpo", calibration(runs=5), {})
    assert [e.version for e in baselines.list_versions("grpo")] == [1, 2]


def test_grpo_baseline_tracker_with_nan_is_refused(store, tmp_path):
    rows = grpo_rows(rewards=lambda i: float("nan") if i == 7 else 0.5)
    tracker = dump_rows(tmp_path / "nan.jsonl", rows)
    with pytest.raises(InputError, match="NaN.*response/rewards/mean at step 7"):
        baselines.add_version("grpo", calibration(), {"baseline.jsonl": tracker})


# ----------------------------------------------------------------------------- promote

def test_promote_switches_current_and_promoting_the_older_version_goes_back(store):
    baselines.import_shipped("opd")
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    forward = baselines.promote("opd", "v2", by="alice")
    assert (forward.version, forward.previous, forward.promoted_by) == (2, 1, "alice")
    back = baselines.promote("opd", 1, by="bob")
    assert (back.version, back.previous, back.promoted_by) == (1, 2, "bob")
    assert [(p.version, p.promoted_by) for p in back.history] == [
        (1, baselines.IMPORT_PROMOTER), (2, "alice"), (1, "bob")]
    assert [e.version for e in baselines.list_versions("opd")] == [1, 2]  # nothing deleted
    assert baselines.current("opd") == back


def test_promoting_the_current_version_again_changes_nothing(store):
    baselines.import_shipped("opd")
    before = (store / "baselines" / "opd" / "current.json").read_bytes()
    assert baselines.promote("opd", 1, by="carol").promoted_by == baselines.IMPORT_PROMOTER
    assert (store / "baselines" / "opd" / "current.json").read_bytes() == before


def test_promoting_a_missing_version_fails_naming_it_and_leaves_current_unchanged(store):
    baselines.import_shipped("opd")
    before = (store / "baselines" / "opd" / "current.json").read_bytes()
    with pytest.raises(InputError) as err:
        baselines.promote("opd", 7, by="alice")
    text = str(err.value)
    assert "baseline opd v7 does not exist (versions: v1)" in text and str(version_dir(store, "opd", 7)) in text
    assert "Fix:" in text
    assert (store / "baselines" / "opd" / "current.json").read_bytes() == before


def test_a_corrupt_golden_json_fails_naming_the_file_and_is_never_promoted(store):
    baselines.import_shipped("opd")
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    golden = version_dir(store, "opd", 2) / "golden.json"
    golden.write_text('{"suite": "opd", "golden": {')
    for call in (lambda: baselines.promote("opd", 2, by="alice"), lambda: baselines.load_version_data("opd", 2),
                 lambda: baselines.show("opd", 2)):
        with pytest.raises(InputError) as err:
            call()
        assert f"{golden}:1" in str(err.value) and "baseline opd v2 golden.json is not valid JSON" in str(err.value)
        assert "Fix:" in str(err.value)
    assert baselines.current("opd").version == 1
    entries = baselines.list_versions("opd")
    assert entries[0].problem is None and "golden.json" in entries[1].problem


def test_a_stored_golden_that_breaks_the_schema_names_the_field(store):
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes()})
    golden = version_dir(store, "opd", 2) / "golden.json"
    data = json.loads(golden.read_text())
    data["source"]["runs"] = 0
    golden.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"v2 golden.json does not fit OpdGolden: source.runs"):
        baselines.promote("opd", 2, by="alice")


def test_a_stored_golden_edited_after_writing_is_refused_by_its_sha256(store):
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    (version_dir(store, "opd", 2) / "golden.json").write_bytes(golden_bytes(0.75))
    with pytest.raises(InputError, match="v2 golden.json changed since it was written"):
        baselines.load_version_data("opd", 2)


def test_a_broken_version_json_names_the_file(store):
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes()})
    record = version_dir(store, "opd", 2) / "version.json"
    record.write_text(record.read_text().replace('"runs": 3', '"runs": "many"'))
    with pytest.raises(InputError, match=r"v2/version.json: baseline opd v2 version.json does not fit VersionRecord: "
                                         r"runs"):
        baselines.show("opd", 2)


def test_an_unreadable_current_json_is_named_and_promoting_rewrites_it(store):
    baselines.import_shipped("opd")
    pointer = store / "baselines" / "opd" / "current.json"
    pointer.write_text("not json")
    with pytest.raises(InputError, match="current.json is not valid JSON"):
        baselines.current("opd")
    repaired = baselines.promote("opd", 1, by="alice")
    assert repaired.version == 1 and "unreadable current.json" in repaired.note
    assert baselines.current("opd") == repaired


def test_unknown_suite_and_bad_version_text_are_input_errors(store):
    with pytest.raises(InputError, match="unknown suite 'nope'"):
        baselines.list_versions("nope")
    with pytest.raises(InputError, match="'two' is not a baseline version"):
        baselines.show("opd", "two")


# ----------------------------------------------------------------------------- load_version_data

def test_load_version_data_returns_the_golden_table_of_the_current_version_or_the_pinned_one(store):
    baselines.import_shipped("opd")
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    assert baselines.load_version_data("opd").value(25, "eval/gsm8k/acc") == 0.6811
    baselines.promote("opd", 2, by="alice")
    assert baselines.load_version_data("opd").value(25, "eval/gsm8k/acc") == 0.70
    assert baselines.load_version_data("opd", version=1).value(25, "eval/gsm8k/acc") == 0.6811
    assert baselines.resolve("opd").version == 2


def test_load_version_data_without_any_version_says_to_import(store):
    with pytest.raises(InputError, match="no current baseline version.*import-shipped"):
        baselines.load_version_data("opd")
    with pytest.raises(InputError, match="keeps no data file in its baseline versions"):
        baselines.load_version_data("grpo")


def test_a_file_url_root_works_like_a_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", f"file://{tmp_path / 'store'}")
    baselines.import_shipped("opd")
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    baselines.promote("opd", 2, by="alice")
    assert baselines.load_version_data("opd").value(25, "eval/gsm8k/acc") == 0.70
    assert (tmp_path / "store" / "baselines" / "opd" / "v2" / "golden.json").is_file()
    assert baselines.location("opd", 2) == f"file://{tmp_path / 'store'}/baselines/opd/v2"


# ----------------------------------------------------------------------------- CLI

def test_cli_list_prints_every_version_and_marks_the_current_one(store, capsys):
    assert main(["baselines", "import-shipped"]) == 0
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    capsys.readouterr()
    assert main(["baselines", "list", "--suite", "opd"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"opd: {store.resolve()}/baselines/opd"
    assert lines[1].split() == ["version", "current", "source", "commit", "N", "dates", "approved_by", "created_at",
                                "data"]
    assert lines[2].split()[:6] == ["v1", "*", "shipped", "4e7db028", "3", "2026-10-26"]
    assert lines[3].split()[:7] == ["v2", "-", "calibration", "a" * 40, "3", "2026-11-30", "alice"]
    assert "current: v1, promoted by import-shipped" in out and "grpo" not in out


def test_cli_show_prints_the_provenance_and_the_golden_table(store, capsys):
    baselines.import_shipped("opd")
    assert main(["baselines", "show", "--suite", "opd", "v1"]) == 0
    out = capsys.readouterr().out
    assert "version       v1 (current)" in out and "commit        4e7db028" in out
    assert "eval/gsm8k/acc                              0.4339  0.5972  0.6871  0.6990  0.6904  0.6811" in out
    assert "time/step                                   relative  < 0.1   0.043             reference only" in out


def test_cli_show_grpo_names_the_share_tracker(store, capsys):
    baselines.import_shipped("grpo")
    assert main(["baselines", "show", "--suite", "grpo", "1"]) == 0
    assert ("baseline tracker: ${CI_SHARE_BASELINE}/qwen3-rl-lmdeploy/tracker.jsonl (on the GPU node's share"
            in capsys.readouterr().out)


def test_cli_promote_switches_current_and_back_with_exit_0(store, capsys):
    baselines.import_shipped("opd")
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    assert main(["baselines", "promote", "--suite", "opd", "2", "--by", "alice"]) == 0
    assert "opd: current baseline is now v2 (was v1), promoted by alice" in capsys.readouterr().out
    assert main(["baselines", "promote", "--suite", "opd", "v1", "--by", "bob"]) == 0
    assert "opd: current baseline is now v1 (was v2), promoted by bob" in capsys.readouterr().out
    assert main(["baselines", "promote", "--suite", "opd", "1", "--by", "bob"]) == 0
    assert "already the current baseline" in capsys.readouterr().out


def test_cli_bad_input_exits_2_with_the_message_and_promotes_nothing(store, capsys):
    baselines.import_shipped("opd")
    assert main(["baselines", "promote", "--suite", "opd", "9", "--by", "alice"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl-verify baselines: ") and "baseline opd v9 does not exist" in err and "Fix:" in err
    assert main(["baselines", "show", "1"]) == 2
    assert "which suite?" in capsys.readouterr().err
    assert main(["baselines", "show", "--suite", "opd", "latest"]) == 2
    assert main(["baselines", "show", "--suite", "nope", "1"]) == 2  # argparse choices
    assert baselines.current("opd").version == 1


def test_cli_root_overrides_the_record_root_setting(store, tmp_path, capsys):
    other = tmp_path / "elsewhere"
    assert main(["baselines", "import-shipped", "--suite", "opd", "--root", str(other)]) == 0
    assert "opd: v1 imported (shipped: commit 4e7db028, N=3, dates 2026-10-26); made current" in capsys.readouterr().out
    assert (other / "baselines" / "opd" / "v1" / "golden.json").is_file() and not store.exists()
    assert main(["baselines", "import-shipped", "--suite", "opd", "--root", str(other)]) == 0
    assert "opd: v1 already present, unchanged" in capsys.readouterr().out
    assert main(["baselines", "list", "--root", str(other)]) == 0
    assert "grpo: " in capsys.readouterr().out


# ----------------------------------------------------------------------------- use by a verification run

@pytest.mark.parametrize("value,pins", [("", {}), (None, {}), ("opd=2", {"opd": 2}),
                                        ("grpo=v1,opd=3", {"grpo": 1, "opd": 3})])
def test_pins_are_suite_version_pairs_or_empty(value, pins):
    assert baselines.parse_pins(value, ["grpo", "opd"]) == pins


@pytest.mark.parametrize("value,said", [
    ("opd", "is not suite=VERSION pairs"), ("opd=0", "is not suite=VERSION pairs"),
    ("opd=2;grpo=1", "is not suite=VERSION pairs"), ("opd=2 ", "is not suite=VERSION pairs"),
    ("dapo=2", "suite 'dapo' is not selected for this run (suites: grpo, opd)"),
    ("opd=2,opd=3", "suite 'opd' is named twice"),
])
def test_bad_pins_name_the_param_and_the_fix(value, said):
    with pytest.raises(ValueError) as err:
        baselines.parse_pins(value, ["grpo", "opd"])
    assert "param 'baseline_versions'" in str(err.value) and said in str(err.value)
    assert "e.g. opd=2" in str(err.value)


def test_a_run_uses_each_suites_current_version_importing_what_ships_on_first_use(store):
    used = baselines.in_use(["grpo", "opd"], {})
    assert {s: (u["version"], u["current"]) for s, u in used.items()} == {"grpo": (1, True), "opd": (1, True)}
    assert used["opd"]["files"] == ["golden.json"] and used["grpo"]["files"] == []
    assert used["opd"]["label"].startswith("v1: shipped (Imported from the package (opd_golden_2026-10-26.json))")
    assert "3-run mean of commit 4e7db028" in used["opd"]["label"]
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    baselines.promote("opd", 2, by="alice")
    now = baselines.in_use(["opd"], {})["opd"]
    assert (now["version"], now["current"]) == (2, True)
    assert now["label"] == "v2: calibration of commit aaaaaaaaaaaa, N=3, approved by alice"
    pinned = baselines.in_use(["opd"], {"opd": 1})["opd"]
    assert (pinned["version"], pinned["current"]) == (1, False)


def test_a_missing_or_broken_pinned_version_is_one_error_listing_every_suite(store):
    baselines.in_use(["grpo", "opd"], {})
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    (version_dir(store, "opd", 2) / "golden.json").write_text("{")
    with pytest.raises(InputError) as err:
        baselines.in_use(["grpo", "opd"], {"grpo": 7, "opd": 2})
    text = str(err.value)
    assert "2 baseline version problem(s); nothing was launched" in text
    assert "baseline grpo v7 does not exist (versions: v1)" in text
    assert "baseline opd v2 golden.json is not valid JSON" in text
    assert "Fix: fix the param 'baseline_versions'" in text


def test_the_files_of_a_version_come_back_byte_for_byte_with_its_record(store):
    baselines.add_version("opd", calibration(), {"golden.json": golden_bytes(0.70)})
    files = baselines.version_files("opd", 2)
    assert files["golden.json"] == golden_bytes(0.70)
    assert json.loads(files["version.json"])["version"] == 2


# ----------------------------------------------------------------------------- rl-verify baselines propose

def _opd_trackers(tmp_path, shifts=(-0.004, 0.0, 0.004)):
    return [str(dump_rows(tmp_path / f"opd_{i}.jsonl", opd_rows(change=lambda m, s, v, d=d: v + d)))
            for i, d in enumerate(shifts)]


def test_propose_prints_the_opd_table_and_add_stores_a_version_that_is_not_current(store, tmp_path, capsys):
    trackers = _opd_trackers(tmp_path)
    assert main(["baselines", "propose", "--suite", "opd", "--commit", "c" * 40, *trackers]) == 0
    out = capsys.readouterr().out
    assert "opd: proposal from 3 runs of commit " + "c" * 40 + ", against v1: shipped" in out
    assert "| metric | eval point | proposed value | current value | proposed threshold |" in out
    assert out.count("3 runs are few for the x 1.5 rule") == 1  # the warnings, listed once
    assert "(not stored" in out and not version_dir(store, "opd", 2).exists()
    assert main(["baselines", "propose", "--suite", "opd", "--commit", "c" * 40, "--add", *trackers]) == 0
    assert "opd: added v2 (not current" in capsys.readouterr().out
    rec = baselines.show("opd", 2)
    assert (rec.source, rec.commit, rec.runs) == ("calibration", "c" * 40, 3)
    golden = baselines.load_version_data("opd", 2)
    assert golden.source.runs == 3 and golden.eval_points == [0, 5, 10, 15, 20, 25]
    # Judged against the reference baseline tracker, not the golden mean: today's thresholds are kept.
    shipped = baselines.load_version_data("opd", 1)
    for metric in ("response/response_len/mean", "time/step"):
        assert golden.thresholds[metric] == shipped.thresholds[metric]
    assert golden.thresholds["eval/gsm8k/acc"].threshold < shipped.thresholds["eval/gsm8k/acc"].threshold
    assert baselines.current("opd").version == 1
    assert main(["baselines", "promote", "--suite", "opd", "2", "--by", "alice"]) == 0
    assert baselines.in_use(["opd"], {})["opd"]["version"] == 2


def test_propose_for_grpo_stores_a_baseline_tracker_the_run_then_uses_instead_of_the_shares(store, tmp_path):
    trackers = [str(dump_rows(tmp_path / f"g{i}.jsonl", grpo_rows(rewards=lambda s, i=i: 0.5 + 0.005 * s + 0.001 * i)))
                for i in range(3)]
    assert main(["baselines", "propose", "--suite", "grpo", "--commit", "d" * 40, "--add", *trackers]) == 0
    assert main(["baselines", "promote", "--suite", "grpo", "2", "--by", "bob"]) == 0
    used = baselines.in_use(["grpo"], {})
    assert used["grpo"]["files"] == ["baseline.jsonl"]
    from rl_verify.core.tracker import read_tracker

    stored = version_dir(store, "grpo", 2) / "baseline.jsonl"
    assert read_tracker(stored).steps == 45
    from rl_verify.orchestration import verification as pipeline

    spec = pipeline.expanded_specs(["grpo"], {"CI_SHARE_BASELINE": "/s", "CI_SHARE_MODEL": "/m",
                                              "CI_SHARE_DATA": "/d"}, "/w", used)[0]
    assert spec.baseline is None


@pytest.mark.parametrize("make,said", [
    (lambda tmp: _opd_trackers(tmp, shifts=(0.0,)), "N = 1 run(s) given"),
    (lambda tmp: [*_opd_trackers(tmp, shifts=(0.0,)), str(dump_rows(tmp / "short.jsonl", opd_rows(steps=20)))],
     "runs have different step counts"),
])
def test_propose_refuses_bad_runs_naming_them_and_stores_nothing(store, tmp_path, capsys, make, said):
    assert main(["baselines", "propose", "--suite", "opd", "--commit", "c" * 40, "--add", *make(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Fix:" in err
    assert not version_dir(store, "opd", 2).exists()
