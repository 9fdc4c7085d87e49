#!/usr/bin/env bash
# Write the config of the lane's executed-code evidence run (issue 53, the suite spec's evidence.stop_config) into the
# job's evidence folder: a config that runs the suite's config as XTuner's CLI runs one, then sets its trainer's step
# count, so that the run ends by itself after the lane's steps (node.evidence_scripts.evidence_config_text writes its text). It lies
# outside the worktree: the worktree stays clean and coverage.py measures the suite's config, not this one.
# Inputs (assigned by remote.render before this text, validated in Python):
#   evidence_dir  the job's evidence folder (evidence_setup.sh made it)
#   config        the suite's config in the worktree (absolute)      name  the file name to write (the config's own)
#   text          the config's text
# Prints CONFIG=<the written config's path>. Exit 3: the worktree has no such config.
# shellcheck disable=SC2154
set -eu
if [ ! -f "$config" ]; then
  echo "the suite's config $config is not in the worktree: the evidence run cannot be given its step count" >&2
  exit 3
fi
mkdir -p "$evidence_dir/config"
printf '%s' "$text" > "$evidence_dir/config/$name.tmp"
mv "$evidence_dir/config/$name.tmp" "$evidence_dir/config/$name"
echo "CONFIG=$evidence_dir/config/$name"
