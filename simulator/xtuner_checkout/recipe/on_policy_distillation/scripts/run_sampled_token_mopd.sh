#!/bin/bash
# SIMULATED XTuner MOPD launch script (rl-verify simulator) - same interface as XTuner's:
#   run_sampled_token_mopd.sh STUDENT_MODEL_PATH DATA_PATH     (+ the environment of the runbook)
# It splits the node's GPUs (teachers first, students get the rest via STUDENT_CUDA_VISIBLE_DEVICES),
# starts two rollout-teacher HTTP servers and Ray, runs training, and stops teachers + Ray in an EXIT
# trap. Faithful trap: an EXIT trap does not run on SIGKILL, so teachers and Ray then stay behind
# (they run in their own sessions, so killing this script's process group does not reach them).
set -ex

if [ "$#" -lt 2 ]; then
  echo "Usage: $0 STUDENT_MODEL_PATH DATA_PATH" >&2
  exit 1
fi
STUDENT_MODEL_PATH=$1
DATA_PATH=$2
: "${GSM8K_TEACHER_MODEL_PATH:?GSM8K_TEACHER_MODEL_PATH must be set}"
: "${GEO3K_TEACHER_MODEL_PATH:?GEO3K_TEACHER_MODEL_PATH must be set}"
: "${EVAL_DATA_PATH:?EVAL_DATA_PATH must be set}"
OPD_CONFIG_PATH=${OPD_CONFIG_PATH:-recipe/on_policy_distillation/config/rl_qwen3_vl_2b_sampled_token_mopd_rollout_teacher.py}
for p in "$STUDENT_MODEL_PATH" "$DATA_PATH" "$EVAL_DATA_PATH" "$OPD_CONFIG_PATH"; do
  if [ ! -e "$p" ]; then
    echo "Path does not exist: $p" >&2
    exit 1
  fi
done
export TOTAL_TRAIN_STEPS=${TOTAL_TRAIN_STEPS:-50}
export EVALUATE_STEP=${EVALUATE_STEP:-5}
export TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128}
XTUNER_RL_NUM_WORKERS=${XTUNER_RL_NUM_WORKERS:-6}
MOPD_TEACHER_NUM_REPLICAS=${MOPD_TEACHER_NUM_REPLICAS:-1}
MOPD_TEACHER_REPLICA_NUM_WORKERS=${MOPD_TEACHER_REPLICA_NUM_WORKERS:-1}

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
current_time=$(date "+%m%d%H")
WORK_DIR=${WORK_DIR:-"$REPO_DIR/work_dirs/mopd_$(basename "$STUDENT_MODEL_PATH")"}
mkdir -p "$WORK_DIR"
export WORK_DIR
PYTHON=${PYTHON:-python3}

# --- GPU split: teachers first, the student gets the rest -----------------------------------------
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  echo "WARNING: ignoring CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; this script partitions the GPUs itself" >&2
  unset CUDA_VISIBLE_DEVICES
fi
NUM_GPUS=$(nvidia-smi -L | wc -l)
TEACHER_GPUS_EACH=$((MOPD_TEACHER_NUM_REPLICAS * MOPD_TEACHER_REPLICA_NUM_WORKERS))
TEACHER_GPUS=$((2 * TEACHER_GPUS_EACH))
if [ $((TEACHER_GPUS + XTUNER_RL_NUM_WORKERS)) -gt "$NUM_GPUS" ]; then
  echo "Need $TEACHER_GPUS teacher GPUs + $XTUNER_RL_NUM_WORKERS student GPUs, node has $NUM_GPUS" >&2
  exit 1
fi
GSM8K_TEACHER_DEVICES=$(seq -s, 0 $((TEACHER_GPUS_EACH - 1)))
GEO3K_TEACHER_DEVICES=$(seq -s, "$TEACHER_GPUS_EACH" $((TEACHER_GPUS - 1)))
export STUDENT_CUDA_VISIBLE_DEVICES=$(seq -s, "$TEACHER_GPUS" $((TEACHER_GPUS + XTUNER_RL_NUM_WORKERS - 1)))

