"""Issue 53 item 6, evidence for every suite bounded to the lane's steps: a suite whose config file fixes its step count
(GRPO: XTuner's config passes ``rollout_steps = 45`` to its trainer) declares ``evidence.stop_config``, and the lane's
evidence run is given a config, written on the node, that runs the suite's config as XTuner's CLI runs one and then
sets the trainer's step count to k - 1; the lane's own jobs and fingerprint are untouched."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

import rl_verify
from rl_verify.engines import load_suite
from rl_verify.node import evidence_scripts, remote
from rl_verify.orchestration import bitwise_lane
from rl_verify.suites.spec import SpecError, spec_from_dict

SUITES = Path(rl_verify.__file__).parent / "suites"
SIM_CONFIG = Path(__file__).resolve().parents[2] / "simulator/xtuner_overlay/autotest/config/rl_qwen3_gsm8k_grpo.py"
STOP = {"arg": 0, "attribute": "trainer.rollout_steps", "value": "${LANE_LAST_STEP}"}
CONFIG = '''\
import os
from types import SimpleNamespace

rollout_steps = 45
_private = "kept"
here = os.path.basename(__file__)


class TrainerConfig(SimpleNamespace):
    pass


trainer = TrainerConfig(rollout_steps=rollout_steps, evaluate_step=15, seed=123)
'''


def _grpo(**evidence):
    raw = json.loads((SUITES / "grpo.json").read_text())
    return spec_from_dict({**raw, "evidence": {**raw["evidence"], **evidence}}, "/x/grpo.json")


def _from_file(path: Path) -> dict:
    """A config as XTuner's CLI reads one (xtuner-contract: the module executed, its names without a leading __)."""
    spec = importlib.util.spec_from_file_location(str(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {k: v for k, v in vars(module).items() if not k.startswith("__")}


def test_grpo_declares_its_configs_step_count_and_only_the_evidence_run_is_given_another_config():
    grpo, opd = load_suite("grpo"), load_suite("opd")
    stop = grpo.evidence.stop_config
    assert (stop.arg, stop.attribute, stop.value) == (0, "trainer.rollout_steps", "${LANE_LAST_STEP}")
    assert grpo.bitwise.args[stop.arg] == "autotest/config/rl_qwen3_gsm8k_grpo.py"
    # Steps 0..k-1: the initial eval at step 0, then k - 1 training steps, the trainer's step count.
    assert bitwise_lane.evidence_stop_config(grpo) == (0, "trainer.rollout_steps", grpo.bitwise.steps - 1) == \
        (0, "trainer.rollout_steps", 2)
    assert bitwise_lane.evidence_stop_config(opd) is None and opd.evidence.stop_env  # OPD: its environment
    # The lane's jobs run the suite's config as it is: the lane's config and fingerprint do not know the field.
    assert bitwise_lane.lane_spec(grpo).launch.args == bitwise_lane.evidence_lane_spec(grpo).launch.args
    raw = json.loads((SUITES / "grpo.json").read_text())
    without = spec_from_dict({**raw, "evidence": {k: v for k, v in raw["evidence"].items() if k != "stop_config"}},
                             "/x/grpo.json")
    assert bitwise_lane.lane_fingerprint(without) == bitwise_lane.lane_fingerprint(grpo)
    assert _grpo(stop_config={**STOP, "value": "3"}).evidence.stop_config.resolved(3) == 3


@pytest.mark.parametrize(("stop", "said"), [
    ({**STOP, "arg": 5}, "evidence.stop_config.arg 5 is past the lane's 5 launch argument(s)"),
    ({**STOP, "arg": 1}, "is the lane's launch argument 'sglang', not a .py config file"),
    ({**STOP, "arg": 2}, "not a .py config file relative to the checkout"),  # ${CI_SHARE_MODEL}/Qwen3-8B
    ({**STOP, "attribute": "rollout_steps"}, "evidence.stop_config.attribute"),  # a top-level name: built already
    ({**STOP, "attribute": "trainer.__class__"}, "names a special attribute"),
    ({**STOP, "attribute": "trainer.steps; import os"}, "evidence.stop_config.attribute"),
    ({**STOP, "value": "2; rm -rf /"}, "evidence.stop_config.value"),
    ({**STOP, "value": "${EXPECTED_STEPS}"}, "evidence.stop_config.value"),
    ({**STOP, "value": "0"}, "leaves the evidence run no training step"),
    ({**STOP, "config": "x.py"}, "evidence.stop_config.config: Extra inputs are not permitted"),
])
def test_a_bad_stop_config_is_refused_naming_the_field(stop, said):
    with pytest.raises(SpecError, match=r"/x/grpo\.json") as err:
        _grpo(stop_config=stop)
    assert said in str(err.value), str(err.value)


def test_a_stop_config_needs_a_lane():
    raw = json.loads((SUITES / "grpo.json").read_text())
    raw.pop("bitwise")
    with pytest.raises(SpecError, match="evidence.stop_config needs a bitwise lane"):
        spec_from_dict({**raw, "evidence": {**raw["evidence"], "stop_config": STOP}}, "/x/grpo.json")


def test_the_evidence_runs_config_runs_the_suites_config_then_sets_the_step_count(tmp_path):
    config = tmp_path / "xtuner" / "autotest" / "config" / "rl.py"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    text = evidence_scripts.evidence_config_text(str(config), "trainer.rollout_steps", 2)
    assert text.startswith('"""rl-verify (issue 53)') and f"run_path({str(config)!r})" in text
    assert text.rstrip().endswith("trainer.rollout_steps = 2")
    (tmp_path / "given.py").write_text(text)
    given, real = _from_file(tmp_path / "given.py"), _from_file(config)
    assert set(given) == set(real) == {"os", "SimpleNamespace", "rollout_steps", "_private", "here", "TrainerConfig",
                                       "trainer"}  # the CLI sees the config's names, nothing of the wrapper's
    assert given["trainer"].rollout_steps == 2 and real["trainer"].rollout_steps == 45
    assert vars(given["trainer"]) == {**vars(real["trainer"]), "rollout_steps": 2}
    assert given["here"] == "rl.py" and given["rollout_steps"] == 45  # the config ran as itself (its __file__)
    # The simulated checkout's GRPO config, as its trainer reads it.
    (tmp_path / "sim.py").write_text(evidence_scripts.evidence_config_text(str(SIM_CONFIG), "trainer.rollout_steps", 2))
    assert _from_file(tmp_path / "sim.py")["trainer"].rollout_steps == 2
    assert _from_file(SIM_CONFIG)["trainer"].rollout_steps == 45


def test_a_config_without_the_attribute_fails_the_evidence_run_instead_of_running_in_full(tmp_path):
    config = tmp_path / "rl.py"
    config.write_text("from types import SimpleNamespace\ntrainer = SimpleNamespace(total_train_steps=45)\n")
    (tmp_path / "given.py").write_text(evidence_scripts.evidence_config_text(str(config), "trainer.rollout_steps", 2))
    with pytest.raises(AttributeError, match="trainer has no attribute 'rollout_steps'"):
        _from_file(tmp_path / "given.py")


@pytest.mark.parametrize(("config", "attribute", "value"), [
    ("autotest/config/rl.py", "trainer.rollout_steps", 2),  # relative: the text needs the node's absolute path
    ("/w/rl.yaml", "trainer.rollout_steps", 2),
    ("/w/rl'.py", "trainer.rollout_steps", 2),
    ("/w/rl.py", "trainer.rollout_steps\nimport os", 2),
    ("/w/rl.py", "trainer.__dict__", 2),
    ("/w/rl.py", "trainer.rollout_steps", "2"),
    ("/w/rl.py", "trainer.rollout_steps", True),
    ("/w/rl.py", "trainer.rollout_steps", -1),
])
def test_the_evidence_config_takes_validated_parts_only(config, attribute, value):
    with pytest.raises(remote.BadInput):
        evidence_scripts.evidence_config_text(config, attribute, value)


def test_the_node_script_writes_it_in_the_jobs_evidence_folder_outside_the_worktree(tmp_path):
    worktree, evidence_dir = tmp_path / "run" / "xtuner", tmp_path / "run" / "evidence" / "grpo-ref1"
    (worktree / "autotest" / "config").mkdir(parents=True)
    (worktree / "autotest" / "config" / "rl_qwen3_gsm8k_grpo.py").write_text(CONFIG)
    script = evidence_scripts.evidence_config_script(
        str(evidence_dir), str(worktree), "autotest/config/rl_qwen3_gsm8k_grpo.py", "trainer.rollout_steps", 2)
    done = subprocess.run(["bash"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    written = evidence_dir / "config" / "rl_qwen3_gsm8k_grpo.py"
    assert done.stdout.strip() == f"CONFIG={written}"
    assert written.read_text() == evidence_scripts.evidence_config_text(
        f"{worktree}/autotest/config/rl_qwen3_gsm8k_grpo.py", "trainer.rollout_steps", 2)
    missing = evidence_scripts.evidence_config_script(str(evidence_dir), str(worktree), "autotest/config/gone.py",
                                            "trainer.rollout_steps", 2)
    done = subprocess.run(["bash"], input=missing, text=True, capture_output=True)
    assert done.returncode == 3 and "is not in the worktree" in done.stderr


def _evidence_of(monkeypatch, spec, last_step) -> list[str]:
    reading = {"files": {"a.py": [1]}, "processes": 2, "kinds": {p.kind: [1] for p in spec.evidence.processes},
               "problems": []}
    runs = {f"{spec.name}/evidence-full.json": {**reading, "last_step": spec.expected_steps},
            f"{spec.name}/evidence-lane.json": {**reading, "last_step": last_step}}
    monkeypatch.setattr(bitwise_lane.record, "get_json", lambda run_id, path, dag_id=None: runs.get(path))
    return list(bitwise_lane.evidence_of("run", spec)["problems"])


def test_the_lane_evidence_is_bounded_to_steps_0_to_k_minus_1(monkeypatch):
    grpo = load_suite("grpo")
    assert _evidence_of(monkeypatch, grpo, 2) == []
    (past,) = _evidence_of(monkeypatch, grpo, 10)
    assert past.startswith("the lane's evidence run wrote step 10 before it ended, past the lane's steps 0..2") and \
        "the launch did not end after them as the spec's evidence.stop_config asks" in past
    (none,) = _evidence_of(monkeypatch, grpo, None)
    assert none.startswith("the lane's evidence run wrote no training step")
    bare = grpo.model_copy(update={"evidence": grpo.evidence.model_copy(update={"stop_config": None})})
    (past,) = _evidence_of(monkeypatch, bare, 10)
    assert "the suite's spec does not stop it after them" in past and "evidence.stop_config for one" in past
