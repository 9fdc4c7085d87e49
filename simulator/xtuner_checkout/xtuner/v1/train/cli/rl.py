"""SIMULATED (rl-verify simulator) at the path of XTuner's RL entry point (run_rl.sh runs `python
xtuner/v1/train/cli/rl.py`): it runs the replay trainer, xtuner/rlsim/train.py, with the same arguments."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.argv[0] = str(Path(__file__).resolve().parents[3] / "rlsim" / "train.py")
    runpy.run_path(sys.argv[0], run_name="__main__")
