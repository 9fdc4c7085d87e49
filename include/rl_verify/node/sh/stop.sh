#!/usr/bin/env bash
# Stop one job or every job of a run: TERM the job process groups and every process carrying
# the marker, KILL what is left, stop Ray when a job was launched, report what happened.
# Inputs (assigned by remote.render before this text, validated in Python):
#   job_dir    one job's folder (kill one job), or empty
#   run_dir    the run's folder (stop all its jobs), used when job_dir is empty
#   value      marker value to look for (job marker or run key)
# marked() comes from lib_marked.sh, rendered before this text.
# Prints "TERM group P", "KILLED P cmdline", "ray stopped", "LEFT P" lines.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
set -u
if [ -n "$job_dir" ]; then set -- "$job_dir/pid"; else set -- "$run_dir"/jobs/*/pid; fi
launched=0
for pidf in "$@"; do
  [ -f "$pidf" ] || continue
  launched=1
  p=$(cat "$pidf" 2>/dev/null)
  case "$p" in ''|*[!0-9]*|0|1) continue;; esac
  kill -TERM -"$p" 2>/dev/null && echo "TERM group $p"
done
for p in $(marked "$value"); do kill -TERM "$p" 2>/dev/null; done
for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(marked "$value")" ] && break; sleep 0.5; done
for p in $(marked "$value"); do
  echo "KILLED $p $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-200)"
  kill -KILL "$p" 2>/dev/null
done
# Only a run that launched a job stops Ray: a run refused as busy must not stop another run's.
if [ "$launched" = 1 ]; then
  if ray stop --force >/dev/null 2>&1; then echo "ray stopped"; else echo "ray stop failed or ray absent"; fi
fi
sleep 0.5
for p in $(marked "$value"); do echo "LEFT $p"; done
exit 0
