#!/usr/bin/env bash
# List the tracked files of one commit of the node checkout (issue 42: the suites' path rules are checked against
# the tree they judge).
# Inputs (assigned by remote.render before this text, validated in Python):
#   checkout  the node's xtuner checkout      sha  a full SHA
# Prints one path a line, relative to the checkout's root, as git quotes unusual names (core.quotePath).
# Exit 3: the commit is not in the checkout; 4: no checkout.
# shellcheck disable=SC2154
set -eu
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
  echo "node checkout $checkout is not a git repository: set RL_VERIFY_NODE_CHECKOUT" >&2; exit 4
fi
if ! git -C "$checkout" cat-file -e "$sha^{commit}" 2>/dev/null; then
  echo "commit $sha is not in $checkout" >&2; exit 3
fi
git -C "$checkout" -c core.quotePath=true ls-tree -r --name-only "$sha"
