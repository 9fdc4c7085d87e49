#!/usr/bin/env bash
# List the files that differ between two commits of the node checkout (the path-aware skip, issue 33).
# Inputs (assigned by remote.render before this text, validated in Python):
#   checkout  the node's xtuner checkout      base, head  full SHAs (the verified PASS, the commit under test)
# Prints one line per changed path (relative to the checkout's root), both names of a rename (--no-renames:
# a move out of an affecting folder still counts), NUL-free: git quotes unusual names (core.quotePath).
# Exit 3: base or head is not a commit of the checkout (stderr names it); 4: no checkout.
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
git -C "$checkout" -c core.quotePath=true diff --name-only --no-renames "$base" "$head" --
