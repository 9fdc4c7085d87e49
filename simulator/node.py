"""The SIMULATED GPU node of rl-verify: a real OpenSSH sshd on 127.0.0.1 over a simulated XTuner node.

Nothing here touches a GPU. ``start_node`` builds (idempotently) a node root under the state dir:

    STATE/keys/          generated ed25519 host + client keys, authorized_keys (never in git)
    STATE/sshd_config    sshd of this node (127.0.0.1, free high port, pubkey only)
    STATE/sshd.pid, STATE/sshd.log
    STATE/node.json      how to reach and use the node (see docs/ARCHITECTURE.md)
    STATE/node/          ROOT of the node: bin/ (fake ray, nvidia-smi), share/{model,data,baseline},
                         xtuner/ (simulated XTuner git checkout), sim.json, faults.json, state/

and starts sshd. Every SSH session gets ``PATH=ROOT/bin:...`` and ``RLSIM_NODE=ROOT`` (sshd SetEnv),
so every simulated process started through the node carries RLSIM_NODE in /proc/<pid>/environ; that
is how ``stop_node`` and ``node_processes`` find them. Control side: standard library only.

CLI: ``python -m simulator.node start|stop|status|fault|clear-faults --state DIR ...``.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

PKG = Path(__file__).resolve().parent
CHECKOUT_SRC = PKG / "xtuner_checkout"   # files of the simulated XTuner checkout (incl. autotest/ double)
OVERLAY_SRC = PKG / "xtuner_overlay"     # checkout files kept outside xtuner_checkout/autotest (owned by others)
BIN_SRC = PKG / "node_bin"
SSHD = Path("/usr/sbin/sshd")

OPD_SNAPSHOT = "models--Qwen--Qwen3-VL-2B-Instruct/snapshots/89644892e4d85e24eaac8bacfd4f463576704203"
MODELS = {
    "Qwen3-8B": "qwen3",
    OPD_SNAPSHOT: "qwen3_vl",
    "Qwen3-4B-Instruct-2507": "qwen3",
    "Qwen3-VL-4B-Instruct": "qwen3_vl",
}
GRPO_BASELINE = "qwen3-rl-lmdeploy/tracker.jsonl"
OPD_BASELINE = "opd-qwen3-vl-2b-25step/tracker.jsonl"

# Regression branches of the simulated checkout: node.json "commits" key -> (branch, commit message).
REGRESSION_BRANCHES = {
    "regress-init": ("sim/regress-init", "init", "Refactor weight loading (simulated init drift regression)"),
    "regress-divergence": ("sim/regress-divergence", "divergence",
                           "Rework advantage normalisation (simulated gradual divergence regression)"),
    "regress-mismatch": ("sim/regress-mismatch", "mismatch",
                         "Change rollout logprob path (simulated GRPO mismatch regression)"),
    "regress-teacher": ("sim/regress-teacher", "teacher",
                        "Change teacher endpoint batching (simulated OPD teacher-path regression)"),
    "regress-rewards": ("sim/regress-rewards", "rewards",
                        "Change judger answer extraction (simulated OPD rewards-only regression)"),
}
FAULT_KINDS = ("crash", "hang", "truncated", "nan", "missing-input", "slow")
# What a missing-input fault hides by default, per suite (relative to ROOT).
DEFAULT_MISSING = {"grpo": "share/model/Qwen3-8B", "opd": "share/model/Qwen3-VL-4B-Instruct"}
HIDDEN_SUFFIX = ".rlsim-hidden"
# Fixed dates make the checkout's SHAs reproducible for identical sources.
GIT_DATE = "2026-10-26T09:00:00+00:00"


# ----------------------------------------------------------------------------------------------------
# Small helpers
def _root(state: Path) -> Path:
    return Path(state).resolve() / "node"


def _write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (readers on the node never see a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def _node_python() -> str:
    """The interpreter for the node's bin/ scripts: the system python3 (stdlib only) if present."""
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def _load_curves() -> ModuleType:
    """The checkout's curves.py, loaded by path: baselines and the replay trainer share one model."""
    spec = importlib.util.spec_from_file_location("rlsim_curves", CHECKOUT_SRC / "xtuner_sim" / "curves.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


# ----------------------------------------------------------------------------------------------------
# Layout: share (models, data, baselines), bin, sim.json
def _build_share(root: Path) -> None:
    """Create placeholder models, datasets and baseline trackers; never re-create a path a fault hides."""
    hidden = {h for f in _read_json(root / "faults.json", {}).values() for h in f.get("hidden", [])}

    def visible(rel: str) -> bool:
        return rel not in hidden and not (root / (rel + HIDDEN_SUFFIX)).exists()

    for rel, mtype in MODELS.items():
        d = root / "share" / "model" / rel
        if not visible(f"share/model/{rel}") or (d / "config.json").exists():
            continue
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({
            "_comment": "SIMULATED placeholder (rl-verify simulator): no weights", "model_type": mtype,
            "architectures": ["Qwen3ForCausalLM" if mtype == "qwen3" else "Qwen3VLForConditionalGeneration"]}))
        (d / "tokenizer_config.json").write_text('{"_comment": "SIMULATED placeholder"}\n')
        (d / "model.safetensors.index.json").write_text('{"metadata": {"simulated": true}, "weight_map": {}}\n')

    data = root / "share" / "data"
    gsm = data / "gsm8k"
    if visible("share/data/gsm8k/train-mini.jsonl") and not (gsm / "train-mini.jsonl").exists():
        gsm.mkdir(parents=True, exist_ok=True)
        # 1000 prompts: 3 epochs x (1000 // 64) = 45 RL steps, as the runbook requires
        (gsm / "train-mini.jsonl").write_text("".join(
            json.dumps({"question": f"SIMULATED gsm8k prompt {i}: {i} + {i % 7} = ?",
                        "answer": f"{i} + {i % 7} = {i + i % 7}\n#### {i + i % 7}"}) + "\n" for i in range(1000)))
    if visible("share/data/gsm8k/test.jsonl") and not (gsm / "test.jsonl").exists():
        gsm.mkdir(parents=True, exist_ok=True)
        (gsm / "test.jsonl").write_text("".join(
            json.dumps({"question": f"SIMULATED gsm8k test {i}: 2 * {i} = ?", "answer": f"#### {2 * i}"}) + "\n"
            for i in range(200)))
    opd = data / "on_policy_distillation"
    for split, n in (("train", 1024), ("eval", 256)):
        rel = f"share/data/on_policy_distillation/gsm8k_geo3k_{split}.json"
        if visible(rel) and not (root / rel).exists():
            opd.mkdir(parents=True, exist_ok=True)
            items = [{"data_source": "gsm8k" if i % 2 == 0 else "geo3k",
                      "prompt": f"SIMULATED {split} item {i}", "answer": str(i)} for i in range(n)]
            (root / rel).write_text(json.dumps(items))

    curves = _load_curves()
    base = root / "share" / "baseline"
    if visible("share/baseline/" + GRPO_BASELINE):
        p = base / GRPO_BASELINE
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in grpo_baseline_rows(curves)))
    if visible("share/baseline/" + OPD_BASELINE):
        p = base / OPD_BASELINE
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in opd_baseline_rows(curves)))


