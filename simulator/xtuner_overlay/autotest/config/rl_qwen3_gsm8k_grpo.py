"""SIMULATED placeholder of XTuner's GRPO autotest config (rl-verify simulator): run by xtuner/rlsim/train.py as
XTuner's CLI runs a config (the module executed; its ``trainer`` is what the trainer is built from).

GRPO, Qwen3-8B, gsm8k: 3 epochs over 1000 prompts, global batch 64 -> 45 RL steps; eval every 15 steps. As in
XTuner's config, the step count is fixed here (``rollout_steps``) and passed to the trainer's config object.
"""
from types import SimpleNamespace

total_epochs = 3
global_batch_size = 64
evaluate_step = 15
algorithm = "grpo"
rollout_steps = total_epochs * (1000 // global_batch_size)

# XTuner: trainer = RLColocateTrainerConfig(..., rollout_steps=rollout_steps, global_batch_size=..., evaluate_step=...)
trainer = SimpleNamespace(rollout_steps=rollout_steps, global_batch_size=global_batch_size, evaluate_step=evaluate_step)
