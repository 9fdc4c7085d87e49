"""`make gallery`: what the report says for every simulated regression, through the real DAG.

Starts one rig (simulated node + local Airflow, short steps), runs each regression branch of the
simulated checkout (and the healthy tip) with both suites, and prints per suite the report's
headline, failure class and first suggested next step, then the same as a Markdown table (also
written to .state/report-gallery.md). Faults are covered by tests/e2e/test_faults.py, whose table
(.state/fault-table.md) carries the same three columns.

The node's seed and the run ids are fixed (a repeat's seed derives from its run's id), so every run and
repeat trains the same curves from one gallery to the next. With early abort on (the default, what a person
sees) how far a stopped run got depends on timing (the live check polls while the 0.1 s steps run): its
partial curves differ from one gallery to the next, though the step its FAIL became certain at does not.
``--no-early-abort`` trains every run to its end (the report says where it would have stopped): then two
galleries' reports are the same byte for byte except paths and times, which is how a change that must not
alter reports is checked (``python -m scripts.report_gallery --no-early-abort``, before and after; records in
.state/gallery/records).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scripts._startup import fresh_rig
from simulator import node as sim


ROOT = Path(__file__).resolve().parents[1]


STATE = ROOT / ".state" / "gallery"
OUT = ROOT / ".state" / "report-gallery.md"
SEED = "gallery"
COMMITS = ["main"] + [branch for branch, _, _ in sim.REGRESSION_BRANCHES.values()]


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-early-abort", dest="early_abort", action="store_false",
                        help="train every run to its end: reports comparable across galleries byte for byte")
    args = parser.parse_args(argv)
    rows = []
    with fresh_rig(STATE, STATE / "records", step_seconds=0.1) as rig:
        # A fixed node-wide seed: every regression trains the same curves from one gallery to the next.
        sim_json = Path(rig.node["root"]) / "sim.json"
        sim_json.write_text(json.dumps({**json.loads(sim_json.read_text()), "seed": SEED}))
        for commit in COMMITS:
            # A fixed run id per commit: a repeat's seed derives from it, so repeats train the same curves too.
            out = rig.run({"commit": commit, "suites": ["grpo", "opd"], "node": "rl_gpu_node",
                           "early_abort": args.early_abort}, timeout=900, run_id=f"gallery__{commit.replace('/', '_')}")
            if not out.summary:
                rows.append((commit, "-", f"no report ({out.state})", "-", "-"))
                continue
            report = json.loads(Path(out.summary["report"]["json"]).read_text())
            md = Path(out.summary["report"]["md"]).read_text().splitlines()
            headline = next((line.replace("**", "") for line in md if line.startswith("**")), "?")
            for suite in report["suites"]:
                first = (suite["next_steps"] or ["-"])[0]
                rows.append((commit, suite["suite"], headline, suite["failure_class"] or "-", first))
                print(f"{commit} [{suite['suite']}] {headline}\n  class: {suite['failure_class']}\n  next: {first}\n",
                      flush=True)
    table = ("| commit | suite | report headline | class | first suggested next step |\n|---|---|---|---|---|\n"
             + "".join("| " + " | ".join(_cell(str(c)) for c in row) + " |\n" for row in rows))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("# Report gallery (scripts/report_gallery.py)\n\n" + table)
    print(table + f"\n(also in {OUT})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
