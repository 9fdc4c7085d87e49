"""SIMULATED (rl-verify simulator) at the path of XTuner's RL entry point (run_rl.sh runs `python
xtuner/v1/train/cli/rl.py`): its ``main``, run by the driver alone, runs the replay trainer, xtuner/rlsim/train.py,
with the same arguments."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    """The driver's entry (XTuner's ``main``: the config's trainer built and fit): the replay trainer."""
    sys.argv[0] = str(Path(__file__).resolve().parents[3] / "rlsim" / "train.py")
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
