"""rl-verify's SIMULATED GPU node (tests and demo only; the DAG and rl_verify never import it).

``simulator.node`` starts a real OpenSSH sshd on 127.0.0.1 over a simulated XTuner node: fake
``ray``/``nvidia-smi``, placeholder models and data, baseline trackers, and a git checkout whose
launch scripts replay realistic RL metric curves with switchable regressions and faults.
The API lives in ``simulator.node`` (start_node, stop_node, set_fault, clear_faults,
node_processes, trainers, ray_running); it is re-exported here lazily so ``python -m simulator.node`` stays clean.
"""
from __future__ import annotations

from typing import Any

__all__ = ["start_node", "stop_node", "set_fault", "clear_faults", "node_processes", "node_status",
           "ray_running", "trainers"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from simulator import node

        return getattr(node, name)
    raise AttributeError(name)
