#!/usr/bin/env bash
# The node scripts against real GPUs: on a machine with NVIDIA GPUs, nvidia-smi and PyTorch (CUDA), runs the
# package's rendered node scripts (readiness, job submit/state, cleanup) against real CUDA processes and prints
# one line per check (scripts/gpu_node_check.py says which). Not part of `make test` (no GPU there).
# Needs only the package's pure modules and pydantic (no Airflow, no SSH): PYTHONPATH=include.
# Usage: scripts/gpu_node_check.sh [--capture DIR] [--job-gib G] [--foreign-gib G] [--leftover-gib G]
#   --capture DIR  also write the raw nvidia-smi outputs of each stage (tests/data/nvidia_smi/ holds the H200's)
# Exit status: 0 every check passed, 1 a check failed, 2 the machine cannot run the checks.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "FAIL setup: nvidia-smi not found: run this on a machine with NVIDIA GPUs"
  exit 2
fi
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "FAIL setup: $py has no PyTorch with CUDA (set PYTHON to one that has)"
  exit 2
fi
export PYTHONPATH="include${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m scripts.gpu_node_check "$@"
