"""The bitwise lane's premise on a real GPU (issue 33): deterministic mode reproduces bit for bit, and what the lane
reads as "not the same bits" happens for the reasons it assumes. Not part of ``make test`` (no GPU there).

    PYTHONPATH=include python -m scripts.gpu_lane_check [--steps 6] [--out FILE]

A small policy-gradient loop (a 2-layer policy over a batch of prompts, sampled actions, a reward, an Adam update,
the eval at step 0) writes an XTuner-shaped tracker row per step: ``step``, ``eval/accuracy`` at step 0, then
``loss``, ``grad_norm``, ``response/rewards/mean`` (the summary-row marker), ``entropy`` and ``time/step``. Each
variant's rows go through the package's own lane (``core.bitwise.LaneFeed`` and ``read_lane`` with the shipped
GRPO lane's excludes), against run A:

* B: the same launch again, deterministic (``torch.use_deterministic_algorithms``, cuBLAS workspace config, a fixed
  seed): the self-check. Expected: identical.
* C: a code change that moves no number (the loss computed through a renamed helper). Expected: identical.
* D: a changed reduction (the loss accumulated in float64, as a fused kernel might): the same statistics, other
  bits.
  Expected: differs from the first step with a loss.
* E: a regression from step 3 (the reward scaled): bit-identical before it, the lane's blind spot. Expected:
  identical through step 2, differs at step 3.
* F, G: two launches without deterministic mode whose gradient goes through ``index_add_`` (atomic adds on the GPU):
  whether they agree is the GPU's business; printed, not expected.

Prints one line per check and writes the readings as JSON (``--out``). Exit 0 when every expected line holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rl_verify.core import bitwise
from rl_verify.suites.spec import LANE_EXCLUDE


def run(steps: int, *, deterministic: bool = True, variant: str = "base", seed: int = 0) -> list[dict]:
    import torch

    torch.use_deterministic_algorithms(deterministic, warn_only=False)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    dev = torch.device("cuda")
    prompts, hidden, actions, batch = 512, 1024, 64, 4096
    policy = torch.nn.Sequential(torch.nn.Linear(prompts, hidden), torch.nn.Tanh(),
                                 torch.nn.Linear(hidden, actions)).to(dev)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    generator = torch.Generator(device=dev).manual_seed(seed + 1)
    target = torch.randint(0, actions, (prompts,), device=dev, generator=generator)
    rows = []

    def loss_of(logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        if variant == "reordered":  # the same sum accumulated in float64: other bits, the same statistics
            return -((logp * adv).double().sum() / logp.shape[0]).float()
        if variant == "renamed":
            return _renamed_loss(logp, adv)
        return -(logp * adv).sum() / logp.shape[0]

    for step in range(steps + 1):
        t0 = time.perf_counter()
        x_idx = torch.randint(0, prompts, (batch,), device=dev, generator=generator)
        x = torch.nn.functional.one_hot(x_idx, prompts).float()
        if step == 0:
            with torch.no_grad():
                acc = (policy(x).argmax(-1) == target[x_idx]).float().mean().item()
            rows.append({"step": 0, "eval/accuracy": acc, "time/step": time.perf_counter() - t0})
            continue
        if variant == "atomics":  # a gather whose backward is index_add_: atomic adds, order not fixed
            emb = policy[0].weight.t()
            h = torch.zeros(batch, hidden, device=dev).index_add_(0, torch.arange(batch, device=dev),
                                                                  emb.index_select(0, x_idx))
            logits = policy[2](torch.tanh(h + policy[0].bias))
        else:
            logits = policy(x)
        dist = torch.distributions.Categorical(logits=logits)
        a = torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
        reward = (a == target[x_idx]).float()
        if variant == "regressed" and step >= 3:
            reward = reward * 0.9
        adv = reward - reward.mean()
        loss = loss_of(dist.log_prob(a), adv)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        rows.append({"step": step, "loss": loss.item(), "grad_norm": norm.item(),
                     "response/rewards/mean": reward.mean().item(), "entropy": dist.entropy().mean().item(),
                     "time/step": time.perf_counter() - t0})
    return rows


def _renamed_loss(logp, adv):  # the same expression behind another name: a refactor
    return -(logp * adv).sum() / logp.shape[0]


def lane(reference: list[dict], current: list[dict], steps: int) -> bitwise.LaneReading:
    ref, cur = bitwise.LaneFeed(LANE_EXCLUDE), bitwise.LaneFeed(LANE_EXCLUDE)
    ref.feed(b"".join(json.dumps(r).encode() + b"\n" for r in reference))
    cur.feed(b"".join(json.dumps(r).encode() + b"\n" for r in current))
    return bitwise.read_lane(ref.rows(), cur.rows(), steps + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS call
    import torch

    if not torch.cuda.is_available():
        print("FAIL setup: no CUDA device")
        return 2
    where = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    print(f"# {where}; {args.steps} steps after the eval at step 0; compared: every numeric field but "
          f"{', '.join(LANE_EXCLUDE)}")
    a = run(args.steps)
    variants = {"B same launch again (self-check)": (run(args.steps), "identical"),
                "C renamed helper (no numerics change)": (run(args.steps, variant="renamed"), "identical"),
                "D reordered reduction": (run(args.steps, variant="reordered"), "differs at 1"),
                "E regression from step 3": (run(args.steps, variant="regressed"), "differs at 3")}
    ok, readings = True, {"device": where, "steps": args.steps}
    for name, (rows, expected) in variants.items():
        got = lane(a, rows, args.steps)
        said = "identical" if got.identical else f"differs at {got.difference.step}"
        passed = said == expected
        ok &= passed
        print(f"{'PASS' if passed else 'FAIL'} {name}: {said}"
              + (f" ({got.difference.line()})" if got.difference else "") + f"; expected {expected}")
        readings[name] = {"said": said, "expected": expected,
                          "difference": bitwise.difference_dict(got.difference)}
    f, g = run(args.steps, deterministic=False, variant="atomics"), run(args.steps, deterministic=False,
                                                                          variant="atomics")
    got = lane(f, g, args.steps)
    said = "identical" if got.identical else f"differs at {got.difference.step} ({got.difference.line()})"
    print(f"INFO F/G two launches without deterministic mode, index_add_ in the backward: {said}")
    readings["F/G without deterministic mode"] = {"said": said}
    try:
        run(1, deterministic=True, variant="atomics")
        refused = "ran"
    except RuntimeError as err:
        refused = str(err).splitlines()[0][:200]
    print(f"INFO the same op under torch.use_deterministic_algorithms(True): {refused}")
    readings["atomics under deterministic mode"] = refused
    if args.out:
        args.out.write_text(json.dumps(readings, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
