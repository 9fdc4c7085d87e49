"""What recording executed lines costs a training step on a real GPU (issue 44: executed-code evidence). Not part of
``make test`` (no GPU there).

    PYTHONPATH=include python -m scripts.gpu_coverage_cost [--steps 60] [--repeats 3] [--out FILE]

Measured on the device tool's NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, coverage 7.16.2, Python 3.12.3; the
reading is tests/data/gpu_coverage/h100.json): plain 3.54 ms/step, sysmon 3.83 (1.08x), ctrace 5.55 (1.57x), with
coverage.py's defaults. With the node's settings this script now records with (issue 53: ``concurrency =
multiprocessing,thread``, ``sigterm``, ``patch = subprocess``), on the device tool's NVIDIA H200 (same torch, coverage
and Python; tests/data/gpu_coverage/h200.json, 2026-12-07): plain 3.78 ms/step, sysmon 3.92 (1.04x), ctrace 4.77
(1.26x). Two cards, two days: the ratios, not the step times, are what to compare.

The training loop is ``scripts.gpu_lane_check.run`` (a small policy-gradient loop on the GPU: a 2-layer policy,
sampled actions, a reward, an Adam update, a tracker row per step). It runs in a child interpreter three ways:
plain; under coverage.py with its ``sysmon`` core (Python >= 3.12: ``sys.monitoring``, each line reported once);
and under its ``ctrace`` core (the C tracer, every line event), both measuring only the loop's own source
(``--source scripts``), as a node measures only the checkout's. Each way runs ``--repeats`` times after one warm-up
run of the kernels; the figure is the median time per training step, and the ratios to plain are printed side by
side. This loop is almost all Python dispatch around small kernels: an upper bound for a real step (XTuner's GRPO
step takes ~50 s of GPU work for a few ms of Python per line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(steps: int) -> None:
    """Time ``steps`` steps of the loop after a warm-up run; print seconds per step as JSON."""
    import torch

    from scripts.gpu_lane_check import run

    run(2)  # kernels, allocator, cuBLAS handles
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run(steps)
    torch.cuda.synchronize()
    print(json.dumps({"per_step_s": (time.perf_counter() - t0) / steps}))


def timed(way: str, steps: int) -> float:
    path = [str(ROOT / "include"), str(ROOT), os.environ.get("PYTHONPATH", "")]  # a carried site's too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    with tempfile.TemporaryDirectory(prefix="rl-verify-cov-") as tmp:
        if way == "plain":
            cmd = [sys.executable, "-m", "scripts.gpu_coverage_cost", "--child", str(steps)]
        else:
            env["COVERAGE_CORE"] = way
            # The node's recording settings (node/sh/evidence_setup.sh, issue 53): every process and thread,
            # one data file per process, saved on SIGTERM; multiprocessing is a config file's setting only.
            import coverage

            rc = Path(tmp) / "coverage.ini"
            rc.write_text("[run]\nparallel = True\nsigterm = True\nconcurrency = multiprocessing,thread\n"
                          + ("patch = subprocess\n" if coverage.version_info[:2] >= (7, 10) else ""))
            cmd = [sys.executable, "-m", "coverage", "run", "--rcfile", str(rc), "--source", str(ROOT / "scripts"),
                   "--data-file", str(Path(tmp) / ".coverage"), "-m", "scripts.gpu_coverage_cost", "--child",
                   str(steps)]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["per_step_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    import coverage
    import torch

    ways = ["plain", "sysmon", "ctrace"]
    times = {w: [] for w in ways}
    for _ in range(args.repeats):  # interleaved: a drift of the machine hits every way alike
        for way in ways:
            times[way].append(timed(way, args.steps))
    median = {w: statistics.median(v) for w, v in times.items()}
    reading = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "coverage": coverage.__version__,
               "python": sys.version.split()[0], "steps": args.steps, "repeats": args.repeats,
               "per_step_s": times, "median_per_step_s": median,
               "ratio_to_plain": {w: median[w] / median["plain"] for w in ways}}
    for way in ways:
        print(f"{way:7s} {median[way] * 1000:8.2f} ms/step  x{reading['ratio_to_plain'][way]:.3f}  "
              f"(runs: {', '.join(f'{t * 1000:.2f}' for t in times[way])})")
    if args.out:
        args.out.write_text(json.dumps(reading, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
