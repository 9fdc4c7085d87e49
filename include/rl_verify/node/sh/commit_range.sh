#!/usr/bin/env bash
# List a bisection's range in the node checkout: good, then every first-parent commit up to bad.
# Inputs (assigned by remote.render before this text, validated in Python):
#   checkout  the node's xtuner checkout      good, bad  branch, tag or SHA of each end
#   limit     the most commits after good to list
# Prints COUNT<tab>n (commits after good, first parent), then, when n <= limit, one line per commit from
# good on, oldest first: sha, then base64 of author, ISO date and subject, tab-separated.
# Exit 3: an end does not exist (stderr names it); 4: no checkout; 6: good is not an ancestor of bad.
# shellcheck disable=SC2154
set -eu
if ! git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1; then
  echo "node checkout $checkout is not a git repository: set RL_VERIFY_NODE_CHECKOUT" >&2; exit 4
fi
if git -C "$checkout" remote get-url origin >/dev/null 2>&1; then
  git -C "$checkout" fetch --quiet origin || echo "warning: git fetch origin failed" >&2
fi
resolve() {
  git -C "$checkout" rev-parse --verify --quiet "refs/remotes/origin/$1^{commit}" 2>/dev/null \
    || git -C "$checkout" rev-parse --verify --quiet "$1^{commit}" 2>/dev/null
}
good_sha=$(resolve "$good") || { echo "good: ref '$good' does not exist in $checkout" >&2; exit 3; }
bad_sha=$(resolve "$bad") || { echo "bad: ref '$bad' does not exist in $checkout" >&2; exit 3; }
if [ "$good_sha" != "$bad_sha" ] && ! git -C "$checkout" merge-base --is-ancestor "$good_sha" "$bad_sha"; then
  echo "good ($good, $good_sha) is not an ancestor of bad ($bad, $bad_sha)" >&2; exit 6
fi
line() {
  printf '%s\t%s\t%s\t%s\n' "$1" \
    "$(git -C "$checkout" log -1 --format='%an <%ae>' "$1" | base64 -w0)" \
    "$(git -C "$checkout" log -1 --format=%cI "$1" | base64 -w0)" \
    "$(git -C "$checkout" log -1 --format=%s "$1" | base64 -w0)"
}
count=$(git -C "$checkout" rev-list --first-parent --count "$good_sha..$bad_sha")
printf 'COUNT\t%s\n' "$count"
[ "$count" -le "$limit" ] || exit 0
line "$good_sha"
git -C "$checkout" rev-list --first-parent --reverse "$good_sha..$bad_sha" | while read -r sha; do line "$sha"; done
