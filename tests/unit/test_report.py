"""Pins the report: strict JSON keys, section order, escaping, self-contained HTML, atomic writes."""

from __future__ import annotations

import json
import math
import os

from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.report import ReportMeta, build_report, render_markdown, write_report


def suite(name="opd", passed=False, metric="eval/gsm8k/acc", value=0.4, plots=()):
    check = Check(metric=metric, step=5, baseline=0.5, current=value,
                  error=abs(0.5 - value) if isinstance(value, float) else None, threshold=0.03, operator="<",
                  method="absolute", passed=passed, source="golden", note="current line 7")
    return SuiteResult(suite=name, verdict="PASS" if passed else "FAIL", failure_class=None if passed else "accuracy",
                       checks=[check], abnormal=[] if passed else ["cur.jsonl:9: partial last line dropped"],
                       next_steps=["Inference: something"], trackers={"current": "/runs/cur.jsonl"},
                       plots=list(plots))


def tiny_png(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def test_single_suite_report_json_has_the_required_top_level_keys(tmp_path):
    paths = write_report(tmp_path, [suite()], ReportMeta(commit="a" * 40))
    data = json.loads(paths["json"].read_text())
    for key in ("suite", "verdict", "commit", "trackers", "checks", "abnormal", "next_steps", "suites"):
        assert key in data
    assert data["verdict"] == "FAIL" and data["commit"] == "a" * 40 and data["suite"] == "opd"
    row = data["checks"][0]
    for key in ("metric", "step", "baseline", "current", "error", "threshold", "operator", "method", "passed",
                "source"):
        assert key in row
    assert all(s.startswith("Inference:") for s in data["next_steps"])


def test_multi_suite_report_has_overall_verdict_and_suites_list(tmp_path):
    paths = write_report(tmp_path, [suite("grpo", passed=True), suite("opd", passed=False)],
                         ReportMeta(notes=["Rejected by alice"]))
    data = json.loads(paths["json"].read_text())
    assert data["verdict"] == "FAIL" and [s["suite"] for s in data["suites"]] == ["grpo", "opd"]
    assert data["notes"] == ["Rejected by alice"]
    assert write_report(tmp_path, [suite("grpo", True), suite("opd", True)], ReportMeta()) and \
        json.loads((tmp_path / "report.json").read_text())["verdict"] == "PASS"


def test_overall_override_is_reported_with_the_computed_verdict(tmp_path):
    data = build_report([suite(passed=True)], ReportMeta(overall="REJECTED"))
    assert data["verdict"] == "REJECTED" and data["computed_verdict"] == "PASS"


def test_no_suite_is_never_a_pass():
    assert build_report([], ReportMeta())["verdict"] == "FAIL"


def test_non_finite_numbers_are_written_as_strings_in_strict_json(tmp_path):
    paths = write_report(tmp_path, [suite(value=math.nan)], ReportMeta())
    text = paths["json"].read_text()
    data = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert data["checks"][0]["current"] == "NaN"
    assert Check.from_dict(data["checks"][0]).current != Check.from_dict(data["checks"][0]).current  # NaN back


def test_markdown_follows_runbook_order_with_abnormal_findings_on_top():
    md = render_markdown([suite()], ReportMeta(commit="b" * 40))
    order = ["# RL accuracy verification: FAIL", "## Abnormal findings",
             "| metric | values at step (eval point, or worst step) | first breach at step | baseline | current "
             "| error",
             "## Files", "## Commit under test", "## Suggested next steps (inference"]
    positions = [md.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert "/runs/cur.jsonl" in md and "b" * 40 in md


def test_html_escapes_tracker_strings_and_embeds_pngs(tmp_path):
    png = tiny_png(tmp_path / "opd_metrics.png")
    evil = suite(metric="<script>alert(1)</script>", plots=[str(png)])
    evil.checks[0].note = "<script>alert('note')</script>"
    evil.abnormal.append("<img src=x onerror=alert(2)>")
    paths = write_report(tmp_path, [evil], ReportMeta(commit="<b>"))
    page = paths["html"].read_text()
    assert "<script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "data:image/png;base64," in page and 'src="opd_metrics.png"' not in page


def test_markdown_table_cells_cannot_be_broken_by_pipes():
    md = render_markdown([suite(metric="a|b\nc")], ReportMeta())
    row = next(line for line in md.splitlines() if "| 5 |" in line)
    assert "a\\|b c" in row


def test_writes_are_atomic_and_leave_no_temp_files(tmp_path):
    write_report(tmp_path, [suite()], ReportMeta())
    write_report(tmp_path, [suite(passed=True)], ReportMeta())
    assert sorted(os.listdir(tmp_path)) == ["report.html", "report.json", "report.md"]
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "PASS"


def test_suite_result_round_trips_through_dict():
    original = suite()
    assert SuiteResult.from_dict(json.loads(json.dumps(original.to_dict()))) == original


def test_html_escapes_a_script_metric_name_and_value_coming_from_a_tracker(tmp_path):
    from rl_verify.engines.opd import compare_opd

    evil = "<script>alert('m')</script>"
    golden = {"suite": "opd", "source": {"document": "test", "measured": "2026-11-30", "commit": "c", "runs": 1,
                                         "total_train_steps": 1},
              "thresholds": {evil: {"method": "absolute", "operator": "<", "threshold": 0.1}},
              "golden": {"1": {evil: 0.5}}}
    (tmp_path / "golden.json").write_text(json.dumps(golden))
    (tmp_path / "cur.jsonl").write_text(json.dumps({"step": 1, "response/rewards/mean": 0.5,
                                                    evil: "<script>alert('v')</script>"}) + "\n")
    result = compare_opd(tmp_path / "cur.jsonl", tmp_path / "out", golden=tmp_path / "golden.json", eval_points=[1])
    assert result.verdict == "FAIL"  # a non-numeric value never passes
    page = write_report(tmp_path / "out", [result], ReportMeta())["html"].read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;m&#x27;)&lt;/script&gt;" in page


# ----------------------------------------------------------------------------- no empty sentence, per class
EMPTY_PATTERNS = [r":\s*\.", r"\(\s*\)", r"\bNone\b", r"\bnan\b", r"``", r"\[\s*\]", r":\s*;", r":\s*$"]


def _class_reports(tmp_path):
    """One real engine result per failure class (and a PASS), each with the rows it would show."""
    from conftest import CHECKER_DIR, dump_rows, grpo_rows, opd_rows
    from rl_verify.engines.grpo import compare_grpo
    from rl_verify.engines.opd import compare_opd

    def opd(name, **kw):
        cur = dump_rows(tmp_path / f"{name}.jsonl", opd_rows(**kw))
        return compare_opd(cur, tmp_path / name, plot=False)

    def grpo(name, cur_rows, **kw):
        base = dump_rows(tmp_path / f"{name}.base.jsonl", grpo_rows())
        cur = dump_rows(tmp_path / f"{name}.jsonl", cur_rows)
        return compare_grpo(base, cur, CHECKER_DIR, tmp_path / name, plot=False, **kw)

    return {
        "pass": opd("pass"),
        "accuracy": opd("accuracy", change=lambda m, s, v: v + 0.05 if (m == "eval/gsm8k/acc" and s >= 10) else v),
        "missing eval rows": opd("missing", drop={("eval/gsm8k/acc", 20), ("eval/geo3k/acc", 20)}),
        "performance": grpo("perf", grpo_rows(time_step=lambda i: 40.0 + (12.0 if i == 30 else 0)), wall_time_s=2500.0),
        "step count": grpo("short", grpo_rows(steps=30)),
        "infrastructure": SuiteResult.infrastructure("grpo", "no tracker: no experiment folder matches /w/*/t.jsonl"),
    }


def _prose(text: str, html: bool) -> list[str]:
    """Lines of a rendered report outside its tables (and code blocks)."""
    import re

    if html:
        text = re.sub(r"<table>.*?</table>", "", text, flags=re.S)
        text = re.sub(r"<style>.*?</style>", "", text, flags=re.S)
        text = re.sub(r"</?(span|b|code)\b[^>]*>", "", text)
        text = re.sub(r"<[^>]+>", "\n", text)
        return [line for line in text.splitlines() if line.strip()]
    return [line for line in text.splitlines() if line.strip() and not line.startswith("|") and line != "```"]


def test_no_report_of_any_class_has_an_empty_or_placeholder_sentence(tmp_path):
    import re

    from rl_verify.core.report import render_html

    results = _class_reports(tmp_path)
    assert results["accuracy"].failure_class == "accuracy"
    assert results["performance"].failure_class == "performance"
    assert results["missing eval rows"].failure_class == "infrastructure"
    assert results["step count"].failure_class == "infrastructure"
    for name, result in results.items():
        for meta in (ReportMeta(commit="c" * 40, dag_run_id="manual__1"), ReportMeta()):
            for html, text in ((False, render_markdown([result], meta)), (True, render_html([result], meta))):
                for line in _prose(text, html):
                    for pattern in EMPTY_PATTERNS:
                        assert not re.search(pattern, line), f"{name} ({'html' if html else 'md'}): {line!r}"


def test_sections_with_nothing_to_say_are_left_out():
    bare = SuiteResult.infrastructure("opd", "ssh connection refused")
    md = render_markdown([bare], ReportMeta())
    assert "## Tracker and log paths" not in md and "## Commit under test" not in md
    assert "Measurements:" not in md and "pass --commit" not in md
    passing = render_markdown([suite(passed=True)], ReportMeta(commit="d" * 40))
    assert "## Abnormal findings" not in passing and "- none" not in passing


def test_commit_hint_is_the_callers_words():
    md = render_markdown([suite()], ReportMeta(commit_hint="not given (pass --commit SHA)"))
    assert "- commit: not given (pass --commit SHA)" in md


def test_table_headers_say_which_step_the_values_come_from():
    md = render_markdown([suite()], ReportMeta())
    assert "values at step (eval point, or worst step)" in md and "first breach at step" in md


def test_missing_value_shows_as_missing_not_as_a_fail():
    result = suite()
    result.checks[0].current, result.checks[0].missing = None, True
    row = next(line for line in render_markdown([result], ReportMeta()).splitlines() if "| 5 |" in line)
    assert "| missing |" in row and "| FAIL |" not in row


def test_engine_and_report_words_name_no_cli_flag():
    """CLI flags belong to the CLI's own output: the engine's and the report's words are read in DAG
    reports too (the CLI passes its flag hints in through ``missing_reference``/``commit_hint``)."""
    import re
    from pathlib import Path

    import rl_verify

    import ast

    package = Path(rl_verify.__file__).parent
    files = [p for pattern in ("engines/**/*.py", "core/report/*.py", "core/nextsteps.py", "core/model.py",
                               "core/shapes.py", "core/tracker.py") for p in sorted(package.glob(pattern))]
    assert len(files) >= 10
    for path in files:
        name, source = str(path.relative_to(package)), path.read_text()
        # An engine's own command-line options (cli_args, cli_compare) are the CLI's words, not the report's.
        cli = [range(f.lineno, f.end_lineno + 1) for f in ast.walk(ast.parse(source))
               if isinstance(f, ast.FunctionDef) and f.name in ("cli_args", "cli_compare")]
        for number, line in enumerate(source.splitlines(), 1):
            if any(number in lines for lines in cli):
                continue
            assert not re.search(r"[\"' (]--[a-z][a-z-]+", line), f"{name}:{number}: {line.strip()}"


def test_the_confirmations_table_writes_a_spread_and_a_shift_with_the_digits_of_the_metrics_errors():
    from rl_verify.core.report import estimates_html, estimates_lines

    outcome = {"outcome": "PASS", "reason": "the first run passed: nothing to confirm", "runs": [],
               "estimates": {"simulated": "1000 healthy verifications", "spread": "shipped", "false_alarm": 0.006,
                             "single_run_false_alarm": 0.479, "inconclusive": 0.005, "mean_runs": 1.5,
                             "metrics": {"eval/gsm8k/acc": {"sigma": 0.0100733, "threshold": 0.03,
                                                            "healthy_breach": 0.058,
                                                            "min_detectable_shift": 0.0233203},
                                         "response/response_len/mean": {"sigma": 0.0749676, "threshold": 0.18,
                                                                        "healthy_breach": 0.174,
                                                                        "min_detectable_shift": None}}}}
    md = "\n".join(estimates_lines(outcome))
    assert "| eval/gsm8k/acc | 0.0101 | 0.03 | 5.8% | 0.0233 |" in md
    assert "| response/response_len/mean | 0.075 | 0.18 | 17.4% | - |" in md
    html = "\n".join(estimates_html(outcome))
    assert "<td>0.0101</td><td>0.03</td><td>5.8%</td><td>0.0233</td>" in html


def test_a_report_in_a_working_copy_names_no_path_of_it_not_even_of_a_sibling_folder(tmp_path):
    """A repeat's report (``opd-r1/``) names its suite's golden table in the first run's folder
    (``opd/baseline-version/``): a reader finds both in the record, never in the deleted task workspace."""
    work = tmp_path / "task-x1"
    folder = work / "opd-r1"
    folder.mkdir(parents=True)
    golden = work / "opd" / "baseline-version" / "golden.json"
    result = SuiteResult(suite="opd", verdict="PASS", trackers={"current": str(folder / "tracker.jsonl"),
                                                              "golden": str(golden)})
    written = write_report(folder, [result], shown_as="s3://rec/run-1/opd-r1", root=(work, "s3://rec/run-1"))
    for path in written.values():
        text = path.read_text()
        assert str(work) not in text, path.name
    data = json.loads(written["json"].read_text())
    assert data["trackers"] == {"current": "s3://rec/run-1/opd-r1/tracker.jsonl",
                                "golden": "s3://rec/run-1/opd/baseline-version/golden.json"}
