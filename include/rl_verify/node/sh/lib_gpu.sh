#!/usr/bin/env bash
# Library prepended (rendered) by remote.py to the scripts that read the node's GPUs (prerequisites, stop).
# Inputs (assigned by remote.render before this text):
#   marker_env  name of the marker variable (RL_VERIFY_RUN or RL_VERIFY_JOB)
#   job_env     name of the job marker variable every rl-verify job exports (RL_VERIFY_JOB)
#   job_re      the shape of a job marker's value, <run key>/<job> (remote._MARKER_RE as a POSIX ERE)
#
# gpu_state VALUE [PIDS [RUNS]] prints what nvidia-smi shows of the GPUs, its lines kept exactly as it writes them
# (ops.parse_gpu_query / parse_compute_apps read them, as they read the captured outputs in tests/data):
#   GPUMEM<TAB><one line of --query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total>
#   GPUAPP<TAB><one line of --query-compute-apps=gpu_uuid,pid,used_memory,process_name><TAB>user<TAB>whose<TAB>cmd
#         <TAB>job<TAB>job_state
#     whose: own (the process carries marker_env=VALUE, or its pid is one of PIDS), other (it does not, or its
#     environment cannot be read: another user's), gone (no such process here, or a zombie: it exited while the
#     driver still lists it, or it runs in another container); user and cmd are - where they cannot be read;
#     job: for an other process, the job marker of another rl-verify run it carries (job_env=<run key>/<job>), else -;
#     job_state: whether that job is live, as prerequisites.sh's busy check decides it, in RUNS/<run key>/jobs/<job>:
#     live (no exit_code, its process group lives), ended (the folder is there, the job is not live: what is left
#     on the GPU is a leftover), unknown (no such folder under RUNS, or no RUNS given), - where job is -;
#   GPUERR<TAB>query<TAB>exit status<TAB>the lines nvidia-smi printed that are no row (one line), for a query that
#     exited non-zero (its rows are printed as above all the same).
# Both queries use --format=csv,noheader,nounits (memory in MiB).
# With RUNS, job_alive() comes from lib_alive.sh, rendered before this text.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
# shellcheck disable=SC2329  # called by the template this library is prepended to

gpu_query() {
  nvidia-smi --query-"$1"="$2" --format=csv,noheader,nounits 2>&1
}

# gpu_job ENVIRON RUNS prints "job<TAB>job_state" (see gpu_state) of a process whose environment, one NAME=value a
# line, is ENVIRON. A value of another shape is no rl-verify job's: it never reaches a path.
gpu_job() {
  local job dir
  job=$(printf '%s\n' "$1" | sed -n "s/^$job_env=//p" | head -n1)
  if ! [[ $job =~ $job_re ]]; then printf -- '-\t-'; return 0; fi
  dir="$2/${job%%/*}/jobs/${job#*/}"
  if [ -z "$2" ] || [ ! -d "$dir" ]; then
    printf '%s\tunknown' "$job"
  # The busy check's own test (prerequisites.sh): no exit_code and a live process group that is still the job's.
  elif [ ! -f "$dir/exit_code" ] && job_alive "$dir"; then
    printf '%s\tlive' "$job"
  else
    printf '%s\tended' "$job"
  fi
}

gpu_state() {
  local value=$1 known=" ${2:-} " runs=${3:-} out rc line pid user whose cmd environ job bad=
  out=$(gpu_query gpu index,uuid,name,pci.bus_id,memory.used,memory.total); rc=$?
  # Every line as it came (a line that is no GPU's row is parsed as what nvidia-smi said about that GPU).
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    printf 'GPUMEM\t%s\n' "$line"
    case "$line" in [0-9]*,*) ;; *) bad="$bad $line" ;; esac
  done <<< "$out"
  if [ "$rc" -ne 0 ]; then printf 'GPUERR\tgpu\t%s\t%s\n' "$rc" "$(printf '%s' "${bad# }" | tr '\t' ' ' | cut -c1-400)"; fi
  out=$(gpu_query compute-apps gpu_uuid,pid,used_memory,process_name); rc=$?
  bad=
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    pid=$(printf '%s' "$line" | cut -s -d, -f2 | tr -d ' ')
    case "$pid" in '' | *[!0-9]*) bad="$bad $line"; continue ;; esac
    user=- whose=gone cmd=- environ='' job=$'-\t-'
    # A zombie (state Z: exited, not yet reaped by its parent) holds no memory and has no environment to read:
    # it is gone, like a pid with no /proc entry, not another user's process.
    if [ -d "/proc/$pid" ] && [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]; then
      user=$(stat -c %U "/proc/$pid" 2>/dev/null) || user=-
      whose=other
      environ=$({ tr '\0' '\n' < "/proc/$pid/environ"; } 2>/dev/null)
      if printf '%s\n' "$environ" | grep -qxF "$marker_env=$value"; then whose=own; fi
      cmd=$(tr '\0\t\n\r' '    ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)
      [ -n "$cmd" ] || cmd=-
    fi
    case "$known" in *" $pid "*) whose=own ;; esac
    # Another rl-verify run's process carries its job marker: whose job it is, and whether that job still trains,
    # tells a live training (wait for it) from a leftover (stop it).
    if [ "$whose" = other ]; then job=$(gpu_job "$environ" "$runs"); fi
    printf 'GPUAPP\t%s\t%s\t%s\t%s\t%s\n' "$line" "$user" "$whose" "$cmd" "$job"
  done <<< "$out"
  # (A line that is no process's row, with exit 0, is a notice such as "No running processes found".)
  if [ "$rc" -ne 0 ]; then
    printf 'GPUERR\tcompute-apps\t%s\t%s\n' "$rc" "$(printf '%s' "${bad# }" | tr '\t' ' ' | cut -c1-400)"
  fi
}

# gpu_pids WHOSE VALUE [PIDS]: the pids of the compute processes gpu_state calls WHOSE (a regular expression:
# own, or own|gone), one per line, once. (Fields are counted from the left: cmd never holds a tab.)
gpu_pids() {
  local whose=$1
  shift
  gpu_state "$@" | awk -F'\t' -v w="^($whose)\$" '$1 == "GPUAPP" && $4 ~ w { split($2, f, ","); gsub(/ /, "", f[2]); print f[2] }' \
    | sort -u
}
