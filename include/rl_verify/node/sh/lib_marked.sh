#!/usr/bin/env bash
# Library prepended (rendered) by remote.py to the scripts that stop a job or a run.
# Input (assigned by remote.render before this text):
#   marker_env  name of the marker variable (RL_VERIFY_RUN or RL_VERIFY_JOB)
# marked VALUE prints the pids whose environment holds marker_env=VALUE exactly. Only processes
# exec'd by a job carry its exported marker, so the shells that run the script calling it (and
# the job wrapper itself) are never listed.
# marker_env is assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
# shellcheck disable=SC2329  # called by the template this library is prepended to
marked() {
  for d in /proc/[0-9]*; do
    { tr '\0' '\n' < "$d/environ"; } 2>/dev/null | grep -qxF "$marker_env=$1" && echo "${d#/proc/}"
  done
}
