"""The simulated node's files: share (models, data, baseline trackers), bin/, and the XTuner checkout
(a real git repo with a healthy main and one commit per simulated regression)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from types import ModuleType

from simulator.common import (
    CHECKOUT_SRC,
    OVERLAY_SRC,
    BIN_SRC,
    MODELS,
    GRPO_BASELINE,
    OPD_BASELINE,
    REGRESSION_BRANCHES,
    DOCS_ONLY_BRANCH,
    DOCS_ONLY_FILES,
    NEUTRAL_CODE_BRANCH,
    NEUTRAL_FOLLOWUP_BRANCH,
    NUMERICS_BRANCH,
    LATE_BRANCH,
    LATE_FOLLOWUP_BRANCH,
    LATE_FROM_STEP,
    RENAME_BRANCH,
    RENAMED_FROM,
    RENAMED_TO,
    CODE_EDITS,
    BISECT_AUTHORS,
    BISECT_BAD_TAG,
    BISECT_BRANCH,
    BISECT_CULPRIT_SUBJECT,
    BISECT_FIX_SUBJECT,
    BISECT_GOOD_TAG,
    BISECT_LAUNCH_FAIL_SUBJECT,
    BISECT_SUBJECTS,
    LAUNCH_HELPER,
    BisectLayout,
    HIDDEN_SUFFIX,
    GIT_DATE,
    _write_json,
    _read_json,
    _run,
    _node_python,
    load_curves,
)


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

    curves = load_curves()
    # The node's noise mode decides what the baselines are (curves.baseline_rows): in the realistic
    # modes one N-run mean of the node's true curve, not the reference curve itself.
    sim = _read_json(root / "sim.json", {})
    mode = curves.check_noise_mode(sim.get("noise", curves.DEFAULT_NOISE))
    seed = str(sim.get("baseline_error_seed", curves.DEFAULT_BASELINE_ERROR_SEED))
    ratio = curves.check_spread_ratio(sim.get("spread_ratio", 1.0))
    rho = curves.check_correlation(sim.get("correlation", 0.0))
    base = root / "share" / "baseline"
    if visible("share/baseline/" + GRPO_BASELINE):
        p = base / GRPO_BASELINE
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in grpo_baseline_rows(curves, mode, seed, ratio, rho)))
    if visible("share/baseline/" + OPD_BASELINE):
        p = base / OPD_BASELINE
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in opd_baseline_rows(curves, mode=mode, seed=seed,
                                                                            spread_ratio=ratio, correlation=rho)))
    # What the baselines were written for: the trainer warns when sim.json was changed behind it.
    (root / "state").mkdir(parents=True, exist_ok=True)
    _write_json(root / "state" / "baseline_noise.json",
                {"noise": mode, "baseline_error_seed": None if mode == "bounded" else seed,
                 **({"correlation": rho} if rho else {})})


def grpo_baseline_rows(curves: ModuleType, mode: str = "bounded", seed: str | None = None,
                       spread_ratio: float = 1.0, correlation: float = 0.0) -> list[dict[str, float]]:
    """The GRPO baseline: 45 step-summary rows; eval/accuracy only on the final step (0.9007).

    ``mode`` is the node's noise mode and ``seed`` its baseline_error_seed (see curves.baseline_rows:
    bounded = the reference curve with small noise, realistic = one 5-run mean of the node's truth);
    ``spread_ratio`` the node's (curves.check_spread_ratio).
    """
    seed = curves.DEFAULT_BASELINE_ERROR_SEED if seed is None else seed
    return curves.baseline_rows("grpo", mode, baseline_error_seed=seed, spread_ratio=spread_ratio,
                                correlation=correlation)


def opd_baseline_rows(curves: ModuleType, steps: int = 25, mode: str = "bounded",
                      seed: str | None = None, spread_ratio: float = 1.0,
                      correlation: float = 0.0) -> list[dict[str, float]]:
    """An OPD baseline tracker around the golden table (step-0 eval row + 25 step-summary rows), exactly
    the golden table at its points; ``mode`` and ``seed`` as for :func:`grpo_baseline_rows` (3-run mean)."""
    seed = curves.DEFAULT_BASELINE_ERROR_SEED if seed is None else seed
    return curves.baseline_rows("opd", mode, steps=steps, baseline_error_seed=seed, spread_ratio=spread_ratio,
                                correlation=correlation)


def _build_bin(root: Path) -> None:
    """Install the fake `ray` and `nvidia-smi` with the system python3 as interpreter, and the node's `pgrep`."""
    b = root / "bin"
    b.mkdir(parents=True, exist_ok=True)
    shebang = f"#!{_node_python()}\n"
    for src in BIN_SRC.iterdir():
        if src.is_file():
            text = src.read_text()
            if text.startswith("#!") and "python" in text.split("\n", 1)[0]:
                text = shebang + text.split("\n", 1)[1]
            dst = b / src.name
            dst.write_text(text)
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


def checkout_files() -> list[str]:
    """The files of the simulated checkout's first commit (checkout-relative paths, sorted): what its tree holds
    before any branch adds or renames one."""
    return sorted(_source_files())