def grpo_baseline_rows(curves: ModuleType) -> list[dict[str, float]]:
    """The GRPO baseline: 45 step-summary rows; eval/accuracy only on the final step (0.9007)."""
    noise = curves.Noise("grpo-baseline")
    rows = []
    for step in range(1, curves.GRPO_STEPS + 1):
        row = {"step": step, **curves.grpo_summary(step, noise, baseline=True)}
        if step == curves.GRPO_STEPS:
            row["eval/accuracy"] = curves.GRPO_FINAL_EVAL
        rows.append(row)
    return rows


def opd_baseline_rows(curves: ModuleType, steps: int = 25) -> list[dict[str, float]]:
    """An OPD baseline tracker around the golden table (step-0 eval row + 25 step-summary rows)."""
    noise = curves.Noise("opd-baseline")
    rows = [{"step": 0, **curves.opd_eval(0, noise, baseline=True)}]
    for step in range(1, steps + 1):
        row = {"step": step, **curves.opd_summary(step, noise, baseline=True)}
        if step % curves.OPD_EVAL_EVERY == 0:
            row.update(curves.opd_eval(step, noise, baseline=True))
        rows.append(row)
    return rows


def _build_bin(root: Path) -> None:
    """Install the fake `ray` and `nvidia-smi` with the system python3 as interpreter."""
    b = root / "bin"
    b.mkdir(parents=True, exist_ok=True)
    shebang = f"#!{_node_python()}\n"
    for src in BIN_SRC.iterdir():
        if src.is_file():
            text = src.read_text()
            if text.startswith("#!"):
                text = text.split("\n", 1)[1]
            dst = b / src.name
            dst.write_text(shebang + text)
            dst.chmod(0o755)