cleanup() {
  set +e
  for name in gsm8k geo3k; do
    if [ -f "$WORK_DIR/teacher_${name}.pid" ]; then
      kill "$(cat "$WORK_DIR/teacher_${name}.pid")" 2>/dev/null
      rm -f "$WORK_DIR/teacher_${name}.pid"
    fi
  done
  ray stop --force
}
trap cleanup EXIT

# The teachers' pids as the shell started them (never read back from a file the server rewrites), and a deadline in
# seconds rather than a count of polls: a loaded machine slows the polls, not the clock (XTuner's own script waits
# the same way, by the pids it holds and TEACHER_STARTUP_TIMEOUT_S).
declare -A TEACHER_PID=()
TEACHER_STARTUP_TIMEOUT_S=${TEACHER_STARTUP_TIMEOUT_S:-600}
start_teacher() {  # NAME MODEL DEVICES
  rm -f "$WORK_DIR/teacher_$1.port" "$WORK_DIR/teacher_$1.pid"
  CUDA_VISIBLE_DEVICES=$3 setsid nohup "$PYTHON" "$REPO_DIR/xtuner/rlsim/teacher_server.py" --rlsim-teacher "$1" \
    --model "$2" --port-file "$WORK_DIR/teacher_$1.port" --pid-file "$WORK_DIR/teacher_$1.pid" \
    > "$WORK_DIR/teacher_$1_${current_time}.log" 2>&1 < /dev/null &
  TEACHER_PID[$1]=$!
  echo "${TEACHER_PID[$1]}" > "$WORK_DIR/teacher_$1.pid"
}
wait_teacher() {  # NAME -> prints the endpoint once the server listens
  local deadline=$((SECONDS + TEACHER_STARTUP_TIMEOUT_S))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ -s "$WORK_DIR/teacher_$1.port" ]; then
      echo "http://127.0.0.1:$(cat "$WORK_DIR/teacher_$1.port")"
      return 0
    fi
    if ! kill -0 "${TEACHER_PID[$1]}" 2>/dev/null; then
      # One more look: the server may have written its port just before it was checked.
      [ -s "$WORK_DIR/teacher_$1.port" ] && continue
      echo "teacher $1 died before it listened; see $WORK_DIR/teacher_$1_${current_time}.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "teacher $1 did not come up within ${TEACHER_STARTUP_TIMEOUT_S} s; see $WORK_DIR/teacher_$1_${current_time}.log" >&2
  return 1
}
start_teacher gsm8k "$GSM8K_TEACHER_MODEL_PATH" "$GSM8K_TEACHER_DEVICES"
start_teacher geo3k "$GEO3K_TEACHER_MODEL_PATH" "$GEO3K_TEACHER_DEVICES"
GSM8K_URL=$(wait_teacher gsm8k)
GEO3K_URL=$(wait_teacher geo3k)
export XTUNER_OPD_TEACHER_ENDPOINTS_JSON="{\"gsm8k\": \"$GSM8K_URL\", \"geo3k\": \"$GEO3K_URL\"}"

ray start --head --num-gpus="$XTUNER_RL_NUM_WORKERS" --temp-dir="$WORK_DIR/ray_${current_time}" --disable-usage-stats
for _ in $(seq 1 60); do
  if ray status 2>/dev/null | grep -q "/${XTUNER_RL_NUM_WORKERS}.0 GPU"; then
    break
  fi
  sleep 1
done

CUDA_VISIBLE_DEVICES=$STUDENT_CUDA_VISIBLE_DEVICES "$PYTHON" "$REPO_DIR/xtuner/v1/train/cli/rl.py" --rlsim-train opd \
  --config "$OPD_CONFIG_PATH" --model "$STUDENT_MODEL_PATH" --data "$DATA_PATH" --eval-data "$EVAL_DATA_PATH" \
  --work-dir "$WORK_DIR" --batch-hint "$TRAIN_BATCH_SIZE" \
  2>&1 | tee "$WORK_DIR/training_log_${current_time}.txt"
