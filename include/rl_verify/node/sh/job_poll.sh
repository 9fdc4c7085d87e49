#!/usr/bin/env bash
# One look at a detached training job: its exit code, the log's next bytes.
# Inputs (assigned by remote.render): job_dir; offset, the log bytes already streamed (0: resume
# at the offset an earlier monitor recorded in $job_dir/stream_offset); max_bytes, the chunk limit.
# Prints "<exit code or -> <start offset> <log size> <seconds since the job started> [<scheduler>]", then the
# log from the start offset (the job started when it wrote its pid file, or a Slurm job's batch step its
# started file, as the report's wall time counts). scheduler: set by a launcher whose jobs a scheduler holds
# (launcher.SlurmLauncher: its state, one word with no space), else unset.
# The exit code is read before the log's size: once it exists the log is complete.
# shellcheck disable=SC2154  # the inputs are assigned by the prelude remote.render writes
set -u
log="$job_dir/stdout.log"
if [ "$offset" -eq 0 ] && [ -s "$job_dir/stream_offset" ]; then
  offset=$(cat "$job_dir/stream_offset")
  case "$offset" in '' | *[!0-9]*) offset=0 ;; esac
fi
echo "$offset" >"$job_dir/stream_offset"
code=-
if [ -f "$job_dir/exit_code" ]; then code=$(cat "$job_dir/exit_code"); fi
case "$code" in '' | *[!0-9]*) code=- ;; esac
# Where a scheduler holds the job, its word says whether the exit code is the job's own ("finished"): Slurm's signal
# can reach the body before the batch step, which then records the body's death as an exit code.
case "${scheduler:-finished}" in finished) ;; *) code=- ;; esac
size=$(stat -c %s "$log" 2>/dev/null || echo 0)
started=$(cat "$job_dir/started" 2>/dev/null || stat -c %Y "$job_dir/pid" 2>/dev/null || date +%s)
case "$started" in '' | *[!0-9]*) started=$(date +%s) ;; esac
scheduler=${scheduler:-}
echo "$code $offset $size $(($(date +%s) - started))${scheduler:+ $scheduler}"
if [ "$size" -gt "$offset" ]; then tail -c +"$((offset + 1))" "$log" | head -c "$max_bytes"; fi
exit 0
