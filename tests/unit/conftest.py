"""Small hand-built trackers for the engine's unit tests (no fixture files on disk)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKER_DIR = REPO / "simulator" / "xtuner_checkout" / "autotest"
GOLDEN = REPO / "include" / "rl_verify" / "suites" / "data" / "opd_golden_2026-10-26.json"


def dump_rows(path: Path, rows: Iterable[dict | str], tail: str = "") -> Path:
    """One JSON object per line (strings are written verbatim), then ``tail`` (e.g. a partial line)."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
        handle.write(tail)
    return path


def grpo_rows(steps: int = 45, rewards: Callable[[int], float] = lambda i: 0.5 + 0.005 * i,
              length: Callable[[int], float] = lambda i: 300.0 + i, mismatch: Callable[[int], float] = lambda i: 1e-5,
              time_step: Callable[[int], float] = lambda i: 40.0, final_acc: float | None = 0.9007,
              eval_every: int = 15, minibatch_rows: bool = True) -> list[dict]:
    """A GRPO-shaped tracker: eval-only row at step 0, mini-batch rows, one summary row per step,
    eval/accuracy merged into the summary rows of eval steps (the last one = ``final_acc``)."""
    rows: list[dict] = [{"step": 0, "eval/accuracy": 0.7}]
    for i in range(1, steps + 1):
        if minibatch_rows:
            rows.append({"step": i, "train/loss": 0.1, "grad_norm": 1.0})
        row = {"time/step": time_step(i), "response/response_len/mean": length(i), "step": i,
               "mismatch/mismatch_k3_kl": mismatch(i), "response/rewards/mean": rewards(i), "extra/key": 1}
        if final_acc is not None and i % eval_every == 0:
            row["eval/accuracy"] = final_acc if i == steps else 0.8
        rows.append(row)
    return rows


def load_golden() -> dict:
    return json.loads(GOLDEN.read_text())


def opd_rows(steps: int = 25, separate_eval_rows: bool = True, change: Callable[[str, int, float], float] | None = None,
             drop: set[tuple[str, int]] = frozenset(), response_len: float = 300.0,
             time_step: float = 30.0) -> list[dict]:
    """An OPD-shaped tracker matching the golden table at every eval point (values between eval
    points interpolate nothing: they repeat the last golden value). ``change(metric, step, value)``
    rewrites a value; ``drop`` removes (metric, step) pairs."""
    golden = load_golden()["golden"]
    change = change or (lambda m, s, v: v)
    last: dict[str, float] = {}

    def val(metric: str, step: int) -> float:
        if metric in golden.get(str(step), {}):
            last[metric] = golden[str(step)][metric]
        return change(metric, step, last.get(metric, 0.3))

    rows: list[dict] = [{"step": 0, "eval/gsm8k/acc": val("eval/gsm8k/acc", 0),
                         "eval/geo3k/acc": val("eval/geo3k/acc", 0)}]
    for i in range(1, steps + 1):
        rows.append({"step": i, "train/mini_batch_loss": 0.2})
        row = {"step": i}
        for metric in ("distillation/reduced_distillation_kl", "distillation/reduced_distillation_abs_loss",
                       "response/rewards/mean"):
            row[metric] = val(metric, i)
        row["response/response_len/mean"] = change("response/response_len/mean", i, response_len)
        row["time/step"] = change("time/step", i, time_step)
        evals = {}
        if i % 5 == 0:
            evals = {m: val(m, i) for m in ("eval/gsm8k/acc", "eval/geo3k/acc")}
        if separate_eval_rows:
            rows.append(row)
            if evals:
                rows.append({"step": i, **evals})
        else:
            rows.append({**row, **evals})
    out = []
    for row in rows:
        out.append({k: v for k, v in row.items() if (k, row["step"]) not in drop})
    return out


@pytest.fixture
def checker_dir() -> Path:
    return CHECKER_DIR