# ----------------------------------------------------------------------------------------------------
# The simulated XTuner checkout (a real git repo with healthy and regression commits)
def _source_files() -> dict[str, Path]:
    """Checkout-relative path -> source file (overlay never overrides xtuner_checkout)."""
    files: dict[str, Path] = {}
    for base in (OVERLAY_SRC, CHECKOUT_SRC):  # later wins: xtuner_checkout is authoritative
        if not base.exists():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                files[p.relative_to(base).as_posix()] = p
    return files


def _fingerprint(files: dict[str, Path]) -> str:
    h = hashlib.sha256(b"rlsim-checkout-v1")
    h.update(json.dumps(REGRESSION_BRANCHES, sort_keys=True).encode())
    for rel, p in sorted(files.items()):
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0" + str(os.access(p, os.X_OK)).encode())
    return h.hexdigest()


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_DATE=GIT_DATE, GIT_COMMITTER_DATE=GIT_DATE,
               GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return _run(["git", *args], cwd=repo, env=env).strip()


def build_checkout(root: Path) -> dict[str, str]:
    """Create (or rebuild when the simulator's sources changed) ROOT/xtuner; return name -> SHA.

    Commits on main: "initial", then "feature" (the healthy tip, key "good"); one branch per
    regression, each a single commit on top of main changing xtuner_sim/behaviour.json.
    The checker double under simulator/xtuner_checkout/autotest/ is included whenever present;
    a later change of any source file changes the fingerprint and rebuilds the checkout.
    """
    repo = root / "xtuner"
    files = _source_files()
    fp = _fingerprint(files)
    stamp = root / "state" / "checkout.json"
    known = _read_json(stamp, {})
    if known.get("fingerprint") == fp and (repo / ".git").exists():
        return known["commits"]
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "rl-verify simulator")
    _git(repo, "config", "user.email", "simulator@rl-verify.invalid")
    _git(repo, "config", "commit.gpgsign", "false")
    for rel, src in files.items():
        dst = repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    behaviour = repo / "xtuner_sim" / "behaviour.json"

    def set_behaviour(regression: str | None, note: str) -> None:
        behaviour.write_text(json.dumps({"regression": regression, "note": note}, indent=2) + "\n")

    set_behaviour(None, "healthy")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "initial: simulated XTuner checkout (rl-verify simulator)")
    commits = {"initial": _git(repo, "rev-parse", "HEAD")}
    (repo / "CHANGELOG.md").write_text("# Changelog (SIMULATED)\n\n- feature: faster rollout batching "
                                       "(no accuracy effect)\n")
    set_behaviour(None, "healthy: feature commit, no accuracy effect")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "feature: faster rollout batching (no accuracy effect)")
    commits["good"] = _git(repo, "rev-parse", "HEAD")
    for key, (branch, regression, message) in REGRESSION_BRANCHES.items():
        _git(repo, "checkout", "-q", "-b", branch, "main")
        set_behaviour(regression, _load_curves().REGRESSIONS[regression])
        _git(repo, "commit", "-q", "-am", message)
        commits[key] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    _write_json(stamp, {"fingerprint": fp, "commits": commits})
    return commits


# ----------------------------------------------------------------------------------------------------
# sshd
def _ensure_keys(state: Path) -> tuple[Path, Path, str]:
    keys = state / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    keys.chmod(0o700)
    host, client = keys / "ssh_host_ed25519_key", keys / "client_ed25519"
    for key, comment in ((host, "rlsim-host"), (client, "rlsim-client")):
        if not key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    (keys / "authorized_keys").write_text((client.with_suffix(".pub")).read_text())
    host_pub = " ".join(host.with_name(host.name + ".pub").read_text().split()[:2])
    return host, client, host_pub


