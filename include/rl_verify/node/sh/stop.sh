#!/usr/bin/env bash
# Stop one job or every job of a run: TERM the job process groups and every process carrying
# the marker, KILL what is left, stop Ray when a job was launched, report what happened.
# Inputs (assigned by remote.render before this text, validated in Python):
#   job_dir    one job's folder (kill one job), or empty
#   run_dir    the run's folder (stop all its jobs), used when job_dir is empty
#   value      marker value to look for (job marker or run key)
#   gpu_wait   seconds to wait, after the stop, until no compute process of these jobs holds GPU memory
#              (negative: the GPUs are not read)
# marked() comes from lib_marked.sh, gpu_state() and gpu_pids() from lib_gpu.sh, rendered before this text.
# Prints "TERM group P", "KILLED P cmdline", "ray stopped", "LEFT P" lines, and with gpu_wait >= 0
# "GPUWAIT<TAB>milliseconds waited<TAB>the pids of ours seen on the GPUs before the stop" then gpu_state's lines.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
set -u
if [ -n "$job_dir" ]; then set -- "$job_dir/pid"; else set -- "$run_dir"/jobs/*/pid; fi
# The compute processes of ours on the GPUs before the stop: once they exit their pids no longer carry the
# marker, and a GPU context the driver has not released is listed under the dead pid.
gpu_before=
if [ "$gpu_wait" -ge 0 ]; then gpu_before=$(gpu_pids own "$value" | tr '\n' ' '); fi
launched=0
for pidf in "$@"; do
  [ -f "$pidf" ] || continue
  launched=1
  # Only a group the job still leads: once it is gone its number may lead someone else's group. What is
  # left of a job whose leader died carries the marker and is stopped below.
  p=$(job_leader "$(dirname "$pidf")")
  [ -n "$p" ] || continue
  kill -TERM -"$p" 2>/dev/null && echo "TERM group $p"
done
for p in $(marked "$value"); do kill -TERM "$p" 2>/dev/null; done
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(marked "$value")" ] && break; sleep 0.5; done
for p in $(marked "$value"); do
  echo "KILLED $p $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-200)"
  kill -KILL "$p" 2>/dev/null
done
# Only a run that launched a job stops Ray: a run refused as busy must not stop another run's, and a run
# that ended while another run's job trains on this node (its training waited for the node's pool) leaves
# that job's Ray alone.
other=""
if [ "$launched" = 1 ]; then
  mine=$(cd "${run_dir:-$(dirname "$(dirname "$job_dir")")}" 2>/dev/null && pwd -P)
  for pidf in "$(dirname "$mine")"/*/jobs/*/pid; do
    [ -f "$pidf" ] || continue
    case "$pidf" in "$mine"/*) continue;; esac
    if job_alive "$(dirname "$pidf")"; then other=$(dirname "$pidf"); break; fi
  done
fi
if [ "$launched" = 1 ] && [ -n "$other" ]; then
  echo "ray left running: job $other of another run is training on this node"
elif [ "$launched" = 1 ]; then
  if ray stop --force >/dev/null 2>&1; then echo "ray stopped"; else echo "ray stop failed or ray absent"; fi
fi
sleep 0.5
if [ "$gpu_wait" -ge 0 ]; then
  t0=$(date +%s%N)
  deadline=$(( t0 + gpu_wait * 1000000000 ))
  # A pid the driver lists that is no process here any more (gone) may be one of ours whose memory is being
  # released: waited for too.
  while [ -n "$(gpu_pids 'own|gone' "$value" "$gpu_before")" ] && [ "$(date +%s%N)" -lt "$deadline" ]; do sleep 0.25; done
  printf 'GPUWAIT\t%s\t%s\n' "$(( ($(date +%s%N) - t0) / 1000000 ))" "${gpu_before% }"
  # The runs root beside the run's folder: another run's process is named live or a leftover, as for the readiness.
  gpu_state "$value" "$gpu_before" "${run_dir:+$(dirname "$run_dir")}"
fi
for p in $(marked "$value"); do echo "LEFT $p"; done
exit 0
