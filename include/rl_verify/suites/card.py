"""The experiment card shown at the approval: 目标 / 判读标准 / 最小规模 / 前置条件.

The card is built from the suite specs and their engines' criteria (``Engine.criteria``, from the
versioned threshold files), so what a human approves is exactly what the comparison will apply. A
standing approval for nightly runs is bound to the *experiment* fingerprint (``experiment_fingerprint``):
the suites' specs as written (scale, step counts, eval points, budgets, launch scripts and configs
relative to the checkout, inputs relative to the share roots) and their threshold/golden data with
its version. Nothing run-specific enters it
(run id, worktree path, date, commit, the node's resolved paths), so two runs of the same card share
it and any defining change gives another.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from typing import Any, Callable, Iterable, Mapping

from rl_verify.core import numbers
from rl_verify.core.thresholds import Rule
from rl_verify.suites.spec import SuiteSpec, data_file


def _thresholds(spec: SuiteSpec) -> dict[str, Any]:
    """The suite's threshold/golden data file, as the spec names it."""
    return json.loads(data_file(spec.data).read_text(encoding="utf-8"))


def fmt(value: Any) -> str:
    """A number as the card shows it (``-`` for none)."""
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def threshold_text(rule: Rule) -> str:
    """``< 12%`` for a relative threshold (as the runbook writes it), ``<= 0.0001`` otherwise, ``< 10 s`` for
    a time: the report writes the same (``rl_verify.core.numbers``)."""
    return numbers.style(rule.metric, rule.method, rule.threshold).threshold(rule.operator, rule.threshold)


def card_sections(specs: Iterable[SuiteSpec], verified: Iterable[Mapping[str, str]],
                  node: str | Mapping[str, str], criteria_of: Mapping[str, list[str]],
                  versions: Mapping[str, str] | None = None, repeats: int | None = None,
                  infra_retries: int | None = None) -> dict[str, list[str]]:
    """The card's four sections as Markdown lines (no commit, no date: these are fingerprinted).

    ``node``: the one node of every suite, or ``{suite: node}``. ``criteria_of``: suite -> its engine's
    acceptance criteria (``Engine.criteria``, from the data it is judged with); ``versions``: suite ->
    its baseline version, in words; ``repeats``: the extra runs a suite may take to confirm a FAIL;
    ``infra_retries``: the retry policy's attempts after an infrastructure failure (issue 55).
    """
    versions = versions or {}
    specs = list(specs)
    goal = ["Verify that the commit under test keeps RL training accuracy aligned with the baselines "
            f"for: {', '.join(s.name.upper() for s in specs)} (runbook: seed/runbook.md)."]
    criteria: list[str] = []
    scale: list[str] = ["| suite | launch | steps | eval points | wall-time budget |", "|---|---|---|---|---|"]
    for spec in specs:
        criteria += [f"**{spec.title}** — PASS only if every check below holds; the exit code is not trusted.", ""]
        if spec.name in versions:
            criteria += [f"Baseline version: {versions[spec.name]}", ""]
        criteria += criteria_of[spec.name]
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
    if repeats:
        scale.append("")
        scale.append(f"Confirmation: a suite whose FAIL run-to-run noise could have produced is repeated at the same "
                     f"commit with a new seed, up to {repeats} more time(s), and ends FAIL (reproduced), PASS (not "
                     f"reproduced) or INCONCLUSIVE; this card allows up to {repeats * len(specs)} extra training(s) in "
                     "all. A FAIL noise cannot produce (NaN, a crash, a wrong step count, a breach far outside the "
                     "measured spread) is final at once.")
    elif repeats == 0:
        scale += ["", "Confirmation off: each suite's first run's verdict is final (no extra training)."]
    if infra_retries:
        scale += ["", "Infrastructure: a training that fails as infrastructure for a passing cause (a crash at launch, "
                      "a teacher that did not come up, a stall, a preemption) is trained again, up to "
                      f"{infra_retries} "
                      "more time(s), in a job folder of its own once the failed attempt's processes are proven gone. "
                      "Never for an accuracy FAIL, bad input, a cancel outside rl-verify, or a second time on a node "
                      "at fault. The report names every attempt; an infrastructure message goes out only when the "
                      "retries are spent."]
    elif infra_retries == 0:
        scale += ["", "Infrastructure retries off: a training that fails as infrastructure ends its suite FAIL "
                      "(infrastructure) at once."]
    prereq = ["| suite | kind | path |", "|---|---|---|"]
    prereq += [f"| {v['suite']} | {v['kind']} | `{v['path']}` |" for v in verified]
    return {"目标 goal": goal, "判读标准 acceptance criteria": criteria,
            "最小规模 minimum scale": scale, "前置条件 prerequisites (verified on the node)": prereq}