def _write_sshd_config(state: Path, root: Path, port: int, host_key: Path) -> Path:
    path_value = f"{root / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    cfg = state / "sshd_config"
    cfg.write_text("\n".join([
        "# sshd of the rl-verify SIMULATED GPU node (generated by simulator.node; do not edit)",
        f"ListenAddress 127.0.0.1:{port}",
        f"HostKey {host_key}",
        f"PidFile {state / 'sshd.pid'}",
        f"AuthorizedKeysFile {state / 'keys' / 'authorized_keys'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "PrintMotd no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
        # Node bin/ first (fake ray, nvidia-smi) and the node marker every simulated process inherits.
        f'SetEnv PATH="{path_value}" RLSIM_NODE="{root}"',
        # Airflow tasks, tests and the triggerer open many short sessions at once.
        "MaxStartups 200:30:400",
        "MaxSessions 100",
        "LogLevel INFO",
        "",
    ]))
    return cfg


def _sshd_pid(state: Path) -> int | None:
    try:
        pid = int((state / "sshd.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def _configured_port(state: Path) -> int:
    for line in (state / "sshd_config").read_text().splitlines():
        if line.startswith("ListenAddress "):
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"no ListenAddress in {state / 'sshd_config'}")


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd did not accept connections on 127.0.0.1:{port} within {timeout}s")


def start_node(state: Path, step_seconds: float = 1.0, port: int | None = None) -> dict[str, Any]:
    """Build the node under ``state`` (idempotent), start its sshd, write and return node.json.

    Promises: on return sshd accepts SSH on 127.0.0.1:<port> with the pinned host key, the client key
    logs in as the current user, and node.json is complete. If this node's sshd already runs, it is
    reused (settings such as step_seconds are updated).
    """
    if not SSHD.exists():
        raise RuntimeError(f"{SSHD} is missing: run scripts/ensure_sshd.sh (installs Debian's openssh-server)")
    state = Path(state).resolve()
    root = _root(state)
    for d in (root / "state", root / "share", root / "bin"):
        d.mkdir(parents=True, exist_ok=True)
    sim = _read_json(root / "sim.json", {})
    sim.update({"step_seconds": float(step_seconds), "flush_steps": sim.get("flush_steps", 3.0),
                "gpus": sim.get("gpus", 8), "simulated": True})
    _write_json(root / "sim.json", sim)
    if not (root / "faults.json").exists():
        _write_json(root / "faults.json", {})
    _build_bin(root)
    _build_share(root)
    commits = build_checkout(root)
    host_key, client_key, host_pub = _ensure_keys(state)

    old = _read_json(state / "node.json", {})
    pid = _sshd_pid(state)
    if pid is None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
        for attempt in range(5):
            chosen = port or _free_port()
            cfg = _write_sshd_config(state, root, chosen, host_key)
            _run([str(SSHD), "-t", "-f", str(cfg)])
            # sshd daemonises itself (new session, own pid file); its log goes to STATE/sshd.log.
            subprocess.run([str(SSHD), "-f", str(cfg), "-E", str(state / "sshd.log")], check=True,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, stdin=subprocess.DEVNULL)
            try:
                _wait_port(chosen, 10)
                break
            except RuntimeError:
                if port or attempt == 4:
                    raise
        port = chosen
    else:
        port = int(old.get("port") or _configured_port(state))

    root_s = str(root)
    node = {
        "host": "127.0.0.1",
        "port": port,
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "host_key": host_pub,
        "client_key": str(client_key),
        "root": root_s,
        "checkout": str(root / "xtuner"),
        "env": {
            "CI_SHARE_MODEL": f"{root_s}/share/model",
            "CI_SHARE_DATA": f"{root_s}/share/data",
            "CI_SHARE_BASELINE": f"{root_s}/share/baseline",
        },
        "commits": commits,
        "refs": {"initial": "main~1", "good": "main",
                 **{k: v[0] for k, v in REGRESSION_BRANCHES.items()}},
        "step_seconds": float(step_seconds),
        "simulated": True,
    }
    _write_json(state / "node.json", node)
    return node


# ----------------------------------------------------------------------------------------------------
# Processes of a node
def _proc_has_env(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def node_processes(state: Path) -> list[tuple[int, str]]:
    """Every live process carrying ``RLSIM_NODE=<this node's root>`` (except the caller): (pid, cmdline).

    That is every process started through the node's SSH sessions: shells, launch scripts, trainers,
    teachers and fake Ray daemons. An empty list means nothing of the node is left running.
    """
    marker = f"RLSIM_NODE={_root(state)}".encode()
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        pid = int(d.name)
        if _proc_has_env(pid, marker) and not _is_zombie(pid):
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            out.append((pid, cmd))
    return sorted(out)


def ray_running(state: Path) -> bool:
    """True when a fake Ray daemon of this node is alive."""
    return any("rlsim-ray-" in cmd for _, cmd in node_processes(state))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_all(pids: list[int], grace: float = 2.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if _pid_alive(p)]
        if not pids:
            return


def kill_node_processes(state: Path) -> list[tuple[int, str]]:
    """Kill every simulated process of the node (TERM, then KILL); return what was found."""
    found = node_processes(state)
    _kill_all([p for p, _ in found])
    # A launch script may have spawned more between the scan and the kill: sweep again.
    again = node_processes(state)
    _kill_all([p for p, _ in again])
    return found + again


def stop_node(state: Path) -> None:
    """Stop the node's sshd (and its open sessions) and kill every simulated process of the node.

    Promises: afterwards ``node_processes(state)`` is empty and the port is closed. Files stay.
    """
    state = Path(state).resolve()
    pid = _sshd_pid(state)
    if pid is not None:
        sessions = _descendants(pid)
        _kill_all([pid])
        _kill_all(sessions)
    (state / "sshd.pid").unlink(missing_ok=True)
    kill_node_processes(state)
    (_root(state) / "state" / "ray_head.pid").unlink(missing_ok=True)


def _is_sshd(pid: int) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("sshd")
    except OSError:
        return False


def sshd_down(state: Path) -> list[int]:
    """Take the node's SSH service down like an outage: stop sshd and drop its established sessions.

    Only sshd processes die: the listener and the per-connection sshd processes below it, so every
    open SSH connection breaks. Every simulated process - trainers, launch scripts, teachers, Ray,
    even a command a session was running - keeps running. Until ``sshd_up`` the port refuses
    connections. Returns the sshd pids that were stopped (empty when sshd was not running).
    """
    state = Path(state).resolve()
    listener = _sshd_pid(state)
    stopped: list[int] = []
    if listener is not None:
        # Freeze the listener so it forks no new session while its sessions are collected.
        os.kill(listener, signal.SIGSTOP)
        sessions = [p for p in _descendants(listener) if _is_sshd(p)]
        os.kill(listener, signal.SIGKILL)
        _kill_all([listener])
        _kill_all(sessions, grace=1.0)
        stopped = [listener, *sessions]
    (state / "sshd.pid").unlink(missing_ok=True)
    return stopped


def sshd_up(state: Path, timeout: float = 10) -> dict[str, Any]:
    """Start the node's sshd again: same sshd_config, so the same port and the same host/client keys.

    A no-op when it is already running. Returns node.json; on return sshd accepts connections.
    """
    state = Path(state).resolve()
    cfg = state / "sshd_config"
    if not cfg.exists():
        raise RuntimeError(f"{cfg} missing: start the node with start_node first")
    port = _configured_port(state)
    if _sshd_pid(state) is None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        while True:
            # The old listener's socket may linger for a moment: retry until the port is free.
            res = subprocess.run([str(SSHD), "-f", str(cfg), "-E", str(state / "sshd.log")],
                                 env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True)
            try:
                _wait_port(port, 2)
                break
            except RuntimeError:
                time.sleep(0.2)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not come back on 127.0.0.1:{port} (exit {res.returncode}): "
                                       f"{res.stderr.strip()}") from None
    _wait_port(port, timeout)
    return _read_json(state / "node.json", {})


def node_status(state: Path) -> dict[str, Any]:
    """node.json plus liveness: sshd pid, faults, simulated processes."""
    state = Path(state).resolve()
    return {
        "node": _read_json(state / "node.json", None),
        "sshd_pid": _sshd_pid(state),
        "faults": _read_json(_root(state) / "faults.json", {}),
        "processes": node_processes(state),
        "ray_running": ray_running(state),
    }


# ----------------------------------------------------------------------------------------------------
# Faults
def set_fault(state: Path, suite: str, kind: str, at_step: int | None = None,
              path: str | None = None, **extra: Any) -> dict[str, Any]:
    """Switch one fault on for ``suite`` (replacing any previous fault of that suite); return it.

    Kinds: crash / hang / nan (at ``at_step``, default 3), truncated, slow (``factor``, default 3),
    missing-input (renames ``path`` - relative to ROOT, default the suite's main model - to
    ``<path>.rlsim-hidden`` until ``clear_faults``). Read by the replay trainer at launch.
    """
    if suite not in ("grpo", "opd"):
        raise ValueError(f"unknown suite {suite!r} (grpo|opd)")
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r} ({'|'.join(FAULT_KINDS)})")
    root = _root(state)
    _clear_suite(root, suite)
    fault: dict[str, Any] = {"kind": kind, **extra}
    if kind in ("crash", "hang", "nan"):
        fault["at_step"] = int(at_step if at_step is not None else 3)
    elif at_step is not None:
        fault["at_step"] = int(at_step)
    if kind == "missing-input":
        rel = (path or DEFAULT_MISSING[suite]).strip("/")
        target = root / rel
        if not target.exists():
            raise FileNotFoundError(f"nothing to hide at {target}")
        os.replace(target, root / (rel + HIDDEN_SUFFIX))
        fault["hidden"] = [rel]
    faults = _read_json(root / "faults.json", {})
    faults[suite] = fault
    _write_json(root / "faults.json", faults)
    return fault


