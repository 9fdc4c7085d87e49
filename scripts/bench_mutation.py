"""A mutation benchmark as the measure of the shortcuts' soundness (issue 53, item 8): how often PASS (unchanged) and
PASS (bitwise) are said of a commit whose numbers did move.

    python -m scripts.bench_mutation [--limit N] [--files PATH ...] [--suites grpo,opd] [--per-group 66]
                                     [--jobs 2] [--seed 0] [--out FILE]

1. **Mutants** (``scripts/mutants.py``): seeded text edits of every Python file of the simulated checkout a training
   imports or reads (the trainer, its curves and code paths, the entry point, the rollout worker and its backends,
   the teacher server, both suites' configs; a model family no suite trains as a control): constants, operators
   (first and continuation lines), ``else`` -> ``elif``, statements deleted and inserted (module, class, function
   level, functions rebound), decorators, default values, new files imported at run time; those that do not parse
   are counted and dropped.
2. **Ground truth**: each mutant is committed on a branch of the simulated checkout's git repo (``bench/mNNNNN``)
   and trained for real, both suites, in both launches the suite uses: the lane's deterministic launch (the spec's
   ``bitwise.env``) and the full run's, with a fixed ``RLSIM_SEED`` (so that the full run's noise is the same bits
   too), all the suite's steps (GRPO 45, OPD 25), no simulated step time (``scripts/evidence_rig.py``: the node's
   ``/usr/bin/python3``, the rollout worker in its own process, OPD's teachers from the checkout when the mutant can
   reach them). Every tracker row is compared bit for bit with the unmutated base's in the same launch: the first
   step whose rows differ, or never (a crash or a hang: the first step it did not write). "Lane steps": the lane's
   own comparison (``core.bitwise.read_lane`` over its k steps, its excluded fields) sees a difference; "later":
   bits changed, but not in the lane's steps of the deterministic launch.
3. **Decision**: the diff base..mutant read by the package's node script ``sh/changed_lines.sh`` (bash, this
   machine) and ``core.evidence.read_changes``, judged against the base's executed-code evidence recorded for real
   (``evidence_setup.sh`` / ``evidence_read.sh``: the full run, and the lane's steps with the spec's
   ``evidence.stop_env`` or ``stop_config``) by ``core.evidence.read_diff`` and ``core.lane.judge`` (:func:`decide`):
   unchanged, bitwise or full, the base being both the verified PASS and the trusted reference. The same question is
   asked of the DAG's own functions and of ``rl-verify shortcut --evidence`` (``scripts/decision_paths.py``); the
   three answers are compared on every mutant.
4. **Table** per operator and suite: mutants, bits changed (lane steps / later / never), decisions, false PASS
   (unchanged) (bits changed in either launch, decision unchanged), false PASS (bitwise) (bits changed only after the
   lane's steps or only in the full launch, decision bitwise: the named blind spot), each false PASS listed with its
   file:line and edit. Figures to read, no assertion.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_verify.core import bitwise, evidence, lane
from rl_verify.engines import load_suite
from rl_verify.node import evidence_scripts
from rl_verify.suites.rules import rules_of
from scripts import decision_paths
from scripts import evidence_rig as rig
from scripts.mutants import Mutant, generate
from simulator.checkout import build_checkout

SUITES = ("grpo", "opd")
MODES = ("lane", "full")
#: The full launch's fixed seed (the lane's deterministic launch derives its own from it).
SEED = "1"
#: What a training imports or reads (the configs are read by train.py as data), and a control no suite imports.
FILES = ("xtuner/v1/train/cli/rl.py", "xtuner/rlsim/train.py", "xtuner/rlsim/curves.py", "xtuner/rlsim/train_loop.py",
         "xtuner/rlsim/teacher_server.py", "xtuner/v1/rl/rollout/worker.py", "xtuner/v1/rl/rollout/lmdeploy.py",
         "xtuner/v1/rl/rollout/sglang.py", rig.CONFIG["grpo"], rig.CONFIG["opd"], "xtuner/v1/model/moe/deepseek_v3.py")
#: What a change must touch to reach OPD's teachers: their script, or a new file in its folder (sys.path[0] of the
#: script: it can shadow a module the server imports; the server imports nothing else of the checkout). Other
#: mutants' OPD launches are served by the base's teachers (started once; the trainer asks only their /health).
TEACHER_SCRIPT = rig.TEACHER_SERVER
TEACHER_FOLDER = str(Path(rig.TEACHER_SERVER).parent) + "/"
CHOICES = ("unchanged", "bitwise", "full")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


# ----------------------------------------------------------------------------------------------------------------
# The decision: the package's own reading of the diff and its one decision path.
def decide(spec: Any, base: str, changes_output: str, tree: Sequence[str], found: evidence.Evidence) -> tuple[str, str]:
    """``core.lane.judge``'s choice (and its rule) for a commit whose diff from ``base`` (the suite's verified PASS
    and its trusted reference's commit) ``sh/changed_lines.sh`` printed as ``changes_output``; ``tree``: the commit's
    files; ``found``: the base's executed-code evidence."""
    changes = evidence.read_changes(changes_output)
    reading = evidence.read_diff(found, changes)
    paths = sorted(changes)
    judged = lane.judge(rules_of(spec), lane.Facts(
        requested="auto", verified_pass=base, changed_since_pass=paths, changed_since_reference=paths,
        tree=list(tree), reference="trusted", reference_sha=base, evidence=reading))
    return judged.choice, judged.rule


