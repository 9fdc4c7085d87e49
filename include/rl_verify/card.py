"""The experiment card shown at the approval: 目标 / 判读标准 / 最小规模 / 前置条件.

The card is built from the suite specs and the versioned threshold files, so what a human approves
is exactly what the comparison will apply. A standing approval for nightly runs is bound to the
*experiment* fingerprint (``experiment_fingerprint``): the suites' specs as written (scale, step
counts, eval points, budgets, launch scripts and configs relative to the checkout, inputs relative to
the share roots) and their threshold/golden data with its version. Nothing run-specific enters it
(run id, worktree path, date, commit, the node's resolved paths), so two runs of the same card share
it and any defining change gives another.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from rl_verify.engines import engine_of
from rl_verify.grpo import WALL_TIME
from rl_verify.suite import SuiteSpec, data_file
from rl_verify.thresholds import GrpoThresholds, OpdGolden, Rule


def _thresholds(spec: SuiteSpec) -> dict[str, Any]:
    """The suite's threshold/golden data file, as the spec names it."""
    return json.loads(data_file(spec.data).read_text(encoding="utf-8"))


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _threshold(rule: Rule) -> str:
    """``< 12%`` for a relative threshold (as the runbook writes it), ``<= 0.0001`` otherwise."""
    if rule.method == "relative":
        return f"{rule.operator} {rule.threshold * 100:g}%"
    return f"{rule.operator} {_fmt(rule.threshold)}"


def grpo_criteria(spec: SuiteSpec, data: GrpoThresholds) -> list[str]:
    fe = data.final_eval
    rows = ["| metric | method | threshold | how |", "|---|---|---|---|",
            f"| `{fe.metric}` | {fe.method} | {fe.operator} {_fmt(fe.threshold)} | final step only |"]
    for rule in data.rules:
        q = data.percentile_metrics.get(rule.metric)
        how = f"p{q:g} of per-step errors" if q is not None else "every step"
        rows.append(f"| `{rule.metric}` | {rule.method} | {_threshold(rule)} | {how} |")
    rows.append(f"| {WALL_TIME} | - | < {spec.wall_time_budget_s // 60} min | whole run |")
    rows.append("")
    rows.append(f"Decided by the checkout's own `check_rl_result` with the runbook's `assert_info`; "
                f"source: {data.source.get('document', '?')}.")
    return rows


def golden_criteria(spec: SuiteSpec, data: OpdGolden) -> list[str]:
    rows = ["| metric | method | threshold | measured max dev |", "|---|---|---|---|"]
    for name, rule in data.thresholds.items():
        suffix = " (reference only)" if rule.reference_only else ""
        rows.append(f"| `{name}` | {rule.method} | {_threshold(rule)}{suffix} | {_fmt(rule.measured_max_dev)} |")
    golden_metrics = [m for m in data.thresholds if any(m in v for v in data.golden.values())]
    source = data.source.model_dump()
    rows += ["", "Golden values per eval point (" + ", ".join(
        f"{k}: {v}" for k, v in source.items() if k in ("kind", "measured", "commit", "runs")) + "):", "",
        "| step | " + " | ".join(f"`{m}`" for m in golden_metrics) + " |",
        "|---" * (len(golden_metrics) + 1) + "|"]
    for step in data.eval_points:
        values = data.golden[step]
        rows.append(f"| {step} | " + " | ".join(
            "-" if values.get(m) is None else f"{values[m]:.4f}" for m in golden_metrics) + " |")
    rows.append(f"\nSteps beyond {data.calibrated_max_step} are reported as not calibrated.")
    return rows


