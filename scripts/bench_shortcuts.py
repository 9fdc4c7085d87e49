"""The shortcuts on XTuner's real history (issue 42): what a verification of each of XTuner's last 400 first-parent
commits on main would do per suite, decided by ``core.lane.judge`` (the DAG's own decision) with the shipped specs.

    python -m scripts.bench_shortcuts [--history tests/data/xtuner/history.json] [--numerics 0.3]

The facts are ``tests/data/xtuner/history.json`` (``scripts/xtuner_history.py``: each commit's changed paths against
its first parent, the tracked files at the newest commit and at pull request #1977's head). The tree at an older
commit is the newest tree with the later commits' additions removed and deletions put back, so every path rule is
checked against the tree it judges, commit by commit.

Two cadences: every commit verified against its parent (the parent standing for the suite's last verified PASS and
its trusted bitwise reference on an unchanged environment), and a nightly tip against the previous night's tip (the
union of the day's changes, UTC days by commit date). Per suite: the share answered PASS (unchanged), lane-eligible
(the bitwise lane runs; its bits decide), lane off by a rule (a path the deterministic mode bypasses, a stale
pattern) and full for another reason; every commit touching the LMDeploy rollout's Python with its decision; the
patterns that match nothing at the newest commit (and OPD's at #1977's head, where its recipe lives).

GPU-hours per verification on this stream, GRPO + OPD at the runbook's scale (8 GPUs; OPD 1.53 runs a full
verification, the confirmation's measured mean; the lane's and the references' costs as ``scripts.bench_lane``):
today (every verification in full), the path-aware skip alone, and skip + lane with ``--numerics`` of the
lane-eligible commits changing the bits (the lane parts at step 0, the full verification and a new reference follow;
which commits is drawn per SHA, so the figure is stable), the environment changing every 30 verifications.
Figures to read, no assertion.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rl_verify import settings
from rl_verify.core import lane
from rl_verify.engines import load_suite
from rl_verify.suites.rules import rules_of as suite_rules
from scripts.bench_lane import ENV_EVERY, MEAN_RUNS, lane_minutes

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "tests" / "data" / "xtuner" / "history.json"
SUITES = ("grpo", "opd")
#: The LMDeploy rollout's Python, under every path XTuner kept it at (before and after #1544).
LMDEPLOY_ROLLOUT = re.compile(r"^xtuner/v1/(ray|rl)/rollout/lmdeploy(/[^/]+)*[^/]*\.py$")
#: What GRPO's training and verdict read (issue 42's acceptance): a PASS (unchanged) must touch none of it.
GRPO_READS = re.compile(r"^(xtuner/|examples/v1/scripts/run_rl\.sh$|autotest/config/rl_qwen3_gsm8k_grpo\.py$|"
                        r"autotest/utils/(check_metric|metric_report)\.py$|requirements|pyproject\.toml$|setup\.cfg$|"
                        r"MANIFEST\.in$|patch/)")


def load(path: Path) -> dict[str, Any]:
    """The history data file, each commit with ``tree`` (its files) rebuilt from the newest tree, oldest first."""
    data = json.loads(path.read_text(encoding="utf-8"))
    tree = set(data["tree"])
    commits = []
    for commit in data["commits"]:  # newest first: this commit's tree, then undo its changes for its parent's
        changes = [c.split("\t", 1) for c in commit["changes"]]
        commits.append({**commit, "files": [p for _, p in changes], "tree": frozenset(tree)})
        for status, path in changes:
            if status == "A":
                tree.discard(path)
            elif status == "D":
                tree.add(path)
    data["commits"] = commits[::-1]
    return data


@functools.lru_cache(maxsize=None)
def rules_of(suite: str) -> lane.Rules:
    """The suite's rules exactly as the DAG and ``rl-verify shortcut`` take them (``suites.rules.rules_of``)."""
    return suite_rules(load_suite(suite))


def decide(suite: str, base: str, files: list[str], tree: frozenset[str]) -> lane.Judgement:
    """The verification of a commit whose diff from its verified PASS (and reference) ``base`` is ``files``."""
    return lane.judge(rules_of(suite), lane.Facts(verified_pass=base, changed_since_pass=files,
                                                  changed_since_reference=files, tree=tree,
                                                  reference="trusted", now=datetime.now(timezone.utc)))


def kind(judged: lane.Judgement) -> str:
    if judged.choice == "unchanged":
        return "unchanged"
    if judged.choice == "bitwise":
        return "lane-eligible"
    if judged.rule == "bitwise.disabled_by" or judged.stale_affects:
        return "lane off by rule"
    return "full"