def make_evidence(spec: Any, full: Mapping[str, Any], lane_read: Mapping[str, Any]) -> evidence.Evidence:
    """The base's evidence from its two readings, as the DAG keeps it (``orchestration.bitwise_lane.evidence_of``:
    the readings' problems, completeness, the lane's evidence run stopped within the lane's steps)."""
    problems = [f"full run: {p}" for p in full.get("problems") or []]
    problems += [f"lane's steps: {p}" for p in lane_read.get("problems") or []]
    problems += evidence.completeness({"full run": full, "lane's steps": lane_read},
                                      [(p.kind, p.runs) for p in spec.evidence.processes])
    last, k = lane_read.get("last_step"), spec.bitwise.steps
    if last is None or last > k - 1:
        problems.append(f"the lane's evidence run wrote step {last if last is not None else '(none read)'} before it "
                        f"ended, past the lane's steps 0..{k - 1}")
    data = {"full": full.get("files") or {}, "lane": lane_read.get("files") or {}, "hashes": full.get("hashes") or {},
            "compiled": full.get("compiled") or (), "problems": list(dict.fromkeys(problems)),
            "blocks": full.get("blocks") or {}, "unparsed": full.get("unparsed") or ()}
    return evidence.Evidence.from_dict(data)


# ----------------------------------------------------------------------------------------------------------------
# Ground truth: a launch's tracker rows against the base's, bit for bit.
def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return ("f", value.hex() if value == value else repr(value))
    return (type(value).__name__, value) if isinstance(value, (int, bool, str, type(None))) else ("x", repr(value))


def rows_by_step(tracker: bytes) -> dict[int, tuple]:
    """Each step's rows in file order, every field as its exact bits (a partial last line is not a row)."""
    out: dict[int, list] = {}
    for raw in tracker.split(b"\n")[:-1]:
        try:
            row = json.loads(raw)
        except ValueError:
            out.setdefault(-1, []).append(raw)  # an unreadable line: a difference wherever it is
            continue
        step = row.get("step") if isinstance(row, dict) else None
        key = step if isinstance(step, int) and not isinstance(step, bool) else -1
        out.setdefault(key, []).append(tuple(sorted((k, _canonical(v)) for k, v in row.items()))
                                       if isinstance(row, dict) else repr(row))
    return {k: tuple(v) for k, v in out.items()}


