#!/usr/bin/env bash
# The lines a diff touches (issue 44): `git diff -U0 --no-renames BASE HEAD` of the node checkout, then one
# "BLOB <blob id or -> <path>" line per changed path: its git blob id at BASE (- when it has none there).
# Inputs (assigned by remote.render before this text, validated in Python):
#   checkout  the node's xtuner checkout      base, head  full SHAs
# Exit 3: a commit is not in the checkout (stderr names it); 4: no checkout.
# shellcheck disable=SC2154
set -eu
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
  echo "node checkout $checkout is not a git repository: set RL_VERIFY_NODE_CHECKOUT" >&2; exit 4
fi
for end in base head; do
  sha=${!end}
  if ! git -C "$checkout" cat-file -e "$sha^{commit}" 2>/dev/null; then
    echo "$end: commit $sha is not in $checkout" >&2; exit 3
  fi
done
git -C "$checkout" -c core.quotePath=true diff -U0 --no-renames --no-color "$base" "$head" --
git -C "$checkout" -c core.quotePath=true diff --name-only --no-renames "$base" "$head" -- | while IFS= read -r path; do
  blob=$(git -C "$checkout" rev-parse --verify --quiet "$base:$path" 2>/dev/null || echo -)
  printf 'BLOB %s %s\n' "$blob" "$path"
done
