#!/usr/bin/env bash
# Start one training job detached from this SSH session, in its own session and process group.
# Inputs (assigned by remote.render): job_dir, the job's folder; job_exports, lines
# "export NAME='value'" (names validated, values quoted by remote.submit_job_script); job_command,
# the job's command (one compound command, built by remote.job_command).
# The job writes $job_dir/pid.start (its start time: tells the job from a later process given the same
# pid number, see lib_alive.sh) then $job_dir/pid (its own pid = its process group, for kill and the busy
# check), $job_dir/stdout.log, and $job_dir/exit_code (atomically, when it ends). Waits until the pid is
# recorded, so every later busy check sees the job (no window for a second launch).
# proc_start() comes from lib_alive.sh, rendered before this text; exported for the detached bash only
# (it unsets it before the job starts: the training's environment stays as the job set it).
# shellcheck disable=SC2154  # the inputs are assigned by the prelude remote.render writes
set -eu
mkdir -p "$job_dir"
: >"$job_dir/stdout.log"
printf '%s\n%s\n' "$job_exports" "$job_command" >"$job_dir/job.sh"
export -f proc_start
# $$ of the bash that setsid started is the new session's and group's id.
# shellcheck disable=SC2016  # expanded by the detached bash, not here
setsid bash -c 'proc_start $$ >"$1/pid.start"; unset -f proc_start; echo $$ >"$1/pid"
bash "$1/job.sh" >"$1/stdout.log" 2>&1; rc=$?
echo "$rc" >"$1/exit_code.tmp" && mv "$1/exit_code.tmp" "$1/exit_code"' rl-verify-job "$job_dir" \
  </dev/null >/dev/null 2>&1 &
for _ in $(seq 100); do
  if [ -s "$job_dir/pid" ]; then exit 0; fi
  sleep 0.05
done
echo "the job did not record its pid in $job_dir/pid within 5 s" >&2
exit 1