def first_difference(base: Mapping[int, tuple], current: Mapping[int, tuple]) -> int | None:
    """The first step whose rows differ (a step missing on one side included), None when every step is the same."""
    for step in sorted(set(base) | set(current)):
        if base.get(step) != current.get(step):
            return max(step, 0)
    return None


def lane_rows(tracker: bytes, exclude: Sequence[str]) -> list[dict[str, Any]]:
    feed = bitwise.LaneFeed(exclude)
    feed.feed(tracker)
    return feed.rows()


# ----------------------------------------------------------------------------------------------------------------
# The pool's workers: one worktree each, the base's rows and evidence from the parent.
_W: dict[str, Any] = {}


def _init(state: dict[str, Any]) -> None:
    logging.getLogger("rl_verify").setLevel(logging.WARNING)  # the DAG functions' per-decision lines: thousands
    _W.update(state)
    wt = Path(state["tmp"]) / f"wt-{os.getpid()}"
    _git(Path(state["repo"]), "worktree", "add", "-q", "--detach", str(wt), state["base"])
    _W["wt"] = wt
    # The DAG's own decision functions, over this worker's record store holding the base as each suite's verified
    # PASS and trusted reference with its evidence; the CLI's evidence files beside it.
    records = Path(state["tmp"]) / f"records-{os.getpid()}"
    records.mkdir(parents=True, exist_ok=True)
    _W["offline"] = decision_paths.dag_offline(Path(state["repo"]), records)
    _W["offline"].__enter__()  # for the worker's life (held: a collected generator would undo the patches)
    _W["evidence_files"] = {}
    for suite in state["suites"]:
        recorded = state["evidence"][suite].to_dict()
        decision_paths.keep_base(suite, state["base"], recorded)
        _W["evidence_files"][suite] = decision_paths.write_evidence(records, suite, state["base"], recorded)


def _commit(wt: Path, m: Mutant, base: str) -> str:
    _git(wt, "checkout", "-q", "-B", f"bench/{m.key}", base)
    for path, text in m.files:
        target = wt / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    _git(wt, "add", "-A")
    _git(wt, "commit", "-q", "--no-verify", "-m", f"mutant {m.key}: {m.op} {m.path}:{m.line}: {m.text}")
    return _git(wt, "rev-parse", "HEAD")


def truth_of(launched: rig.Launched, spec: Any, mode: str) -> dict[str, Any]:
    """One launch against the base's: the first differing step (None: never), and in the lane's launch whether the
    lane's own comparison over its k steps sees it."""
    base = _W["base_rows"][(spec.name, mode)]
    rows = rows_by_step(launched.tracker)
    first = first_difference(base["steps"], rows)
    out: dict[str, Any] = {"first": first, "exit": launched.returncode, "seconds": round(launched.seconds, 2)}
    if launched.returncode != 0:
        out["error"] = (launched.stderr.strip().splitlines() or ["(no output)"])[-1][-200:]
    if mode == "lane":
        reading = bitwise.read_lane(base["lane"], lane_rows(launched.tracker, spec.bitwise.exclude),
                                    spec.bitwise.steps, spec.bitwise.exclude)
        out["lane_sees"] = not reading.identical
    if first is not None:
        same_compared = lane_rows(launched.tracker, spec.bitwise.exclude) == base["lane"]
        out["only_excluded"] = same_compared and sorted(rows) == sorted(base["steps"])
    return out


