#!/bin/bash
# SIMULATED XTuner GRPO launch script (rl-verify simulator) - same interface as XTuner's run_rl.sh:
#   run_rl.sh CONFIG BACKEND MODEL DATA [EVAL_DATA] [gpu|npu] [NODE_COUNT]
# Faithful traps: `set -ex` WITHOUT pipefail (training | tee => exit 0 even after a crash), and a
# leading `ray stop --force` that kills ANY Ray on the node, including another run's.
set -ex

ray stop --force

if [ "$#" -lt 4 ]; then
  echo "Usage: $0 CONFIG BACKEND MODEL DATA [EVAL_DATA] [gpu|npu] [NODE_COUNT]" >&2
  exit 1
fi
CONFIG_PATH=$1
INFER_BACKEND=$2
MODEL_PATH=$3
DATA_PATH=$4
EVAL_DATA_PATH=${5:-""}
ACCELERATOR=${6:-"gpu"}
NODE_COUNT=${7:-1}

case "$INFER_BACKEND" in
  lmdeploy|vllm|sglang) ;;
  *) echo "Unsupported inference backend: $INFER_BACKEND" >&2; exit 1 ;;
esac
if [ "$ACCELERATOR" != "gpu" ] && [ "$ACCELERATOR" != "npu" ]; then
  echo "Unsupported accelerator: $ACCELERATOR" >&2
  exit 1
fi

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
current_time=$(date "+%m%d%H")
model_name=$(basename "$MODEL_PATH")
data_name=$(basename "$DATA_PATH" | cut -d. -f1)
WORK_DIR=${WORK_DIR:-"$REPO_DIR/work_dirs/${model_name}_${data_name}_${INFER_BACKEND}"}
mkdir -p "$WORK_DIR"
export WORK_DIR
export LMDEPLOY_LOG_FILE="$WORK_DIR/lmdeploy_log_${current_time}.txt"
echo "[lmdeploy-sim] SIMULATED $INFER_BACKEND backend for $MODEL_PATH" >> "$LMDEPLOY_LOG_FILE"

GPUS_PER_NODE=8
ray start --head --num-gpus=$GPUS_PER_NODE --temp-dir="$WORK_DIR/ray_${current_time}" --disable-usage-stats

# wait until Ray sees every GPU of the node
for _ in $(seq 1 60); do
  if ray status 2>/dev/null | grep -q "/${GPUS_PER_NODE}.0 GPU"; then
    break
  fi
  sleep 1
done

PYTHON=${PYTHON:-python3}
"$PYTHON" "$REPO_DIR/xtuner_sim/train.py" --rlsim-train grpo \
  --config "$CONFIG_PATH" --model "$MODEL_PATH" --data "$DATA_PATH" --eval-data "$EVAL_DATA_PATH" \
  --work-dir "$WORK_DIR" --lmdeploy-log "$LMDEPLOY_LOG_FILE" --batch-hint 64 \
  2>&1 | tee "$WORK_DIR/training_log_${current_time}.txt"
