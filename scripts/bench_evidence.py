"""Executed-code evidence, measured (issue 44): the lane's late-step blind spot with and without evidence, the share of
neutral and unused-code commits answered without a full training, false PASS over seeded histories, and the cost of
recording on a step.

    python -m scripts.bench_evidence [--histories 400] [--commits 30] [--seed 0]

1. **Evidence, recorded for real**: the simulated checkout is built (``simulator.checkout``) and OPD's replay trainer
   runs twice on this machine with the node's interpreter (``/usr/bin/python3``, coverage.py from Debian), its
   rollout worker in a process of its own: the full run (25 steps, the LMDeploy backend) and the lane's evidence run
   (the deterministic SGLang launch, ``TOTAL_TRAIN_STEPS`` = k - 1), each under the package's own node scripts
   (``evidence_setup.sh``, ``evidence_read.sh``, run with bash). The teachers' ``/health`` is a local stand-in.
2. **Regressions that live in code**: every regression kind of the simulator with its onset at steps 0, 1, 2, 3, 5,
   10, 20, written as an edit of the line of ``xtuner/rlsim/train_loop.py`` that first runs at that step (eval_hook,
   every_step, warmup_end, replay_buffer, entropy_decay, lr_schedule, kl_schedule). The lane's bits are the
   simulator's deterministic rows (``curves.run_rows``, the same seed healthy and regressed, through
   ``core.bitwise.read_lane``); the lane's verdict is ``core.lane.judge``'s (the DAG's decision) without evidence (the
   path rules) and with it (``core.evidence.read_diff``). The remaining blind spot: the same regressions written in a
   line that runs every step (``every_step``: ``if step >= onset: ...``), which the lane's steps run.
3. **Seeded histories**: commits drawn from code edits of the simulated checkout (neutral edits of each code path,
   edits of code no process runs, regressions in each code path, docs), each verified against the reference by
   ``core.lane.judge`` with and without the evidence: the share answered PASS (unchanged) or PASS (bitwise), and
   false PASS (a regression so answered).
4. **Cost**: the full run timed with and without recording (no simulated step time: the trainer's own Python),
   beside the real-GPU reading ``tests/data/gpu_coverage/h200.json`` (``scripts/gpu_coverage_cost.py``, with the
   node's recording settings).
Figures to read, no assertion.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rl_verify.core import bitwise, evidence, lane
from rl_verify.engines import load_suite
from rl_verify.node import evidence_scripts
from scripts.evidence_rig import Healthy
from simulator.checkout import build_checkout
from simulator.common import load_curves

ROOT = Path(__file__).resolve().parents[1]
NODE_PYTHON = "/usr/bin/python3"
LOOP = "xtuner/rlsim/train_loop.py"
#: The code path of train_loop.py that first runs at each onset step.
FIRST_RUNS = {0: "eval_hook", 1: "every_step", 2: "warmup_end", 3: "replay_buffer", 5: "entropy_decay",
              10: "lr_schedule", 20: "kl_schedule"}
UNUSED = "xtuner/v1/model/moe/deepseek_v3.py"
LMDEPLOY = "xtuner/v1/rl/rollout/lmdeploy.py"
SUITE = "opd"


def _run(repo: Path, work: Path, env: dict[str, str], steps: int) -> float:
    """One OPD launch of the replay trainer in ``repo``; its wall seconds."""
    model, data = work / "model", work / "data.json"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    data.write_text(json.dumps([{"prompt": str(i)} for i in range(64)]))
    cfg = repo / "recipe/on_policy_distillation/config/rl_qwen3_vl_2b_sampled_token_mopd_rollout_teacher.py"
    t0 = time.perf_counter()
    subprocess.run([NODE_PYTHON, str(repo / "xtuner/v1/train/cli/rl.py"), "--rlsim-train", "opd", "--config", str(cfg),
                    "--model", str(model), "--data", str(data), "--work-dir", str(work / "work")],
                   cwd=repo, env={**env, "TOTAL_TRAIN_STEPS": str(steps)}, check=True, capture_output=True)
    return time.perf_counter() - t0


def _bash(script: str) -> str:
    return subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True).stdout


def record(repo: Path, tmp: Path, env: dict[str, str], steps: int, name: str) -> tuple[dict[str, Any], float]:
    """One launch under the node scripts' recording: its reading (evidence_read.sh's JSON) and wall seconds."""
    folder = tmp / name
    kv = dict(line.split("=", 1) for line in _bash(evidence_scripts.evidence_setup_script(str(folder / "evidence"),
                                                                                str(repo))).splitlines() if "=" in line)
    seconds = _run(repo, folder, {**env, "PYTHONPATH": kv["SITE"], "COVERAGE_PROCESS_START": kv["CONFIG"],
                                  "COVERAGE_CORE": "sysmon"}, steps)
    script = evidence_scripts.evidence_read_script(str(folder / "evidence"), str(repo), "python3",
                                                   evidence.COMPILED_BODY.pattern, str(folder / "work"),
                                                   load_suite(SUITE).tracker,
                                                   [(p.kind, p.runs) for p in load_suite(SUITE).evidence.processes])
    # The node's python3 first on the PATH, as on the simulated node.
    reading = json.loads(_bash(f"PATH={Path(NODE_PYTHON).parent}:$PATH\n" + script).strip().splitlines()[-1])
    return reading, seconds


def body_lines(repo: Path) -> dict[str, int]:
    """Each train_loop.py function's first body line (past its docstring): what an edit of it touches."""
    out = {}
    for node in ast.parse((repo / LOOP).read_text()).body:
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
            out[node.name] = body[0].lineno
    return out