def evaluate(m: Mutant) -> dict[str, Any]:
    repo, base, wt = Path(_W["repo"]), _W["base"], _W["wt"]
    t0 = time.perf_counter()
    sha = _commit(wt, m, base)
    result: dict[str, Any] = {"key": m.key, "op": m.op, "path": m.path, "line": m.line, "text": m.text,
                              "pool": m.pool, "sha": sha, "suites": {}}
    changes = rig.bash(evidence_scripts.changed_lines_script(str(repo), base, sha))
    tree = _git(repo, "ls-tree", "-r", "--name-only", sha).splitlines()
    reach = any(p == TEACHER_SCRIPT or (p.startswith(TEACHER_FOLDER) and "/" not in p[len(TEACHER_FOLDER):]
                                        and not (Path(_W["base_wt"]) / p).exists()) for p, _ in m.files)
    work = Path(_W["tmp"]) / "runs" / m.key
    for suite in _W["suites"]:
        spec = load_suite(suite)
        entry: dict[str, Any] = {}
        for mode in MODES:
            launched = rig.launch(wt, work / f"{suite}-{mode}", _W["env"][(suite, mode)], suite,
                                  endpoints=None if reach else _W["endpoints"], timeout=_W["timeout"])
            entry[mode] = truth_of(launched, spec, mode)
        try:
            entry["choice"], entry["rule"] = decide(spec, base, changes, tree, _W["evidence"][suite])
        except Exception as err:  # noqa: BLE001 (a decision that cannot be made is reported, never guessed)
            entry["choice"], entry["rule"] = "error", f"{type(err).__name__}: {err}"
        # The same question asked of the DAG's functions and of `rl-verify shortcut --evidence`: they must agree.
        for who, ask in (("dag", lambda: decision_paths.dag_choice(repo, suite, base, sha)),
                         ("cli", lambda: decision_paths.cli_choice(repo, suite, base, sha,
                                                                   _W["evidence_files"][suite]))):
            try:
                entry[who] = ask()
            except Exception as err:  # noqa: BLE001
                entry[who] = f"error: {type(err).__name__}: {err}"
        entry["bits"] = ("lane steps" if entry["lane"].get("lane_sees") else
                         "later" if entry["lane"]["first"] is not None or entry["full"]["first"] is not None
                         else "never")
        result["suites"][suite] = entry
    shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


# ----------------------------------------------------------------------------------------------------------------
# The table.
COLUMNS = ("mutants", "lane steps", "later", "never", "unchanged", "bitwise", "full", "false PASS (unchanged)",
           "false PASS (bitwise)", "full, never changed")


def counts(results: Sequence[Mapping[str, Any]], suite: str) -> dict[str, int]:
    c: Counter[str] = Counter()
    for r in results:
        e = r["suites"][suite]
        c["mutants"] += 1
        c[e["bits"]] += 1
        c[e["choice"]] += 1
        changed = e["bits"] != "never"
        c["false PASS (unchanged)"] += changed and e["choice"] == "unchanged"
        c["false PASS (bitwise)"] += e["bits"] == "later" and e["choice"] == "bitwise"
        c["full, never changed"] += not changed and e["choice"] == "full"
    return dict(c)


def false_passes(results: Sequence[Mapping[str, Any]], suite: str) -> list[dict[str, Any]]:
    out = []
    for r in results:
        e = r["suites"][suite]
        kind = ("unchanged" if e["bits"] != "never" and e["choice"] == "unchanged" else
                "bitwise" if e["bits"] == "later" and e["choice"] == "bitwise" else None)
        if kind:
            notes = [n for n, on in (("full launch never changed", e["full"]["first"] is None),
                                      ("lane launch never changed", e["lane"]["first"] is None),
                                      ("only fields the lane excludes", e["lane"].get("only_excluded") or
                                       e["full"].get("only_excluded"))) if on]
            # Bits moved only in what a PASS (bitwise) says it does not compare (time/*, throughput, memory).
            timing_only = all(e[mode]["first"] is None or e[mode].get("only_excluded") for mode in MODES)
            out.append({"kind": kind, "key": r["key"], "op": r["op"], "where": f"{r['path']}:{r['line']}",
                        "text": r["text"], "lane_first": e["lane"]["first"], "full_first": e["full"]["first"],
                        "rule": e["rule"], "notes": notes, "pool": r["pool"], "timing_only": timing_only})
    return out


