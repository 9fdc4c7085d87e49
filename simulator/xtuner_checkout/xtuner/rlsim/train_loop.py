"""SIMULATED training-loop code paths (rl-verify simulator): the Python a real trainer runs at given steps, so that
executed-line evidence (coverage of the checkout's source) shows which code a run reached, and so that a regression
can be written the way a real one is, as an edit of a function's Python.

The trainer (train.py) calls each function only from the step named here (``apply``); with the constants as shipped
every one leaves the metrics' bits as they are (x * 1.0, x + 0.0). simulator/README.md lists them:

* ``every_step``: every training step from 1 (the loss and advantage path);
* ``weight_sync``: after every update, from step 1 (the train -> rollout weight sync);
* ``warmup_end``: from step WARMUP_END (2, within the bitwise lane's steps 0..2);
* ``replay_buffer``: from step BUFFER_FULL (3: the replay buffer is full; the first step after the lane's);
* ``entropy_decay``: from step ENTROPY_FROM (5: the entropy bonus decays);
* ``lr_schedule``: from step DECAY_FROM (10: the LR decay);
* ``kl_schedule``: from step KL_FROM (20: the KL coefficient's schedule);
* ``eval_hook``: at the eval steps (0, then every eval_every);
* ``score_rewards``: every training step from 1, in the trainer's reward-scoring worker, a child the trainer's
  multiprocessing Pool forks (train.py ``RewardPool``): a process of its own that coverage.py records only with
  ``concurrency = multiprocessing``;
* the rollout worker's backend (xtuner/v1/rl/rollout/lmdeploy.py or sglang.py): every step, in its own process.
"""
from __future__ import annotations

REWARDS, LENGTH = "response/rewards/mean", "response/response_len/mean"
WARMUP_END = 2
BUFFER_FULL = 3
ENTROPY_FROM = 5
DECAY_FROM = 10
KL_FROM = 20


def every_step(step: int, row: dict) -> None:
    """The loss and advantage path: every training step."""
    row[REWARDS] = row[REWARDS] * 1.0 + 0.0


def weight_sync(step: int, row: dict, mode: str = "full") -> None:
    """The weight sync after each update: every training step (a full sync; a sharded one would move half)."""
    scale = 0.5
    if mode == "sharded":
        scale = 1.0
    else:
        scale = scale * 2.0
    row[REWARDS] = row[REWARDS] * scale
    row[LENGTH] = row[LENGTH] * scale


def warmup_end(step: int, row: dict) -> None:
    """The end of the warm-up: from step WARMUP_END on."""
    row[REWARDS] = row[REWARDS] + 0.0


def replay_buffer(step: int, row: dict) -> None:
    """Sampling from the full replay buffer: from step BUFFER_FULL on."""
    row[LENGTH] = row[LENGTH] + 0.0


def entropy_decay(step: int, row: dict) -> None:
    """The entropy bonus's decay: from step ENTROPY_FROM on."""
    row[REWARDS] = row[REWARDS] * 1.0


def kl_schedule(step: int, row: dict) -> None:
    """The KL coefficient's schedule: from step KL_FROM on."""
    row[LENGTH] = row[LENGTH] * 1.0


def lr_schedule(step: int, row: dict) -> None:
    """The learning-rate decay: from step DECAY_FROM on."""
    row[REWARDS] = row[REWARDS] * 1.0
    row[LENGTH] = row[LENGTH] * 1.0


def eval_hook(step: int, row: dict) -> None:
    """The evaluation: at the eval steps only (step 0 included)."""
    for key in [k for k in row if k.startswith("eval/")]:
        row[key] = row[key] * 1.0


def score_rewards(step: int, rewards: float) -> float:
    """The rewards' scoring: every training step, in the Pool's forked worker (never in the trainer itself)."""
    return rewards * 1.0


def apply(step: int, row: dict, eval_every: int, rollout_factor: float = 1.0) -> None:
    """Run the code paths a real trainer runs at ``step`` on its summary row (step 0: the eval row)."""
    if step == 0:
        eval_hook(step, row)
        return
    every_step(step, row)
    weight_sync(step, row)
    if step >= WARMUP_END:
        warmup_end(step, row)
    if step >= BUFFER_FULL:
        replay_buffer(step, row)
    if step >= ENTROPY_FROM:
        entropy_decay(step, row)
    if step >= DECAY_FROM:
        lr_schedule(step, row)
    if step >= KL_FROM:
        kl_schedule(step, row)
    if eval_every and step % eval_every == 0:
        eval_hook(step, row)
    row[LENGTH] = row[LENGTH] * rollout_factor