def _clear_suite(root: Path, suite: str) -> None:
    faults = _read_json(root / "faults.json", {})
    for rel in (faults.get(suite) or {}).get("hidden", []):
        hidden = root / (rel + HIDDEN_SUFFIX)
        if hidden.exists() and not (root / rel).exists():
            os.replace(hidden, root / rel)
    faults.pop(suite, None)
    _write_json(root / "faults.json", faults)


def clear_faults(state: Path, suite: str | None = None) -> None:
    """Switch off the faults of ``suite`` (or of all suites), restoring any hidden input."""
    root = _root(state)
    for s in ([suite] if suite else list(_read_json(root / "faults.json", {}))):
        _clear_suite(root, s)


# ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.node",
                                description="The rl-verify SIMULATED GPU node (real sshd, no GPU).")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="build the node (idempotent), start sshd, print node.json")
    s.add_argument("--state", required=True, type=Path)
    s.add_argument("--port", type=int)
    s.add_argument("--step-seconds", type=float, default=1.0)
    for name, hlp in (("stop", "stop sshd and kill every simulated process"), ("status", "print status")):
        sub.add_parser(name, help=hlp).add_argument("--state", required=True, type=Path)
    f = sub.add_parser("fault", help="switch a fault on for one suite")
    f.add_argument("--state", required=True, type=Path)
    f.add_argument("--suite", required=True, choices=["grpo", "opd"])
    f.add_argument("--kind", required=True, choices=FAULT_KINDS)
    f.add_argument("--at-step", type=int)
    f.add_argument("--path", help="missing-input: path relative to the node root to hide")
    f.add_argument("--factor", type=float, help="slow: step-time factor (default 3)")
    f.add_argument("--metric", help="nan: metric set to NaN (default mismatch / distillation KL)")
    c = sub.add_parser("clear-faults", help="switch faults off (restores hidden inputs)")
    c.add_argument("--state", required=True, type=Path)
    c.add_argument("--suite", choices=["grpo", "opd"])
    a = p.parse_args(argv)

    if a.cmd == "start":
        print(json.dumps(start_node(a.state, step_seconds=a.step_seconds, port=a.port), indent=2))
    elif a.cmd == "stop":
        stop_node(a.state)
        print(f"stopped node {a.state}")
    elif a.cmd == "status":
        print(json.dumps(node_status(a.state), indent=2))
    elif a.cmd == "fault":
        extra = {k: v for k, v in (("factor", a.factor), ("metric", a.metric)) if v is not None}
        print(json.dumps(set_fault(a.state, a.suite, a.kind, a.at_step, path=a.path, **extra)))
    elif a.cmd == "clear-faults":
        clear_faults(a.state, a.suite)
        print("faults cleared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
