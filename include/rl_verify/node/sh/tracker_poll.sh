#!/usr/bin/env bash
# One look at the training's tracker: the newest matching file and its bytes after an offset.
# Inputs (assigned by remote.render): work_dir; glob, the tracker glob under work_dir (validated,
# no spaces); known, the tracker path read so far ("" for none); offset, its bytes already read;
# max_bytes, the chunk limit.
# Prints "<path or -> <start offset> <size>" (start is 0 when the newest tracker is another file
# than the known one), then the tracker's bytes from the start offset.
# shellcheck disable=SC2154  # the inputs are assigned by the prelude remote.render writes
set -u
# shellcheck disable=SC2086  # $glob is validated (no spaces) and must expand
newest=$(printf "%s\n" "$work_dir"/$glob | sort | tail -n 1)
if [ -z "$newest" ] || [ ! -f "$newest" ]; then
  echo "- 0 0"
  exit 0
fi
start=$offset
if [ "$newest" != "$known" ]; then start=0; fi
size=$(stat -c %s "$newest" 2>/dev/null || echo 0)
printf '%s %s %s\n' "$newest" "$start" "$size"
if [ "$size" -gt "$start" ]; then tail -c +"$((start + 1))" "$newest" | head -c "$max_bytes"; fi
exit 0