def experiment_definition(specs: Iterable[SuiteSpec],
                          data: Callable[[SuiteSpec], Mapping[str, Any]] | None = None,
                          versions: Mapping[str, int] | None = None, repeats: int | None = None) -> dict[str, Any]:
    """What defines the experiment: each suite's spec as written (``${VAR}`` unexpanded), its data, the
    number of the baseline version it is judged against, and the extra runs a FAIL may take (when given)."""
    data = data or _thresholds
    ordered = sorted(specs, key=lambda s: s.name)
    out = {spec.name: {"spec": _measured(spec.raw), "data": dict(data(spec))} for spec in ordered}
    for name, version in (versions or {}).items():
        if name in out:
            out[name]["baseline_version"] = version
    if repeats is not None:
        out = {**out, "confirmation_repeats": repeats}
    return out


def _measured(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A spec as written, less what does not change what is measured: a log rule's retry kind (issue 55: whether
    an infrastructure failure trains again) leaves the experiment, its standing approvals and its verified PASSes
    as they were."""
    out = dict(raw)
    if isinstance(out.get("log_rules"), list):
        out["log_rules"] = [{k: v for k, v in rule.items() if k != "retry"} if isinstance(rule, Mapping) else rule
                            for rule in out["log_rules"]]
    return out


def experiment_fingerprint(specs: Iterable[SuiteSpec],
                           data: Callable[[SuiteSpec], Mapping[str, Any]] | None = None,
                           versions: Mapping[str, int] | None = None, repeats: int | None = None) -> str:
    """Stable hash of ``experiment_definition``: what a standing approval is bound to."""
    text = json.dumps(experiment_definition(specs, data, versions, repeats), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(text: str) -> str:
    """Commit subjects are author-controlled: shown as text, never as HTML or Markdown markup."""
    return re.sub(r"([\\`*_\[\]<>|#!])", r"\\\1", html.unescape(text or "")).replace("\n", " ")


def render_card(commit: Mapping[str, Any], sections: Mapping[str, list[str]], run_id: str,
                fingerprint: str, notes: Iterable[str] = ()) -> str:
    """Full Markdown card: a title naming the commit and suites, the commit under test, then the four sections."""
    suites = ", ".join(commit.get("suites") or [])
    # One line each (issue 35): in Airflow's Required Actions dialog an inline code span that wraps draws its
    # background over the line above, hiding its underscores; the run id and the worktree path (long, full of
    # underscores) are plain escaped text, so they wrap without hiding anything.
    lines = [f"# Experiment card — `{commit['commit_ref']}`" + (f" · {suites}" if suites else ""), "",
             f"- **DAG run:** {_plain(run_id)}",
             f"- **Commit under test:** `{commit['sha']}` (asked for `{commit['commit_ref']}`) — "
             f"{_plain(commit.get('subject', ''))}",
             f"- **Worktree:** {_plain(commit['worktree'])}" + (" — clean" if not commit.get("dirty_stat") else ""),
             ""]
    if commit.get("dirty_stat"):
        lines += ["**The worktree is dirty:**", "```", commit["dirty_stat"].rstrip(), "```", ""]
    for title, body in sections.items():
        lines += [f"## {title}", "", *body, ""]
    for note in notes:
        lines += [f"> {note}", ""]
    lines.append(f"Experiment fingerprint: `{fingerprint}` (suites, specs, thresholds and golden data; not the commit, "
                 "the run or its paths)")
    return "\n".join(lines)
