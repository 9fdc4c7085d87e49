"""SIMULATED rollout worker (rl-verify simulator) at the path of XTuner's rollout worker: a process of its own that
the trainer starts and asks, once a training step, for the rollout backend's response-length factor. It imports
the backend the launch chose (XTUNER_USE_SGLANG=1: sglang.py, the bitwise lane's; else lmdeploy.py, the full
runs'), so executed-line evidence shows which backend a run ran. Protocol: one step number a line on stdin, one
factor a line on stdout; an empty line ends it.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    if os.environ.get("XTUNER_USE_SGLANG") == "1":
        import sglang as backend  # noqa: E402 (the sibling module, not the package)
    else:
        import lmdeploy as backend  # noqa: E402
    for line in sys.stdin:
        if not line.strip():
            break
        print(repr(backend.response_length_factor(int(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
