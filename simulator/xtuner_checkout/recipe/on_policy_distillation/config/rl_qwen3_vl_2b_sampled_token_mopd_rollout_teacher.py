"""SIMULATED placeholder of XTuner's MOPD config (rl-verify simulator): read by xtuner/rlsim/train.py only.

Multi-teacher on-policy distillation, Qwen3-VL-2B student, rollout teachers (gsm8k, geo3k), k1 loss.
The environment (TOTAL_TRAIN_STEPS, EVALUATE_STEP, TRAIN_BATCH_SIZE, ...) overrides these defaults.
"""
total_train_steps = 25
evaluate_step = 5
train_batch_size = 128
loss_mode = "k1"
teachers = ["gsm8k", "geo3k"]