def table(results: Sequence[Mapping[str, Any]], suite: str, discarded: Mapping[str, int]) -> tuple[list[str], dict]:
    ops = sorted({r["op"] for r in results})
    data = {op: counts([r for r in results if r["op"] == op], suite) for op in ops}
    pool = [r for r in results if r["pool"]]
    if pool:
        data["(in a Pool worker)"] = counts(pool, suite)
    data["total"] = counts(results, suite)
    lines = ["| operator | " + " | ".join(COLUMNS) + " | discarded |", "|---" * (len(COLUMNS) + 2) + "|"]
    for op, c in data.items():
        lines.append(f"| {op} | " + " | ".join(str(c.get(col, 0)) for col in COLUMNS) +
                     f" | {discarded.get(op, 0) if op != 'total' else sum(discarded.values())} |")
    return lines, data


# ----------------------------------------------------------------------------------------------------------------
def _base(repo_wt: Path, tmp: Path, env: Mapping[tuple[str, str], dict[str, str]], suites: Sequence[str],
          endpoints: Mapping[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The base's rows in each launch, run twice (the ground truth is only as good as the base reproduces)."""
    out = {}
    for suite in suites:
        spec = load_suite(suite)
        for mode in MODES:
            runs = [rig.launch(repo_wt, tmp / f"base-{suite}-{mode}-{i}", env[(suite, mode)], suite,
                               endpoints=endpoints) for i in range(2)]
            rows = [rows_by_step(r.tracker) for r in runs]
            if any(r.returncode != 0 for r in runs) or rows[0] != rows[1] or not rows[0]:
                raise SystemExit(f"bench_mutation: the base's {suite} {mode} launch does not reproduce (exit "
                                 f"{[r.returncode for r in runs]}): {runs[0].stderr[-500:]}")
            out[(suite, mode)] = {"steps": rows[0], "lane": lane_rows(runs[0].tracker, spec.bitwise.exclude),
                                  "seconds": min(r.seconds for r in runs), "last": max(rows[0])}
    return out


def _evidence(repo_wt: Path, tmp: Path, env: Mapping[tuple[str, str], dict[str, str]],
              suite: str) -> tuple[evidence.Evidence, dict[str, Any]]:
    """The base's executed-code evidence, recorded for real: the full launch, and the lane's launch stopped after the
    lane's steps by the spec's ``evidence.stop_env`` or ``stop_config`` (``${LANE_LAST_STEP}`` = k - 1; the config
    written by ``sh/evidence_config.sh``), each under the node scripts, OPD's teachers included."""
    spec = load_suite(suite)
    k = spec.bitwise.steps
    stop = {key: v.replace("${LANE_LAST_STEP}", str(k - 1)) for key, v in spec.evidence.stop_env.items()}
    kinds = [(p.kind, p.runs) for p in spec.evidence.processes]
    full, _ = rig.record(repo_wt, tmp / f"evidence-{suite}-full", env[(suite, "full")], suite, spec.tracker, kinds)
    by_config = getattr(spec.evidence, "stop_config", None)
    lane_args = spec.bitwise.args or spec.launch.args  # the config file is the launch argument stop_config.arg
    stop_config = None if by_config is None else (lane_args[by_config.arg], by_config.attribute,
                                                  by_config.resolved(k))
    lane_read, _ = rig.record(repo_wt, tmp / f"evidence-{suite}-lane", {**env[(suite, "lane")], **stop}, suite,
                              spec.tracker, kinds, stop_config=stop_config)
    found = make_evidence(spec, full, lane_read)
    summary = {"processes": [full.get("processes"), lane_read.get("processes")],
               "files": [len(full.get("files") or {}), len(lane_read.get("files") or {})],
               "last_step": [full.get("last_step"), lane_read.get("last_step")], "problems": list(found.problems)}
    return found, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="a seeded sample of N mutants (quick runs)")
    parser.add_argument("--files", nargs="+", default=None, help="checkout-relative files to mutate")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--per-group", type=int, default=66, help="mutants sampled per (operator, file)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=8.0, help="seconds a launch may take (a hang: stopped)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write every mutant's result as JSON (also every 100 mutants, marked partial)")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of a JSON --out wrote; run nothing")
    args = parser.parse_args(argv)
    # Stopped (SIGTERM): unwind, so that the teachers (own sessions) are stopped and the temporary folder removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    suites = [s for s in args.suites.split(",") if s]
    if any(s not in SUITES for s in suites):
        parser.error(f"--suites: one of {', '.join(SUITES)}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rl-verify-bench-mutation-") as folder:
        tmp = Path(folder)
        build_checkout(tmp / "node")
        repo = tmp / "node" / "xtuner"
        _git(repo, "config", "gc.auto", "0")
        base = _git(repo, "rev-parse", "main")
        base_wt = tmp / "base"
        _git(repo, "worktree", "add", "-q", "--detach", str(base_wt), base)
        files = args.files or [f for f in FILES if (base_wt / f).exists()]
        missing = [f for f in files if not (base_wt / f).is_file()]
        if missing:
            parser.error(f"--files: not in the simulated checkout: {', '.join(missing)}")
        # The shadowing new files belong to no named file: with --files, none.
        mutants, discarded, candidates = generate(base_wt, files, args.seed, args.per_group, args.limit,
                                                  shadows=not args.files)
        env = {(suite, mode): rig.node_env(RLSIM_SEED=SEED, **rig.suite_env(load_suite(suite), mode == "lane"))
               for suite in suites for mode in MODES}
        found: dict[str, evidence.Evidence] = {}
        summaries = {}
        for suite in suites:
            found[suite], summaries[suite] = _evidence(base_wt, tmp, env, suite)
        with rig.teachers(base_wt, tmp / "base-teachers", rig.node_env()) as endpoints:
            if endpoints is None:
                raise SystemExit("bench_mutation: the base's teachers did not come up")
            base_rows = _base(base_wt, tmp, env, suites, endpoints)
            state = {"repo": str(repo), "base": base, "base_wt": str(base_wt), "tmp": str(tmp), "suites": suites,
                     "env": env, "endpoints": endpoints, "base_rows": base_rows, "evidence": found,
                     "timeout": args.timeout}
            results: list[dict[str, Any]] = []
            data = {"mutants": len(mutants), "files": files, "discarded": discarded, "candidates": candidates,
                    "seed": args.seed, "per_group": args.per_group, "jobs": args.jobs, "timeout": args.timeout,
                    "setup_s": round(time.monotonic() - t0, 1),
                    "suites": {suite: {"evidence": summaries[suite], "k": load_suite(suite).bitwise.steps,
                                       "base": {m: {"seconds": round(base_rows[(suite, m)]["seconds"], 2),
                                                    "last": base_rows[(suite, m)]["last"]} for m in MODES}}
                               for suite in suites},
                    "results": results}
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(args.jobs, initializer=_init, initargs=(state,)) as pool:
                for i, r in enumerate(pool.imap_unordered(evaluate, mutants, chunksize=1), 1):
                    results.append(r)
                    if i % 100 == 0:
                        print(f"  {i}/{len(mutants)} mutants, {time.monotonic() - t0:.0f} s", file=sys.stderr,
                              flush=True)
                        if args.out:  # a partial table, should the run be stopped (--report prints it)
                            _write(args.out, {**data, "partial": True, "wall_s": round(time.monotonic() - t0, 1)})
    results.sort(key=lambda r: r["key"])
    data.update(partial=False, wall_s=round(time.monotonic() - t0, 1))
    for suite, info in data["suites"].items():
        info["table"] = table(results, suite, discarded)[1]
        info["false_pass"] = false_passes(results, suite)
    report(data)
    if args.out:
        _write(args.out, data)
    return 0