def card_sections(specs: Iterable[SuiteSpec], verified: Iterable[Mapping[str, str]],
                  node: str | Mapping[str, str], data_path: Callable[[SuiteSpec], Path] | None = None,
                  versions: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The card's four sections as Markdown lines (no commit, no date: these are fingerprinted).

    ``node``: the one node of every suite, or ``{suite: node}``. ``data_path``: the data file each
    suite is judged with (default: the spec's); ``versions``: suite -> its baseline version, in words.
    """
    data_path = data_path or (lambda spec: data_file(spec.data))
    versions = versions or {}
    specs = list(specs)
    goal = ["Verify that the commit under test keeps RL training accuracy aligned with the baselines "
            f"for: {', '.join(s.name.upper() for s in specs)} (runbook: seed/runbook.md)."]
    criteria: list[str] = []
    scale: list[str] = ["| suite | launch | steps | eval points | wall-time budget |", "|---|---|---|---|---|"]
    for spec in specs:
        engine = engine_of(spec)
        criteria += [f"**{spec.title}** — PASS only if every check below holds; the exit code is not trusted.", ""]
        if spec.name in versions:
            criteria += [f"Baseline version: {versions[spec.name]}", ""]
        criteria += engine.criteria(spec, engine.load_data(data_path(spec)))
        criteria.append("")
        scale.append(f"| {spec.name} | `{spec.script}` | {spec.expected_steps} | "
                     f"{', '.join(map(str, spec.eval_points))} | {spec.wall_time_budget_s // 60} min |")
    scale.append("")
    nodes = {node: [s.name for s in specs]} if isinstance(node, str) else \
        {n: [s for s, at in node.items() if at == n] for n in dict.fromkeys(node.values())}
    if len(nodes) == 1:
        scale.append(f"One 8-GPU node (`{next(iter(nodes))}`), one training at a time; suites on the same node run "
                     "one after the other.")
    else:
        scale.append(f"{len(nodes)} 8-GPU nodes, one training per node at a time: "
                     + "; ".join(f"`{n}` trains {', '.join(suites)}" for n, suites in nodes.items())
                     + ". Suites on different nodes train at the same time.")
    prereq = ["| suite | kind | path |", "|---|---|---|"]
    prereq += [f"| {v['suite']} | {v['kind']} | `{v['path']}` |" for v in verified]
    return {"目标 goal": goal, "判读标准 acceptance criteria": criteria,
            "最小规模 minimum scale": scale, "前置条件 prerequisites (verified on the node)": prereq}


def experiment_definition(specs: Iterable[SuiteSpec],
                          data: Callable[[SuiteSpec], Mapping[str, Any]] | None = None,
                          versions: Mapping[str, int] | None = None) -> dict[str, Any]:
    """What defines the experiment: each suite's spec as written (``${VAR}`` unexpanded), its data and
    the number of the baseline version it is judged against (when given)."""
    data = data or _thresholds
    ordered = sorted(specs, key=lambda s: s.name)
    out = {spec.name: {"spec": dict(spec.raw), "data": dict(data(spec))} for spec in ordered}
    for name, version in (versions or {}).items():
        if name in out:
            out[name]["baseline_version"] = version
    return out


def experiment_fingerprint(specs: Iterable[SuiteSpec],
                           data: Callable[[SuiteSpec], Mapping[str, Any]] | None = None,
                           versions: Mapping[str, int] | None = None) -> str:
    """Stable hash of ``experiment_definition``: what a standing approval is bound to."""
    text = json.dumps(experiment_definition(specs, data, versions), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(text: str) -> str:
    """Commit subjects are author-controlled: shown as text, never as HTML or Markdown markup."""
    import html
    import re

    return re.sub(r"([\\`*_\[\]<>|#!])", r"\\\1", html.unescape(text or "")).replace("\n", " ")


def render_card(commit: Mapping[str, Any], sections: Mapping[str, list[str]], run_id: str,
                fingerprint: str, notes: Iterable[str] = ()) -> str:
    """Full Markdown card: a title naming the commit and suites, the commit under test, then the four sections."""
    suites = ", ".join(commit.get("suites") or [])
    lines = [f"# Experiment card — `{commit['commit_ref']}`" + (f" · {suites}" if suites else ""), "",
             f"**DAG run:** `{run_id}`", "",
             f"**Commit under test:** `{commit['sha']}` (asked for `{commit['commit_ref']}`) — "
             f"{_plain(commit.get('subject', ''))}",
             f"**Worktree:** `{commit['worktree']}`" + (" — clean" if not commit.get("dirty_stat") else ""), ""]
    if commit.get("dirty_stat"):
        lines += ["**The worktree is dirty:**", "```", commit["dirty_stat"].rstrip(), "```", ""]
    for title, body in sections.items():
        lines += [f"## {title}", "", *body, ""]
    for note in notes:
        lines += [f"> {note}", ""]
    lines.append(f"Experiment fingerprint: `{fingerprint}` (suites, specs, thresholds and golden data; not the commit, "
                 "the run or its paths)")
    return "\n".join(lines)
