#!/usr/bin/env bash
# The files and lines a diff touches (issues 44, 53), read so that no file can be lost: the file list is git's own
# (`git diff --raw -z`: modes, blob ids and status, NUL-separated, no renames, no external diff or textconv), each
# file's hunks come from a `git diff -U0` of that one path (only its `@@ -a,b +c,d @@` headers are kept: a
# content line always begins with +, - or a space, so a removed line that reads "-- x" is never a header), and
# `--numstat -z` says which files git sees as binary.
# Inputs (assigned by remote.render before this text, validated in Python):
#   checkout  the node's xtuner checkout      base, head  full SHAs      py  a Python (the head's .py files parse?)
# Output, one record a line (the path lists base64-encoded: any name survives):
#   RAW <base64 of git diff --raw -z --no-abbrev>       NUMSTAT <base64 of git diff --numstat -z>
#   HUNK <n> @@ ...                                     (the n-th file of RAW, 0-based, one line per hunk)
#   PARSE <n> ok|error                                  (a .py file present at head: does it parse there)
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
diff_opts=(--no-renames --no-ext-diff --no-textconv --no-color --ignore-submodules=none)
raw=$(git -C "$checkout" diff --raw -z --no-abbrev "${diff_opts[@]}" "$base" "$head" -- | base64 -w0)
echo "RAW $raw"
echo "NUMSTAT $(git -C "$checkout" diff --numstat -z "${diff_opts[@]}" "$base" "$head" -- | base64 -w0)"
n=0
while IFS= read -r -d '' meta && IFS= read -r -d '' path; do
  git -C "$checkout" diff -U0 "${diff_opts[@]}" "$base" "$head" -- ":(literal)$path" \
    | { grep -E '^@@ -[0-9]+(,[0-9]+)? \+[0-9]+(,[0-9]+)? @@' || true; } | sed "s/^/HUNK $n /"
  status=${meta##* }
  if [[ "$path" == *.py && "$status" != D ]]; then
    if git -C "$checkout" show "$head:$path" 2>/dev/null | "$py" -c 'import ast, sys; ast.parse(sys.stdin.buffer.read())' \
        >/dev/null 2>&1; then
      echo "PARSE $n ok"
    else
      echo "PARSE $n error"
    fi
  fi
  n=$((n + 1))
done < <(printf '%s' "$raw" | base64 -d)