def verifications(data: dict[str, Any], nightly: bool) -> list[dict[str, Any]]:
    """(head, base, files, tree) of each verification of the stream: each commit against its parent, or each
    night's tip against the previous night's (the union of the changed paths in between)."""
    commits = data["commits"]
    if not nightly:
        return [{"sha": c["sha"], "base": c["sha"] + "^", "files": c["files"], "tree": c["tree"], "commits": [c]}
                for c in commits]
    out: list[dict[str, Any]] = []
    day: list[dict[str, Any]] = []
    for c in commits:
        if day and _day(c) != _day(day[-1]):
            out.append(_night(day, out))
            day = []
        day.append(c)
    if day:
        out.append(_night(day, out))
    return out


def _day(commit: dict[str, Any]) -> str:
    return datetime.fromisoformat(commit["committed"]).astimezone(timezone.utc).date().isoformat()


def _night(day: list[dict[str, Any]], before: list[dict[str, Any]]) -> dict[str, Any]:
    files = list(dict.fromkeys(p for c in day for p in c["files"]))
    return {"sha": day[-1]["sha"], "base": before[-1]["sha"] if before else day[0]["sha"] + "^", "files": files,
            "tree": day[-1]["tree"], "commits": day}


def _changes_numerics(sha: str, share: float) -> bool:
    """Whether a lane-eligible commit changes the bits (a stable draw per SHA)."""
    return int(hashlib.sha256(sha.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def gpu_hours(stream: list[dict[str, Any]], judged: dict[str, list[lane.Judgement]],
              numerics: float) -> dict[str, float]:
    """Mean GPU-hours per verification (GRPO + OPD, 8 GPUs) on ``stream``: today, the path-aware skip, skip + lane."""
    gpus = settings.GPUS_PER_RUN
    today = skip = both = 0.0
    cost = {suite: (load_suite(suite).run_minutes * MEAN_RUNS[suite], 2 * lane_minutes(suite), lane_minutes(suite, 1),
                    lane_minutes(suite)) for suite in SUITES}
    for i, verification in enumerate(stream):
        new_env = i % ENV_EVERY == 0
        for suite in SUITES:
            full, reference, parted, identical = cost[suite]
            choice = judged[suite][i]
            today += full
            if choice.choice == "unchanged" and not new_env:
                continue
            skip += full
            if new_env or choice.choice == "full":  # full; its PASS makes the (new) reference
                both += full + reference
            elif _changes_numerics(verification["sha"], numerics):  # the lane parts at step 0
                both += parted + full + reference
            else:
                both += identical
    scale = gpus / 60 / max(1, len(stream))
    return {"today": today * scale, "skip": skip * scale, "skip+lane": both * scale}


def _shares(stream: list[dict[str, Any]], judged: dict[str, list[lane.Judgement]]) -> list[str]:
    lines = ["| suite | PASS (unchanged) | lane-eligible | lane off by rule | full (other) |", "|---|---|---|---|---|"]
    for suite in SUITES:
        counts = Counter(kind(j) for j in judged[suite])
        lines.append(f"| {suite} | " + " | ".join(
            f"{counts[k]} ({counts[k] / len(stream):.0%})"
            for k in ("unchanged", "lane-eligible", "lane off by rule", "full")) + " |")
    wrong = [v["sha"][:9] for v, j in zip(stream, judged["grpo"])
             if j.choice == "unchanged" and any(GRPO_READS.match(p) for p in v["files"])]
    lines += ["", f"GRPO PASS (unchanged) touching xtuner/, its launch script or config, the checker, requirements or "
              f"packaging: {len(wrong)}" + (f" ({', '.join(wrong)})" if wrong else "")]
    return lines


def _gpu_lines(stream: list[dict[str, Any]], judged: dict[str, list[lane.Judgement]], numerics: float) -> list[str]:
    lines = []
    for share in sorted({0.0, numerics, 0.7}):
        got = gpu_hours(stream, judged, share)
        lines.append(f"- {share:.0%} of lane-eligible commits changing the bits: today {got['today']:.2f}, path-aware "
                     f"skip {got['skip']:.2f} ({got['skip'] / got['today']:.2f} of today), skip + lane "
                     f"{got['skip+lane']:.2f} ({got['skip+lane'] / got['today']:.2f})")
    return lines


def _stale_tally(judged: list[lane.Judgement]) -> str:
    fired = Counter(p for j in judged for p in j.stale_affects + j.stale_lane)
    return "; ".join(f"'{p}' on {n}" for p, n in fired.most_common()) or "none"


def report(data: dict[str, Any], numerics: float) -> list[str]:
    source = data["source"]
    first, last = data["commits"][0], data["commits"][-1]
    newest = frozenset(last["tree"])
    lines = [f"XTuner {source['repository']} {source['ref']} at {source['head'][:9]}: {len(data['commits'])} "
             f"first-parent commits, committed {first['committed'][:10]} .. {last['committed'][:10]} "
             f"(read {source['read_at'][:10]}, {HISTORY.relative_to(ROOT)})", "",
             "# 1. Replay: each commit judged against its own tree (what the DAG decides at that commit)", ""]
    for nightly in (False, True):
        stream = verifications(data, nightly)
        judged = {s: [decide(s, v["base"], v["files"], v["tree"]) for v in stream] for s in SUITES}
        cadence = "nightly tip (UTC days)" if nightly else "every commit"
        lines += [f"## {cadence}: {len(stream)} verifications", ""] + _shares(stream, judged)
        lines += [f"Stale patterns (a shortcut off at the commits where the pattern matches no file): GRPO "
                  f"{_stale_tally(judged['grpo'])}; OPD {_stale_tally(judged['opd'])} (its recipe "
                  "`recipe/on_policy_distillation/` is on pull request #1977, not on main: the rule working).",
                  "GPU-hours per verification (GRPO + OPD):"] + _gpu_lines(stream, judged, numerics) + [""]
    per_commit = verifications(data, False)
    lmdeploy = [(v, decide("grpo", v["base"], v["files"], v["tree"])) for v in per_commit
                if any(LMDEPLOY_ROLLOUT.match(p) for p in v["files"])]
    eligible = [v for v, j in lmdeploy if j.choice != "full"]
    lines += [f"## Commits touching the LMDeploy rollout's Python: {len(lmdeploy)}, lane-eligible for GRPO: "
              f"{len(eligible)}", "", "| commit | PR | committed | LMDeploy file(s) | GRPO | rule | why |",
              "|---|---|---|---|---|---|---|"]
    for v, j in lmdeploy:
        (commit,) = v["commits"]
        touched = ", ".join(p for p in v["files"] if LMDEPLOY_ROLLOUT.match(p))
        lines.append(f"| {v['sha'][:9]} | #{commit['pr']} | {commit['committed'][:10]} | {touched} | {j.choice} | "
                     f"{j.rule} | {j.why[:100]} |")
    lines += ["", "# 2. Today's rules over the commit mix: each diff judged with every pattern checked at the newest "
              "commit (where all of GRPO's match), as after the specs follow XTuner's tree", "",
              "The figures for the GPU-hour tables: what the shortcuts answer from now on for a stream of diffs like "
              "these 400. (The 137 commits before #1544 touched paths XTuner has since moved, e.g. the LMDeploy "
              "rollout under xtuner/v1/ray/: section 1 judges those at their own tree.)", ""]
    for nightly in (False, True):
        stream = [{**v, "tree": newest} for v in verifications(data, nightly)]
        judged = {s: [decide(s, v["base"], v["files"], v["tree"]) for v in stream] for s in SUITES}
        judged["opd"] = [decide("opd", v["base"], v["files"], frozenset(
            data.get("trees", {}).get("refs/pull/1977/head", {}).get("files") or newest)) for v in stream]
        cadence = "nightly tip (UTC days)" if nightly else "every commit"
        lines += [f"## {cadence}: {len(stream)} verifications (OPD's patterns checked at #1977's head)", ""]
        lines += _shares(stream, judged) + ["GPU-hours per verification (GRPO + OPD):"]
        lines += _gpu_lines(stream, judged, numerics) + [""]
    lines += ["# 3. Patterns that match no file", ""]
    for suite in SUITES:
        affects, disabled_by = lane.stale_rules(rules_of(suite), sorted(newest))
        lines.append(f"- {suite} at main {source['head'][:9]}: affects {list(affects) or 'none'}, bitwise.disabled_by "
                     f"{list(disabled_by) or 'none'}")
    for name, tree in data.get("trees", {}).items():
        affects, disabled_by = lane.stale_rules(rules_of("opd"), tree["files"])
        lines.append(f"- opd at {name} {tree['sha'][:9]}: affects {list(affects) or 'none'}, bitwise.disabled_by "
                     f"{list(disabled_by) or 'none'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=Path, default=HISTORY)
    parser.add_argument("--numerics", type=float, default=0.3,
                        help="share of lane-eligible commits whose bits change (the GPU-hour figures)")
    args = parser.parse_args(argv)
    print("\n".join(report(load(args.history), args.numerics)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
