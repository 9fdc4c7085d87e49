"""The SIMULATED GPU node of rl-verify: a real OpenSSH sshd on 127.0.0.1 over a simulated XTuner node.

Nothing here touches a GPU. ``start_node`` builds (idempotently) a node root under the state dir:

    STATE/keys/          generated ed25519 host + client keys, authorized_keys (never in git)
    STATE/sshd_config    sshd of this node (127.0.0.1, free high port, pubkey only)
    STATE/sshd.pid, STATE/sshd.log
    STATE/node.json      how to reach and use the node (see simulator/README.md)
    STATE/node/          ROOT of the node: bin/ (fake ray, nvidia-smi), share/{model,data,baseline},
                         xtuner/ (simulated XTuner git checkout), sim.json, faults.json, state/

and starts sshd. Every SSH session gets ``PATH=ROOT/bin:...`` and ``RLSIM_NODE=ROOT`` (sshd SetEnv),
so every simulated process started through the node carries RLSIM_NODE in /proc/<pid>/environ; that
is how ``stop_node`` and ``node_processes`` find them. Control side: standard library only.

The code lives in one module per concern: ``common`` (constants, helpers), ``checkout`` (share,
bin/, the XTuner checkout), ``sshd`` (keys, config, start/stop, outages, status), ``processes`` (find
and kill the node's processes), ``faults`` (faults read by the replay trainer). This module is their
public surface and the CLI: ``python -m simulator.node start|stop|status|fault|clear-faults|noise --state DIR``
(``noise``: the node's noise mode, module ``noise``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The public surface of the simulated node, one module per concern.
from simulator.checkout import bisect_history, build_checkout, grpo_baseline_rows, opd_baseline_rows  # noqa: F401
from simulator.common import FAULT_KINDS, REGRESSION_BRANCHES, SSHD, BisectLayout  # noqa: F401
from simulator.faults import clear_faults, release, set_fault  # noqa: F401
from simulator.noise import noise_settings, set_determinism, set_noise, set_worker_env  # noqa: F401
from simulator.processes import kill_node_processes, node_processes, ray_running, trainers  # noqa: F401
from simulator.sshd import node_status, reset_state, sshd_down, sshd_up, start_node, stop_node  # noqa: F401
from simulator.traps import NODE_FAULT_KINDS  # noqa: F401


# ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.node",
                                description="The rl-verify SIMULATED GPU node (real sshd, no GPU).")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="build the node (idempotent), start sshd, print node.json")
    s.add_argument("--state", required=True, type=Path)
    s.add_argument("--port", type=int)
    s.add_argument("--step-seconds", type=float, default=1.0)
    s.add_argument("--noise", help="noise mode: bounded (default) | realistic | realistic-t (kept across restarts)")
    s.add_argument("--baseline-error-seed", help="seed of the baseline's own error (realistic modes)")
    for name, hlp in (("stop", "stop sshd and kill every simulated process"), ("status", "print status")):
        sub.add_parser(name, help=hlp).add_argument("--state", required=True, type=Path)
    f = sub.add_parser("fault", help="switch a fault on for one suite (node traps: for the whole node)")
    f.add_argument("--state", required=True, type=Path)
    f.add_argument("--suite", choices=["grpo", "opd", "node"],
                   help="required for suite faults; node traps default to 'node'")
    f.add_argument("--kind", required=True, choices=FAULT_KINDS + NODE_FAULT_KINDS)
    f.add_argument("--at-step", type=int)
    f.add_argument("--path", help="missing-input: path relative to the node root to hide")
    f.add_argument("--factor", type=float, help="slow: step-time factor (default 3)")
    f.add_argument("--metric", help="nan: metric set to NaN (default mismatch / distillation KL)")
    f.add_argument("--limit", type=int, help="low-nofile: hard open-files limit of SSH sessions (default 20000)")
    f.add_argument("--gpus", type=int, help="hidden-gpu / gpu-lost: GPUs left visible (default gpus - 1)")
    f.add_argument("--user", help="foreign-ray / gpu-foreign: the other user (default nobody)")
    f.add_argument("--gpu", type=int, help="gpu-foreign / gpu-held / gpu-error: the GPU's index (default 0)")
    f.add_argument("--mib", type=int, help="gpu-foreign / gpu-held: GPU memory held (MiB)")
    f.add_argument("--times", type=int, help="strike only the first N launches (a one-off fault: N = 1)")
    f.add_argument("--commit", help="strike only launches of this commit (a SHA prefix)")
    f.add_argument("--survives-stop", action="store_true",
                   help="foreign-ray: `ray stop --force` cannot kill it (as for an unprivileged SSH user)")
    c = sub.add_parser("clear-faults", help="switch faults off (restores hidden inputs, node traps)")
    c.add_argument("--state", required=True, type=Path)
    c.add_argument("--suite", choices=["grpo", "opd", "node"])
    n = sub.add_parser("noise", help="show or switch the noise mode (rewrites the share's baselines)")
    n.add_argument("--state", required=True, type=Path)
    n.add_argument("--mode", help="bounded | realistic | realistic-t (omit to show the settings)")
    n.add_argument("--baseline-error-seed", help="seed of the baseline's own error (realistic modes)")
    n.add_argument("--correlation", type=float,
                   help="step-to-step correlation of a run's training-metric noise, 0 <= rho < 1 (0: independent)")
    a = p.parse_args(argv)

    if a.cmd == "start":
        info = start_node(a.state, step_seconds=a.step_seconds, port=a.port)
        if a.noise or a.baseline_error_seed:
            set_noise(a.state, a.noise or noise_settings(a.state)["noise"], a.baseline_error_seed)
        print(json.dumps(info, indent=2))
    elif a.cmd == "stop":
        stop_node(a.state)
        print(f"stopped node {a.state}")
    elif a.cmd == "status":
        print(json.dumps(node_status(a.state), indent=2))
    elif a.cmd == "fault":
        extra = {k: v for k, v in (("factor", a.factor), ("metric", a.metric), ("limit", a.limit),
                                   ("gpus", a.gpus), ("user", a.user), ("gpu", a.gpu), ("mib", a.mib),
                                   ("times", a.times), ("commit", a.commit))
                 if v is not None}
        if a.survives_stop:
            extra["survives_stop"] = True
        suite = a.suite or ("node" if a.kind in NODE_FAULT_KINDS else None)
        if suite is None:
            p.error(f"--suite is required for --kind {a.kind}")
        print(json.dumps(set_fault(a.state, suite, a.kind, a.at_step, path=a.path, **extra)))
    elif a.cmd == "clear-faults":
        clear_faults(a.state, a.suite)
        print("faults cleared")
    elif a.cmd == "noise":
        if a.mode or a.baseline_error_seed or a.correlation is not None:
            settings = set_noise(a.state, a.mode or noise_settings(a.state)["noise"], a.baseline_error_seed,
                                 correlation=a.correlation)
        else:
            settings = noise_settings(a.state)
        print(json.dumps(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
