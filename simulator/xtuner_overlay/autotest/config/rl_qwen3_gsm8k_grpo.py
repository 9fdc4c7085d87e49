"""SIMULATED placeholder of XTuner's GRPO autotest config (rl-verify simulator): read by xtuner/rlsim/train.py.

GRPO, Qwen3-8B, gsm8k: 3 epochs over 1000 prompts, global batch 64 -> 45 RL steps; eval every 15 steps.
"""
total_epochs = 3
global_batch_size = 64
evaluate_step = 15
algorithm = "grpo"
