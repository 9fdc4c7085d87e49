#!/usr/bin/env bash
# Print the state of one job: exactly one of absent, running, finished, dead
# (dead: started, no exit code, no live process in its group; job_alive() is from lib_alive.sh).
# Input (assigned by remote.render before this text, validated in Python):
#   job_dir  the job's folder
# job_dir is assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
if [ -f "$job_dir/exit_code" ]; then echo finished
elif [ -f "$job_dir/pid" ] && job_alive "$job_dir"; then echo running
elif [ -d "$job_dir" ]; then echo dead
else echo absent; fi
