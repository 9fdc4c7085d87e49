#!/bin/bash
# SIMULATED XTuner GRPO launch script (rl-verify simulator) - same interface as XTuner's run_rl.sh:
#   run_rl.sh CONFIG BACKEND MODEL DATA [EVAL_DATA] [gpu|npu] [NODE_COUNT]
# Written from xtuner-contract.md, with the real script's traps (each stops or blocks a run on a node
# that is not ready):
# - `set -ex` WITHOUT pipefail (training | tee -a => exit 0 even after a crash);
# - a leading `ray stop --force` that kills ANY Ray on the node, including another run's or user's;
# - `ulimit -n 65536` under `set -e`: a hard open-files limit below it ends the script (exit 1);
# - fixed Ray ports and the shared /tmp/ray_log, removed and re-linked to $WORK_DIR/ray_<mmddHH>/;
# - an endless wait (`while true`, 2 s sleeps, no timeout) until Ray reports exactly 8.0 GPU;
# - `python`, not `python3`.
# Simulated nodes share one machine: the node's "fixed" ports (the real 6379/8265) and its /tmp come
# from $RLSIM_NODE/etc/rlsim-node.env, never the machine's real /tmp.
set -ex

ray stop --force
ulimit -n 65536

# shellcheck source=/dev/null
. "${RLSIM_NODE:?run_rl.sh (SIMULATED) runs only on a simulated node}/etc/rlsim-node.env"
RAY_PORT=$RLSIM_RAY_PORT
RAY_DASHBOARD_PORT=$RLSIM_RAY_DASHBOARD_PORT
RAY_LOG_DIR=$RLSIM_TMP/ray_log

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

# Ray head on the node's fixed ports, its temp dir the node-wide /tmp/ray_log -> this run's folder
RAY_RUN_DIR="$WORK_DIR/ray_${current_time}"
mkdir -p "$RAY_RUN_DIR"
rm -rf "$RAY_LOG_DIR"
ln -s "$RAY_RUN_DIR" "$RAY_LOG_DIR"
ray start --head --port="$RAY_PORT" --dashboard-port="$RAY_DASHBOARD_PORT" --dashboard-host=0.0.0.0 \
  --temp-dir="$RAY_LOG_DIR/" --disable-usage-stats

# wait until Ray sees every GPU: 8 per node, or the count of CUDA_VISIBLE_DEVICES; no timeout
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  EXPECTED_GPUS=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
  EXPECTED_GPUS=$((NODE_COUNT * 8))
fi
while true; do
  current=$(ray status 2>/dev/null | grep GPU | head -n 1 | sed -E 's#.*/([0-9.]+) GPU.*#\1#')
  if [ "$current" = "${EXPECTED_GPUS}.0" ]; then
    break
  fi
  count=${current%%.*}
  echo "Waiting for GPU count to be ${EXPECTED_GPUS}, current: ${count:-0}"
  sleep 2
done

cp "$0" "$WORK_DIR/run_rl.sh"
cp "$CONFIG_PATH" "$WORK_DIR/config.py"

python "$REPO_DIR/xtuner/v1/train/cli/rl.py" --rlsim-train grpo \
  --config "$CONFIG_PATH" --model "$MODEL_PATH" --data "$DATA_PATH" --eval-data "$EVAL_DATA_PATH" \
  --work-dir "$WORK_DIR" --lmdeploy-log "$LMDEPLOY_LOG_FILE" --batch-hint 64 \
  2>&1 | tee -a "$WORK_DIR/training_log_${current_time}.txt"
