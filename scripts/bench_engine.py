"""Benchmark of the verification engine (reading + OPD comparison), printed side by side.

    python scripts/bench_engine.py [--steps 1000 10000] [--minibatch-rows 2]

For each tracker size it builds an OPD-shaped tracker (eval-only row at step 0, N step-summary
rows with ~30 keys, an eval row every 5 steps, mini-batch rows with ~30 keys) in a temp folder and
reports: CPU seconds (time.process_time) of read_tracker and of compare_opd without and with the
plot, peak Python memory of reading (tracemalloc, measured in a separate pass because tracing slows
the code down) for the 7 OPD metrics and for 1 metric, and the ratios against the smallest size
and against the file size. No assertion: these are figures to read.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from rl_verify.engines.opd import compare_opd
from rl_verify.suites.spec import data_file
from rl_verify.engines import load_suite
from rl_verify.core.tracker import read_tracker

GOLDEN_FILE = data_file(load_suite("opd").data)  # the OPD suite spec's golden table
OPD_METRICS = list(json.loads(GOLDEN_FILE.read_text())["thresholds"])


def build_tracker(path: Path, steps: int, minibatch_rows: int, seed: int = 0) -> Path:
    """Write an OPD-shaped tracker with ``steps`` step-summary rows (streamed, not built in memory)."""
    rnd = random.Random(seed)
    golden = json.loads(GOLDEN_FILE.read_text())["golden"]
    noise = {f"misc/metric_{k}": 0.0 for k in range(20)}
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"step": 0, **golden["0"]}) + "\n")
        for i in range(1, steps + 1):
            for _ in range(minibatch_rows):
                out.write(json.dumps({"step": i, "train/loss": rnd.random(), "train/grad_norm": rnd.random(),
                                      **{k: rnd.random() for k in noise}, "lr": 1e-6}) + "\n")
            ref = golden.get(str(i), golden["25"])
            row = {"step": i, **{k: rnd.random() for k in noise},
                   "distillation/reduced_distillation_kl": ref["distillation/reduced_distillation_kl"],
                   "distillation/reduced_distillation_abs_loss": ref["distillation/reduced_distillation_abs_loss"],
                   "response/rewards/mean": ref["response/rewards/mean"],
                   "response/response_len/mean": 300.0 + rnd.random(), "time/step": 30.0 + rnd.random()}
            out.write(json.dumps(row) + "\n")
            if i % 5 == 0:
                out.write(json.dumps({"step": i, "eval/gsm8k/acc": ref["eval/gsm8k/acc"],
                                      "eval/geo3k/acc": ref["eval/geo3k/acc"]}) + "\n")
    return path


def cpu(fn) -> tuple[float, object]:
    start = time.process_time()
    value = fn()
    return time.process_time() - start, value


def peak(fn) -> int:
    tracemalloc.start()
    fn()
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top


def measure(folder: Path, steps: int, minibatch_rows: int) -> dict[str, float]:
    path = build_tracker(folder / f"tracker_{steps}.jsonl", steps, minibatch_rows)
    out = folder / f"out_{steps}"
    read_s, tracker = cpu(lambda: read_tracker(path, OPD_METRICS))
    opd_s, result = cpu(lambda: compare_opd(path, out, plot=False))
    opd_plot_s, _ = cpu(lambda: compare_opd(path, out, plot=True))
    return {
        "steps": steps,
        "lines": tracker.lines,
        "file_mb": path.stat().st_size / 1e6,
        "read_cpu_s": read_s,
        "opd_cpu_s": opd_s,
        "opd_plot_cpu_s": opd_plot_s,
        "peak_mb_7": peak(lambda: read_tracker(path, OPD_METRICS)) / 1e6,
        "peak_mb_1": peak(lambda: read_tracker(path, ["response/rewards/mean"])) / 1e6,
        "verdict": result.verdict,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--minibatch-rows", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        compare_opd(build_tracker(Path(tmp) / "warm.jsonl", 25, 0), Path(tmp) / "warm", plot=True)  # imports
        rows = [measure(Path(tmp), n, args.minibatch_rows) for n in sorted(args.steps)]
    first = rows[0]
    head = (f"{'steps':>7} {'lines':>7} {'file MB':>8} {'read CPU s':>10} {'OPD CPU s':>9} {'+plot CPU s':>11} "
            f"{'peak MB 7m':>10} {'peak MB 1m':>10} {'peak/file':>9} {'x CPU':>6} {'x mem':>6} {'x file':>6} verdict")
    print(f"python {sys.version.split()[0]}; OPD metrics kept: {len(OPD_METRICS)}; "
          f"{args.minibatch_rows} mini-batch rows per step; CPU = time.process_time, peak = tracemalloc")
    print(head)
    for r in rows:
        print(f"{r['steps']:>7} {r['lines']:>7} {r['file_mb']:>8.2f} {r['read_cpu_s']:>10.3f} {r['opd_cpu_s']:>9.3f} "
              f"{r['opd_plot_cpu_s']:>11.3f} {r['peak_mb_7']:>10.2f} {r['peak_mb_1']:>10.2f} "
              f"{r['peak_mb_7'] / r['file_mb']:>9.3f} {r['opd_cpu_s'] / first['opd_cpu_s']:>6.1f} "
              f"{r['peak_mb_7'] / first['peak_mb_7']:>6.1f} {r['file_mb'] / first['file_mb']:>6.1f} {r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
