"""A suite spec's path rules and bitwise lane, as data (issue 33): defaults when absent, every bad value refused
naming the file, the field and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import rl_verify
from rl_verify.core import paths
from rl_verify.suites.spec import LANE_EXCLUDE, SpecError, spec_from_dict

SUITES = Path(rl_verify.__file__).parent / "suites"
LANE = {"env": {"XTUNER_DETERMINISTIC": "true", "XTUNER_USE_FA3": "0", "NCCL_ALGO": "Ring"}, "steps": 6,
        "disabled_by": ["xtuner/v1/ray/rollout/lmdeploy*/**"]}


def _opd(**change):
    return spec_from_dict({**json.loads((SUITES / "opd.json").read_text()), **change}, "/x/opd.json")


def test_a_spec_without_path_rules_or_lane_gets_the_conservative_defaults_and_no_lane():
    raw = json.loads((SUITES / "opd.json").read_text())
    for field in ("bitwise", "affects", "unaffecting", "affects_source"):
        raw.pop(field)
    spec = spec_from_dict(raw, "/x/opd.json")
    assert (spec.affects, spec.unaffecting, spec.bitwise) == (paths.DEFAULT_AFFECTS, paths.DEFAULT_UNAFFECTING, None)


def test_a_declared_lane_is_read_with_its_default_excludes_and_package_list():
    lane = _opd(bitwise=LANE).bitwise
    assert lane.steps == 6 and lane.env["NCCL_ALGO"] == "Ring" and lane.exclude == LANE_EXCLUDE
    assert "torch" in lane.packages and "sglang" in lane.packages


def test_the_shipped_suites_declare_a_lane_of_three_deterministic_steps_on_the_sglang_backend():
    for name in ("grpo", "opd"):
        lane = spec_from_dict(json.loads((SUITES / f"{name}.json").read_text()), f"/x/{name}.json").bitwise
        assert lane is not None and lane.steps == 3 and lane.env["XTUNER_DETERMINISTIC"] == "true"
        backend = (lane.env["XTUNER_USE_SGLANG"], lane.env["XTUNER_USE_LMDEPLOY"], lane.env["XTUNER_USE_FA3"])
        assert backend == ("1", "0", "0")
    grpo = spec_from_dict(json.loads((SUITES / "grpo.json").read_text()), "/x/grpo.json")
    assert grpo.bitwise.args[1] == "sglang" and grpo.launch.args[1] == "lmdeploy"


def test_the_spec_model_leaves_the_experiment_fingerprint_to_the_file_as_written():
    raw = json.loads((SUITES / "opd.json").read_text())
    assert _opd().raw == raw  # the defaults are not written into it: existing fingerprints stay


@pytest.mark.parametrize(("change", "said"), [
    ({"affects": ["/xtuner/**"]}, "affects: '/xtuner/**' must be relative to the checkout's root"),
    ({"unaffecting": [""]}, "unaffecting: '' is empty"),
    ({"bitwise": {**LANE, "steps": 1}}, "bitwise.steps: Input should be greater than or equal to 2"),
    ({"bitwise": {**LANE, "steps": 26}}, "bitwise.steps 26 is more than the run's expected_steps 25"),
    ({"bitwise": {**LANE, "env": {}}}, "bitwise.env"),
    ({"bitwise": {**LANE, "disabled_by": ["../x"]}}, "bitwise.disabled_by: '../x' has a '.' or '..' folder"),
    ({"bitwise": {**LANE, "packages": ["torch; rm -rf /"]}}, "are not package names"),
    ({"bitwise": {**LANE, "kernels": "fast"}}, "bitwise.kernels: Extra inputs are not permitted"),
])
def test_a_bad_path_rule_or_lane_is_refused_naming_the_file_and_the_field(change, said):
    with pytest.raises(SpecError, match=r"/x/opd\.json") as err:
        _opd(**change)
    assert re.search(re.escape(said), str(err.value)), str(err.value)


#: What XTuner's own deterministic recipe exports (examples/v1/scripts/run_rl_deterministic.sh, InternLM/xtuner main
#: at b934f46, 2026-08-21; xtuner-contract.md "Deterministic mode"): the facts the shipped lanes must follow.
XTUNER_DETERMINISTIC_RECIPE = {
    "XTUNER_USE_SGLANG": "1",  # the only rollout with a deterministic mode
    "XTUNER_USE_LMDEPLOY": "0",
    "XTUNER_USE_VLLM": "0",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0",
    "XTUNER_DETERMINISTIC": "true",
    "XTUNER_USE_FA3": "0",  # FA3 kernels are not batch-invariant
}


def test_the_shipped_lanes_set_every_switch_of_xtuners_deterministic_recipe():
    for name in ("grpo", "opd"):
        lane = spec_from_dict(json.loads((SUITES / f"{name}.json").read_text()), f"/x/{name}.json").bitwise
        side_by_side = {k: (v, lane.env.get(k)) for k, v in XTUNER_DETERMINISTIC_RECIPE.items()}
        assert {k: pair for k, pair in side_by_side.items() if pair[0] != pair[1]} == {}, name
        assert "run_rl_deterministic.sh" in lane.source
