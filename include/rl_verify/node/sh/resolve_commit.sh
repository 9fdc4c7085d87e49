#!/usr/bin/env bash
# Resolve a commit in the node checkout and add a clean per-run worktree at it.
# Inputs (assigned by remote.render before this text, validated in Python):
#   checkout  the node's xtuner checkout      runs  the remote runs root
#   key       the run key (folder name)       ref   the branch, tag or SHA to resolve
# Prints KEY=value lines: SHA, RUN_DIR, WORKTREE, SUBJECT_B64, TREE_GZ_B64 (the commit's tracked files, one path a
# line as git quotes them, gzip then base64: what the suites' path rules are checked against) and, when the
# worktree is not clean, DIRTY_STAT_B64. Exit 3: the ref does not exist; 4: no checkout; 5: worktree elsewhere.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
set -eu
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
  echo "node checkout $checkout is not a git repository: set RL_VERIFY_NODE_CHECKOUT" >&2; exit 4
fi
if git -C "$checkout" remote get-url origin >/dev/null 2>&1; then
  git -C "$checkout" fetch --quiet origin || echo "warning: git fetch origin failed" >&2
fi
sha=$(git -C "$checkout" rev-parse --verify --quiet "refs/remotes/origin/$ref^{commit}" 2>/dev/null \
      || git -C "$checkout" rev-parse --verify --quiet "$ref^{commit}" 2>/dev/null) || {
  echo "ref '$ref' does not exist in $checkout: push it or give an existing branch, tag or SHA" >&2
  exit 3
}
mkdir -p "$runs"
runs=$(cd "$runs" && pwd -P)
run_dir="$runs/$key"
wt="$run_dir/xtuner"
mkdir -p "$run_dir/work" "$run_dir/jobs"
if [ -e "$wt/.git" ]; then
  have=$(git -C "$wt" rev-parse HEAD)
  if [ "$have" != "$sha" ]; then
    echo "worktree $wt of this run is at $have, not $sha: remove it and retry" >&2; exit 5
  fi
else
  git -C "$checkout" worktree add --detach --quiet "$wt" "$sha"
fi
echo "SHA=$sha"
echo "RUN_DIR=$run_dir"
echo "WORKTREE=$wt"
echo "SUBJECT_B64=$(git -C "$wt" log -1 --format=%s "$sha" | base64 -w0)"
echo "TREE_GZ_B64=$(git -C "$wt" -c core.quotePath=true ls-tree -r --name-only "$sha" | gzip -c | base64 -w0)"
if [ -n "$(git -C "$wt" status --porcelain)" ]; then
  echo "DIRTY_STAT_B64=$( (git -C "$wt" diff --stat HEAD; git -C "$wt" status --porcelain) | base64 -w0)"
fi
