"""The node's environment (issue 33): read in check_prerequisites' round trip (GPU, driver, CUDA, the launch
interpreter's packages), fingerprinted, and said in one line on the report."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from importlib import metadata

import pytest

from rl_verify.core import bitwise
from rl_verify.core.report import ReportMeta, build_report, environment_line, render_markdown
from rl_verify.engines import load_suite
from rl_verify.node import ops, remote
from rl_verify.suites.spec import LANE_PACKAGES, BitwiseLane

#: What the script prints on an H200 node (lines of sh/prerequisites.sh).
H200 = "ENV\tgpu\tNVIDIA H200\nENV\tgpu_count\t8\nENV\tdriver\t580.159.04\nENV\tcuda\t13.0\n" \
       "PKG\ttorch\t2.8.0\nPKG\tsglang\t-\n"


def test_the_environment_lines_are_read_into_facts():
    env = ops.parse_prerequisites(H200).environment
    assert env == {"gpu": "NVIDIA H200", "gpu_count": 8, "driver": "580.159.04", "cuda": "13.0",
                   "packages": {"torch": "2.8.0", "sglang": None}}


def test_a_node_without_nvidia_smi_says_nothing_it_cannot_know():
    env = ops.parse_prerequisites("ENV\tgpu\t\nENV\tgpu_count\t0\nENV\tdriver\t\nENV\tcuda\t\n").environment
    assert env == {"gpu": None, "gpu_count": 0, "driver": None, "cuda": None}
    assert ops.parse_prerequisites("ENV\tkernel\t6.1\n").environment == {}  # only the facts it knows


def test_the_fingerprint_changes_with_the_driver_or_a_package_and_the_line_says_everything():
    env = ops.parse_prerequisites(H200).environment
    upgraded = ops.parse_prerequisites(H200.replace("580.159.04", "580.200.01")).environment
    other_torch = ops.parse_prerequisites(H200.replace("2.8.0", "2.9.0")).environment
    assert len({bitwise.fingerprint(e) for e in (env, upgraded, other_torch)}) == 3
    line = environment_line({**env, "fingerprint": bitwise.fingerprint(env)})
    assert line == (f"NVIDIA H200 x8, driver 580.159.04, CUDA 13.0, torch 2.8.0, sglang - "
                    f"(fingerprint {bitwise.fingerprint(env)})")


def test_the_report_carries_each_nodes_environment():
    env = {**ops.parse_prerequisites(H200).environment, "fingerprint": "0123456789abcdef"}
    meta = ReportMeta(commit="a" * 40, environment={"rl_gpu_node": env})
    assert build_report([], meta)["environment"] == {"rl_gpu_node": env}
    assert "- environment rl_gpu_node: `NVIDIA H200 x8, driver 580.159.04" in render_markdown([], meta)


def test_the_packages_asked_for_are_each_lanes_or_the_default_list_once():
    assert ops.environment_packages([load_suite("grpo"), load_suite("opd")]) == list(LANE_PACKAGES)
    lane = {"env": {"XTUNER_DETERMINISTIC": "true"}, "steps": 3, "packages": ["torch", "deep_ep"]}
    spec = load_suite("opd").model_copy(update={"bitwise": BitwiseLane(**lane)})
    assert ops.environment_packages([spec, load_suite("grpo")])[:2] == ["torch", "deep_ep"]


def test_the_script_reads_a_fake_nvidia_smi_and_the_interpreters_packages(tmp_path):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n  --query-gpu=name,driver_version) "
                    "printf 'NVIDIA H200, 580.159.04\\nNVIDIA H200, 580.159.04\\n';;\n"
                    "  *) echo '| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |';;\nesac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    python = tmp_path / "bin" / "launchpy"  # the launch interpreter by the name a spec gives it
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    needs = ops.NodeNeeds(python="launchpy")
    script = remote.prerequisites_script([], str(tmp_path / "runs"), "k", needs=needs,
                                         env_packages=["pydantic", "surely_not_installed_pkg"])
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True, env=env).stdout
    seen = ops.parse_prerequisites(out).environment
    assert seen == {"gpu": "NVIDIA H200", "gpu_count": 2, "driver": "580.159.04", "cuda": "13.0",
                    "packages": {"pydantic": metadata.version("pydantic"), "surely_not_installed_pkg": None}}


def test_a_builds_local_version_tag_is_kept_as_torch_writes_it_in_its_version_file(tmp_path):
    # torch's wheel metadata says 2.11.0; its torch/version.py says 2.11.0+cu130 (seen on the H200): the CUDA
    # build is part of the environment.
    site = tmp_path / "site"
    (site / "fakecuda-2.11.0.dist-info").mkdir(parents=True)
    (site / "fakecuda-2.11.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fakecuda\n"
                                                                 "Version: 2.11.0\n")
    (site / "fakecuda").mkdir()
    (site / "fakecuda" / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda = '13.0'\n")
    script = remote.prerequisites_script([], str(tmp_path / "runs"), "k", needs=ops.NodeNeeds(python="python3"),
                                         env_packages=["fakecuda"])
    env = {**os.environ, "PYTHONPATH": str(site), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True, env=env).stdout
    assert ops.parse_prerequisites(out).environment["packages"] == {"fakecuda": "2.11.0+cu130"}


@pytest.mark.parametrize("bad", ["torch; id", "$(id)", "", "-rf", "a b"])
def test_a_package_name_that_could_reach_the_shell_is_refused(bad):
    with pytest.raises(remote.BadInput, match="package name"):
        remote.prerequisites_script([], "/runs", "k", env_packages=[bad])


def test_a_real_h200s_environment_reads_in_one_line_with_its_cuda_build():
    import json
    from pathlib import Path

    real = json.loads((Path(__file__).parents[1] / "data" / "nvidia_smi" / "environment.h200.json").read_text())
    line = environment_line({**real, "fingerprint": bitwise.fingerprint(real)})
    assert line.startswith("NVIDIA H200 x1, driver 580.159.04, CUDA 13.0, ") and "torch 2.11.0+cu130" in line
    assert "sglang -" in line  # not installed on that machine: said, not hidden


def test_the_launchs_own_busy_check_does_not_read_the_environment(tmp_path):
    script = remote.prerequisites_script([], str(tmp_path / "runs"), "k", own_suite="opd")
    out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True).stdout
    assert not [line for line in out.splitlines() if line.startswith(("ENV\t", "PKG\t"))], out
    read = remote.prerequisites_script([], str(tmp_path / "runs"), "k", env_packages=[])
    out = subprocess.run(["bash", "-s"], input=read, text=True, capture_output=True).stdout
    assert [line.split("\t")[1] for line in out.splitlines() if line.startswith("ENV\t")] == list(
        ops.ENVIRONMENT_FACTS)