def _fingerprint(files: dict[str, Path], layout: BisectLayout) -> str:
    # v6: the code-edit branches (issue 44); v5: the late regression and the LMDeploy rename branches (issue 42)
    h = hashlib.sha256(b"rlsim-checkout-v6")
    h.update(json.dumps(CODE_EDITS, sort_keys=True).encode())
    h.update(json.dumps(REGRESSION_BRANCHES, sort_keys=True).encode())
    h.update(json.dumps(asdict(layout), sort_keys=True).encode())
    for rel, p in sorted(files.items()):
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0" + str(os.access(p, os.X_OK)).encode())
    return h.hexdigest()


def _git(repo: Path, *args: str, **env_extra: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": GIT_DATE, "GIT_COMMITTER_DATE": GIT_DATE,
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", **env_extra}
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return _run(["git", *args], cwd=repo, env=env).strip()


def build_checkout(root: Path) -> dict[str, str]:
    """Create (or rebuild when the simulator's sources changed) ROOT/xtuner; return name -> SHA.

    Commits on main: "initial", then "feature" (the healthy tip, key "good"); one branch per
    regression, each a single commit on top of main changing xtuner/rlsim/behaviour.json; and the linear
    bisection history after main (:func:`_build_bisect_history`, layout from sim.json ``"bisect"``).
    The checker double under simulator/xtuner_checkout/autotest/ is included whenever present;
    a later change of any source file changes the fingerprint and rebuilds the checkout.
    """
    repo = root / "xtuner"
    files = _source_files()
    layout = BisectLayout.from_sim(_read_json(root / "sim.json", {}))
    fp = _fingerprint(files, layout)
    stamp = root / "state" / "checkout.json"
    known = _read_json(stamp, {})
    if known.get("fingerprint") == fp and (repo / ".git").exists() and "bisect" in known:
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
    behaviour = repo / "xtuner" / "rlsim" / "behaviour.json"

    def set_behaviour(regression: str | None, note: str, **shape: Any) -> None:
        behaviour.write_text(json.dumps({"regression": regression, **shape, "note": note}, indent=2) + "\n")

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
        set_behaviour(regression, load_curves().REGRESSIONS[regression])
        _git(repo, "commit", "-q", "-am", message)
        commits[key] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", DOCS_ONLY_BRANCH, "main")
    for rel in DOCS_ONLY_FILES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"# {Path(rel).stem} (SIMULATED)\n\nHow to run the RL recipes; no code.\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "docs: how to run the RL recipes (simulated docs-only commit)")
    commits["docs-only"] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", NEUTRAL_CODE_BRANCH, "main")
    helper = repo / "xtuner" / "rlsim" / "logging_util.py"
    helper.write_text('"""Log formatting helpers (SIMULATED refactor: no effect on the numbers)."""\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "refactor: move log formatting into a helper (simulated, numerics-neutral)")
    commits["neutral-refactor"] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", NEUTRAL_FOLLOWUP_BRANCH)
    helper.write_text(helper.read_text() + '\n\ndef fmt_step(step):\n    return f"step {step}"\n')
    _git(repo, "commit", "-q", "-am", "refactor: a step formatter for the logs (simulated, numerics-neutral)")
    commits["neutral-followup"] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", NUMERICS_BRANCH, "main")
    set_behaviour(None, "healthy: reordered reduction, other bits, same statistics", numerics="reordered-reduction")
    _git(repo, "commit", "-q", "-am", "perf: fuse the advantage reduction (simulated, numerics change, healthy)")
    commits["numerics-reorder"] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", LATE_BRANCH, "main")
    set_behaviour("init", f"late regression: {load_curves().REGRESSIONS['init']}; from step {LATE_FROM_STEP}",
                  from_step=LATE_FROM_STEP)
    _git(repo, "commit", "-q", "-am", "Warm-up end: switch the LR schedule (simulated regression from step "
         f"{LATE_FROM_STEP}, both suites)")
    commits["regress-late"] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", LATE_FOLLOWUP_BRANCH)
    helper.write_text('"""Log formatting helpers (SIMULATED refactor: no effect on the numbers)."""\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "refactor: move log formatting into a helper (simulated, numerics-neutral, on "
         "top of the late regression)")
    commits["regress-late-followup"] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", RENAME_BRANCH, "main")
    (repo / RENAMED_TO).parent.mkdir(parents=True, exist_ok=True)
    _git(repo, "mv", RENAMED_FROM, RENAMED_TO)
    _git(repo, "commit", "-q", "-m", "rollout: rename the LMDeploy backend module (simulated move, as XTuner's #1544)")
    commits["rename-lmdeploy"] = _git(repo, "rev-parse", "HEAD")
    for key, (branch, rel, (before, after), message) in CODE_EDITS.items():
        _git(repo, "checkout", "-q", "-b", branch, "main")
        text = (repo / rel).read_text()
        assert text.count(before) == 1, (key, rel)
        (repo / rel).write_text(text.replace(before, after))
        _git(repo, "commit", "-q", "-am", message)
        commits[key] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    bisect = _build_bisect_history(repo, commits["good"], layout, set_behaviour)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    _write_json(stamp, {"fingerprint": fp, "commits": commits, "bisect": bisect})
    return commits


def bisect_history(root: Path) -> dict[str, Any]:
    """The bisection history of the checkout built under ROOT (node.json ``"bisect"``; see
    :func:`_build_bisect_history`). Raises RuntimeError when no checkout was built."""
    known = _read_json(Path(root) / "state" / "checkout.json", {})
    if "bisect" not in known:
        raise RuntimeError(f"no simulated checkout built under {root}: start_node first")
    return known["bisect"]


def _build_bisect_history(repo: Path, good: str, layout: BisectLayout, set_behaviour: Any) -> dict[str, Any]:
    """The linear history for bisection: ``layout.commits`` commits on ``BISECT_BRANCH`` after ``good`` (main),
    one author in turn, each dated an hour after its parent; tags ``BISECT_GOOD_TAG`` (good) and
    ``BISECT_BAD_TAG`` (the tip). Returns what tests and the demo assert on: ``good``, ``bad``, ``commits``
    (every SHA oldest first, ``commits[0]`` = good, ``commits[i]`` = position i), ``subjects`` (the same
    order), ``culprit`` / ``culprit_at``, ``launch_fails`` / ``launch_fails_at`` (None / 0 when the layout has
    none), ``healthy`` (positions 0..culprit-1) and the regression (``regression``, ``scale``, ``from_step``,
    ``suite``), ``refs`` (the tag and branch names) and ``layout`` (as given)."""
    _git(repo, "checkout", "-q", "-b", BISECT_BRANCH, good)
    _git(repo, "tag", BISECT_GOOD_TAG, good)
    start = datetime.fromisoformat(GIT_DATE)
    shas, subjects, ordinary = [good], [_git(repo, "log", "-1", "--format=%s", good)], 0
    scripts = ("examples/v1/scripts/run_rl.sh", "recipe/on_policy_distillation/scripts/run_sampled_token_mopd.sh")
    for pos in range(1, layout.commits + 1):
        if pos == layout.culprit:
            subject = BISECT_CULPRIT_SUBJECT
            set_behaviour(layout.regression, f"bisection culprit: {load_curves().REGRESSIONS[layout.regression]}; "
                                             f"x{layout.scale:.3g} from step {layout.from_step}",
                          scale=layout.scale, from_step=layout.from_step)
        elif pos == layout.launch_fails:
            subject = BISECT_LAUNCH_FAIL_SUBJECT
            for rel in scripts:
                script = repo / rel
                text = script.read_text()
                assert "\nset -ex\n" in text, rel
                script.write_text(text.replace(
                    "\nset -ex\n", '\nset -ex\n# shellcheck source=/dev/null\n'
                    f'. "$(dirname "${{BASH_SOURCE[0]}}")/../../../{LAUNCH_HELPER}"\n', 1))
        elif layout.launch_fails and pos == layout.launch_fails + 1:
            subject = BISECT_FIX_SUBJECT
        else:
            subject = BISECT_SUBJECTS[ordinary % len(BISECT_SUBJECTS)]
            if ordinary >= len(BISECT_SUBJECTS):
                subject += f" ({ordinary // len(BISECT_SUBJECTS) + 1})"
            ordinary += 1
        if layout.launch_fails and pos == layout.launch_fails + 1:
            helper = repo / LAUNCH_HELPER
            helper.parent.mkdir(parents=True, exist_ok=True)
            helper.write_text("# Shared launch environment of the XTuner launch scripts (SIMULATED).\n"
                              "export XTUNER_LAUNCH_ENV=1\n")
        with (repo / "CHANGELOG.md").open("a") as log:
            log.write(f"- {subject}\n")
        name, email = BISECT_AUTHORS[(pos - 1) % len(BISECT_AUTHORS)]
        date = (start + timedelta(hours=pos)).isoformat()
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", subject, GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email,
             GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
        shas.append(_git(repo, "rev-parse", "HEAD"))
        subjects.append(subject)
    _git(repo, "tag", BISECT_BAD_TAG, shas[-1])
    _git(repo, "checkout", "-q", "main")
    return {"good": good, "bad": shas[-1], "commits": shas, "subjects": subjects,
            "culprit": shas[layout.culprit], "culprit_at": layout.culprit,
            "launch_fails": shas[layout.launch_fails] if layout.launch_fails else None,
            "launch_fails_at": layout.launch_fails, "healthy": list(range(layout.culprit)),
            "regression": layout.regression, "scale": layout.scale, "from_step": layout.from_step,
            "suite": "grpo" if layout.regression == "mismatch" else "opd" if layout.regression in ("teacher", "rewards")
            else "both", "refs": {"good": BISECT_GOOD_TAG, "bad": BISECT_BAD_TAG, "branch": BISECT_BRANCH},
            "layout": asdict(layout)}