def one_line_edit(found: evidence.Evidence | None, path: str, line: int) -> dict[str, evidence.Change]:
    """A one-line edit of ``path`` at ``line`` since the reference, as ``core.evidence.read_changes`` gives it."""
    blob = None if found is None else found.hashes.get(path)
    return {path: evidence.Change(path, "M", base_blob=blob, hunks=((line, 1),), head_parses=True)}


def lane_choice(found: evidence.Evidence | None, path: str, line: int) -> str:
    """``core.lane.judge``'s verdict on a one-line edit since the reference: bitwise, full (or unchanged)."""
    spec = load_suite(SUITE)
    reading = None if found is None else evidence.read_diff(found, one_line_edit(found, path, line))
    rules = lane.Rules(spec.affects, spec.unaffecting, spec.bitwise.disabled_by)
    return lane.judge(rules, lane.Facts(changed_since_reference=[path], stale={}, reference="trusted",
                                        evidence=reading)).choice


def unchanged(found: evidence.Evidence | None, path: str, line: int) -> bool:
    """Whether the edit is PASS (unchanged) by the evidence (no process of the full run ran its block)."""
    if found is None or found.problems:
        return False
    return path in evidence.read_diff(found, one_line_edit(found, path, line)).judged()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--histories", type=int, default=400)
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spec = load_suite(SUITE)
    k = spec.bitwise.steps
    with tempfile.TemporaryDirectory(prefix="rl-verify-bench-evidence-") as folder:
        tmp = Path(folder)
        build_checkout(tmp / "node")
        repo = tmp / "repo"
        shutil.copytree(tmp / "node" / "xtuner", repo, ignore=shutil.ignore_patterns(".git"))
        server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        base = {k2: v for k2, v in os.environ.items() if not k2.startswith(("COVERAGE", "PYTHON"))}
        base.update({"RLSIM_STEP_SECONDS": "0", "EVALUATE_STEP": "5", "RLSIM_SEED": "1",
                     "XTUNER_OPD_TEACHER_ENDPOINTS_JSON": json.dumps({"gsm8k": url, "geo3k": url})})
        lane_env = {**base, **spec.bitwise.env}
        full_read, with_cov = record(repo, tmp, base, spec.expected_steps, "full")
        lane_read, _ = record(repo, tmp, lane_env, k - 1, "lane")
        plain = min(_run(repo, tmp / f"plain{i}", base, spec.expected_steps) for i in range(3))
        covered = min([with_cov] + [record(repo, tmp, base, spec.expected_steps, f"again{i}")[1] for i in range(2)])
        server.shutdown()
        found = evidence.Evidence(full_read["files"], lane_read["files"], full_read["hashes"],
                                  tuple(full_read["compiled"]),
                                  tuple(evidence.completeness({"full run": full_read, "lane's steps": lane_read},
                                                              # its teachers are this process's HTTP server
                                                              [(p.kind, p.runs) for p in spec.evidence.processes
                                                               if p.kind != "teacher"])))
        lines_of = body_lines(repo)
    print(f"## 1. Evidence recorded ({SUITE}, node interpreter {NODE_PYTHON}, coverage {full_read.get('coverage')})\n")
    print(f"full run: {full_read['processes']} processes, {len(full_read['files'])} files, last step "
          f"{full_read['last_step']}; lane's evidence run: {lane_read['processes']} processes, "
          f"{len(lane_read['files'])} files, last step {lane_read['last_step']}; complete: {not found.problems}"
          + (f" ({'; '.join(found.problems)})" if found.problems else ""))
    print("| code path | first runs at | body line | full run ran it | lane's steps ran it |")
    print("|---|---|---|---|---|")
    for onset, name in FIRST_RUNS.items():
        n = lines_of[name]
        print(f"| {name} | {onset} | {LOOP}:{n} | {n in found.full.get(LOOP, ())} | {n in found.lane.get(LOOP, ())} |")
    print(f"| rollout backend | every step (full) | {LMDEPLOY} | {bool(found.full.get(LMDEPLOY))} | "
          f"{bool(found.lane.get(LMDEPLOY))} |")
    print(f"| model family no suite trains | never | {UNUSED} | {bool(found.full.get(UNUSED))} | "
          f"{bool(found.lane.get(UNUSED))} |")

    curves = load_curves()
    seed = "deterministic:v1:bench:0"
    rows_of = {}

    def lane_rows(kind: str | None, onset: int) -> list[dict]:
        if (kind, onset) not in rows_of:
            rows = curves.run_rows(SUITE, seed, kind, "realistic", steps=spec.expected_steps, eval_every=5,
                                   regression_from=onset)
            feed = bitwise.LaneFeed(spec.bitwise.exclude)
            feed.feed(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
            rows_of[(kind, onset)] = feed.rows()
        return rows_of[(kind, onset)]

    def identical(kind: str | None, onset: int) -> bool:
        return bitwise.read_lane(lane_rows(None, 0), lane_rows(kind, onset), k).identical

    kinds = [kd for kd in curves.REGRESSIONS if kd in ("init", "divergence", "teacher", "rewards")]
    print(f"\n## 2. Regressions that live in code ({SUITE}; kinds {', '.join(kinds)}; onsets {list(FIRST_RUNS)})\n")
    print("| written in | passes the lane without evidence | with evidence |")
    print("|---|---|---|")
    for label, where in (("the code path that first runs at the onset", lambda o: lines_of[FIRST_RUNS[o]]),
                         ("a line that runs every step (every_step), effect from the onset",
                          lambda o: lines_of["every_step"])):
        without = with_ev = total = 0
        for kind in kinds:
            for onset in FIRST_RUNS:
                total += 1
                same = identical(kind, onset)
                without += same and lane_choice(None, LOOP, where(onset)) == "bitwise"
                with_ev += same and lane_choice(found, LOOP, where(onset)) == "bitwise"
        print(f"| {label} | {without} of {total} | {with_ev} of {total} |")
    print("\nThe second row is the remaining blind spot: a changed value in a line that runs every step but matters "
          "only later; line evidence cannot see it (the full-every policy bounds it, as before).")

    rng = random.Random(args.seed)
    neutral_paths = [lines_of[n] for n in FIRST_RUNS.values()]
    counts = {"with": {}, "without": {}}
    for _ in range(args.histories):
        for _ in range(args.commits):
            u = rng.random()
            if u < 0.4:
                what, line, onset, bad = "neutral", rng.choice(neutral_paths), None, False
            elif u < 0.6:
                what, line, onset, bad = "unused", None, None, False
            elif u < 0.9:
                onset = rng.choice(list(FIRST_RUNS))
                what, line, bad = "regression", lines_of[FIRST_RUNS[onset]], True
            else:
                what, line, onset, bad = "docs", None, None, False
            for arm, ev in (("with", found), ("without", None)):
                if what == "docs":
                    answer = "unchanged"
                elif what == "unused":
                    answer = "unchanged" if unchanged(ev, UNUSED, 8) else \
                        ("bitwise" if lane_choice(ev, UNUSED, 8) == "bitwise" else "full")
                else:
                    answer = "unchanged" if unchanged(ev, LOOP, line) else lane_choice(ev, LOOP, line)
                    if answer == "bitwise" and bad and not identical(rng.choice(kinds), onset):
                        answer = "full"  # the lane's bits differ: the full check decides
                key = (what, answer + (" FALSE PASS" if bad and answer in ("unchanged", "bitwise") else ""))
                counts[arm][key] = counts[arm].get(key, 0) + 1
    print(f"\n## 3. Seeded histories ({args.histories} x {args.commits} commits: 40% neutral edits of a code path, 20% "
          "edits of code no process runs, 30% regressions in a code path, 10% docs)\n")
    print("| commit | answer | without evidence | with evidence |")
    print("|---|---|---|---|")
    for key in sorted(set(counts["with"]) | set(counts["without"])):
        print(f"| {key[0]} | {key[1]} | {counts['without'].get(key, 0)} | {counts['with'].get(key, 0)} |")
    for arm in ("without", "with"):
        regressions = sum(v for (what, _), v in counts[arm].items() if what == "regression")
        false = sum(v for (_, answer), v in counts[arm].items() if "FALSE PASS" in answer)
        print(f"false PASS {arm} evidence: {false} of {regressions} regressions")

    gpu = json.loads((ROOT / "tests/data/gpu_coverage/h200.json").read_text())
    print("\n## 4. Cost of recording\n")
    print(f"simulator ({SUITE}, {spec.expected_steps} steps, no simulated step time, {NODE_PYTHON}): plain "
          f"{plain:.2f} s, recorded {covered:.2f} s: x{covered / plain:.2f} (process start-up included)")
    ratio = gpu["ratio_to_plain"]
    print(f"real GPU ({gpu['gpu']}, torch {gpu['torch']}, coverage {gpu['coverage']}, Python {gpu['python']}; "
          f"a {gpu['median_per_step_s']['plain'] * 1000:.2f} ms step): sysmon x{ratio['sysmon']:.3f}, ctrace "
          f"x{ratio['ctrace']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
