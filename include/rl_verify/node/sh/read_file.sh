#!/usr/bin/env bash
# Print a file of the node (at most max_bytes); exit 3 when it cannot be read.
# Inputs (assigned by remote.render): path, max_bytes.
# shellcheck disable=SC2154  # the inputs are assigned by the prelude remote.render writes
set -u
if [ ! -f "$path" ] || [ ! -r "$path" ]; then
  echo "cannot read $path" >&2
  exit 3
fi
head -c "$max_bytes" "$path"
