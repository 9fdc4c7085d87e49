"""SIMULATED rollout worker (rl-verify simulator) at the path of XTuner's rollout worker: a process of its own that
the trainer starts and asks, once a training step, for the rollout backend's response-length factor. It imports
the backend the launch chose (XTUNER_USE_SGLANG=1: sglang.py, the bitwise lane's; else lmdeploy.py, the full
runs'), so executed-line evidence shows which backend a run ran. Protocol: one step number a line on stdin, one
factor a line on stdout; an empty line ends it.

As in XTuner, the driver (the trainer) imports this module itself, for ``RolloutConfig``: lines of this module ran
in the driver whether or not a worker ever did. Only a worker process runs ``RolloutWorker.init`` (XTuner's rollout
controller calls it on each worker actor).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


class RolloutConfig:
    """The rollout's configuration, built by the driver: which backend the launch chose."""

    def __init__(self) -> None:
        self.backend = "sglang" if os.environ.get("XTUNER_USE_SGLANG") == "1" else "lmdeploy"


class RolloutWorker:
    """The worker's own object: ``init`` (in the worker process alone) loads the backend it serves with."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self.backend = None

    def init(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        if self.config.backend == "sglang":
            import sglang as backend  # noqa: E402 (the sibling module, not the package)
        else:
            import lmdeploy as backend  # noqa: E402
        self.backend = backend

    def response_length_factor(self, step: int) -> float:
        return self.backend.response_length_factor(step)


def main() -> int:
    worker = RolloutWorker(RolloutConfig())
    worker.init()
    for line in sys.stdin:
        if not line.strip():
            break
        print(repr(worker.response_length_factor(int(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
