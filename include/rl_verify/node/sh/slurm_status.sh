#!/usr/bin/env bash
# Print the state of one Slurm job (the launcher's status verb); slurm_settle() is from lib_slurm.sh.
# Input (assigned by launcher.render): job_dir. Prints one line: absent | pending <reason> | running |
# finished | ended <STATE> <ours|outside> | dead <why>.
# shellcheck disable=SC2154  # the input is assigned by the prelude render writes
slurm_settle "$job_dir"