def _write(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def report(data: Mapping[str, Any]) -> None:
    """The tables (per operator, per suite), the false PASS and what made ground truth doubtful, from a run's data
    (what ``--out`` writes; ``--report`` reads it back)."""
    results = sorted(data["results"], key=lambda r: r["key"])
    discarded = data["discarded"]
    ops = Counter(r["op"] for r in results)
    done = f" (PARTIAL: {len(results)} of {data['mutants']} mutants done)" if data.get("partial") else ""
    print(f"## Mutation benchmark (issue 53){done}: {len(results)} mutants of {len(data['files'])} files, "
          f"{len(data['suites'])} suites x {len(MODES)} launches each, {data['jobs']} processes; "
          f"{sum(discarded.values())} sampled edits did not parse (dropped, replaced); "
          f"{sum(data['candidates'].values())} candidates ({data['per_group']} at most sampled per operator and file)"
          "\n")
    per = (data["wall_s"] - data["setup_s"]) / max(len(results), 1)
    print(f"wall time {data['wall_s']:.0f} s (setup: checkout, mutants, evidence, base runs {data['setup_s']:.0f} s; "
          f"{per:.2f} s a mutant)")
    for suite, info in data["suites"].items():
        s, b = info["evidence"], info["base"]
        print(f"\n### {suite} (k = {info['k']}; base: lane launch {b['lane']['seconds']:.2f} s, full "
              f"{b['full']['seconds']:.2f} s, {b['full']['last']} steps)\n")
        print(f"evidence: processes full/lane {s['processes']}, files {s['files']}, last step {s['last_step']}; "
              + ("complete" if not s["problems"] else "NOT USED: " + "; ".join(s["problems"])))
        lines, _ = table(results, suite, discarded)
        print("\n".join(lines))
        fp = false_passes(results, suite)
        errors = [r for r in results if r["suites"][suite]["choice"] == "error"]
        only = sum(1 for r in results for mode in MODES if r["suites"][suite][mode].get("only_excluded"))
        hangs = sum(1 for r in results for mode in MODES if r["suites"][suite][mode]["exit"] is None)
        late_exit = sum(1 for r in results for mode in MODES if r["suites"][suite][mode]["exit"] not in (0, None)
                        and r["suites"][suite][mode]["first"] is None)
        print(f"\nlaunches stopped at the time limit ({data['timeout']:g} s): {hangs}; launches that failed after "
              f"writing every row as the base (counted never): {late_exit}; launches whose only difference is in "
              f"fields the lane excludes (time/*, ...): {only}")
        if errors:
            print(f"decisions that failed: {len(errors)} (first: {errors[0]['suites'][suite]['rule']})")
        apart = [r for r in results if len({r["suites"][suite]["choice"], r["suites"][suite].get("dag"),
                                            r["suites"][suite].get("cli")}) != 1]
        print(f"\nthe decision taken three ways (core.lane.judge as above, the DAG's unchanged_on_node + "
              f"bitwise_lane.decide, `rl-verify shortcut --evidence`): {len(results) - len(apart)} of {len(results)} "
              f"mutants alike" + "".join(f"\n- APART {r['key']} {r['path']}:{r['line']}: judge "
                                        f"{r['suites'][suite]['choice']}, DAG {r['suites'][suite].get('dag')}, CLI "
                                        f"{r['suites'][suite].get('cli')}" for r in apart[:20]))
        kinds = Counter("unchanged" if f["kind"] == "unchanged" else "timing" if f.get("timing_only") else "late"
                        for f in fp)
        print(f"\nfalse PASS ({suite}): {len(fp)} of {len(results)} mutants: PASS (unchanged) {kinds['unchanged']}; "
              f"PASS (bitwise) {kinds['late']} in the named blind spot (bits that move only after the lane's steps) "
              f"and {kinds['timing']} whose only change is in the fields a PASS (bitwise) says it never compares "
              "(time/*, throughput, memory)")
        for f in fp:
            print(f"- PASS ({f['kind']}) {f['where']} [{f['op']}{', Pool worker' if f['pool'] else ''}, {f['key']}; "
                  f"first differing step: lane launch {f['lane_first']}, full {f['full_first']}"
                  + "".join(f"; {n}" for n in f["notes"]) + f"] {f['text']}")
    print(f"\nmutants per operator: {dict(sorted(ops.items()))}")


if __name__ == "__main__":
    raise SystemExit(main())
