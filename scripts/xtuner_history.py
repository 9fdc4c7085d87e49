"""Write the facts of XTuner's public history that the shortcut bench replays (issue 42): the last N first-parent
commits of a ref (sha, dates, pull request number, subject, and each changed path with its git status against the
first parent, renames split into a deletion and an addition), the tracked files at the newest of them, and the
tracked files at other named refs (a pull request's head whose recipe is not on main yet).

Run it on a local clone of InternLM/xtuner (``git clone https://github.com/InternLM/xtuner``; for a pull request
``git fetch origin pull/1977/head:refs/pull/1977/head``)::

    python -m scripts.xtuner_history --repo ~/xtuner --ref main --count 400 \
        --tree refs/pull/1977/head --url https://github.com/InternLM/xtuner --out tests/data/xtuner/history.json

The output is data only (paths, dates, numbers read from git), never XTuner's code. Older trees are the newest
tree with the changes undone commit by commit (``tree_at`` in ``scripts.bench_shortcuts``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PR_NUMBER = re.compile(r"\(#(\d+)\)\s*$")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "core.quotePath=false", *args], check=True,
                          capture_output=True, text=True).stdout


def commit_facts(repo: Path, sha: str) -> dict[str, Any]:
    """One first-parent commit: its dates, pull request number (from the squash subject), subject and changes."""
    head = _git(repo, "log", "-1", "--format=%H%x00%aI%x00%cI%x00%s", sha).rstrip("\n").split("\0")
    parents = _git(repo, "rev-list", "--parents", "-n", "1", sha).split()
    changes: list[str] = []
    if len(parents) > 1:
        for line in _git(repo, "diff", "--name-status", "--no-renames", parents[1], sha).splitlines():
            status, path = line.split("\t", 1)
            changes.append(f"{status[0]}\t{path}")
    found = PR_NUMBER.search(head[3])
    return {"sha": head[0], "authored": head[1], "committed": head[2], "pr": int(found.group(1)) if found else None,
            "subject": head[3], "changes": changes}


def history(repo: Path, ref: str, count: int, trees: list[str], url: str | None = None) -> dict[str, Any]:
    """The data file's content (newest commit first); ``url``: the repository the clone is of (default: its
    ``origin``)."""
    shas = _git(repo, "rev-list", "--first-parent", f"-{count}", ref).split()
    if url is None:
        url = _git(repo, "remote", "get-url", "origin").strip() if _git(repo, "remote").strip() else str(repo)
    return {"source": {"repository": url, "ref": ref, "head": shas[0], "count": len(shas),
                       "read_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "how": "python -m scripts.xtuner_history (git log --first-parent; git diff --name-status "
                              "--no-renames against the first parent; git ls-tree -r --name-only)"},
            "commits": [commit_facts(repo, sha) for sha in shas],
            "tree": _git(repo, "ls-tree", "-r", "--name-only", shas[0]).splitlines(),
            "trees": {name: {"sha": _git(repo, "rev-parse", name).strip(),
                             "files": _git(repo, "ls-tree", "-r", "--name-only", name).splitlines()}
                      for name in trees}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a local clone of InternLM/xtuner")
    parser.add_argument("--ref", default="main")
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--tree", action="append", default=[], help="another ref whose tracked files to keep")
    parser.add_argument("--url", help="the repository the clone is of (default: its origin remote)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    data = history(args.repo, args.ref, args.count, args.tree, args.url)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(data['commits'])} commits from {data['source']['head'][:9]}, "
          f"{len(data['tree'])} files at the head, {len(data['trees'])} other tree(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
