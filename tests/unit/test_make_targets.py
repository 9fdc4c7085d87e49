"""Every documented `make` target takes its variables unset, empty or bad without a traceback.

The Makefile passes each variable to its script whether it was given or not
(``STEP_SECONDS=$(call q,$(STEP_SECONDS))``), so an unset one arrives as an empty string: that must
mean "the default" (``make demo-distributed`` without STEP_SECONDS once ended in ``ValueError: could
not convert string to float: ''``), and a bad value must be one line naming the variable and the fix,
exit status 2, nothing started. Nothing here starts Airflow: ``make -n`` prints the command lines,
the scripts' own parsing reads the environment make would give, and the demo scripts'
``--check-args`` prints the settings they would use and stops.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from scripts import demo, demo_bisect, demo_calibration, make_vars

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = REPO / "Makefile"

#: Each documented target and the variables its recipe hands on (the Makefile's header says which).
TARGET_VARS: dict[str, tuple[str, ...]] = {
    "venv": (),
    "test": ("PYTEST_ARGS",),
    "demo": ("COMMIT", "SUITES", "KEEP"),
    "demo-calibration": ("COMMIT", "RUNS", "STEP_SECONDS"),
    "demo-distributed": ("COMMIT", "SEQUENTIAL", "STEP_SECONDS"),
    "demo-bisect": ("NODES", "STEP_SECONDS"),
    "demo-slurm": (),
    "demo-stop": (),
    "gallery": (),
    "bench": (),
    "lint": (),
    "clean": (),
}
ALL_VARS = sorted({v for names in TARGET_VARS.values() for v in names} | {"SUITES", "DISTRIBUTED"})
#: What the scripts use when nothing is given.
DEMO_DEFAULTS = {"commit": "main", "suites": "grpo,opd", "keep": False, "step_seconds": 1.0, "sequential": False}
CALIBRATION_DEFAULTS = {"commit": "main", "runs": 3, "step_seconds": 0.2}
BISECT_DEFAULTS = {"nodes": 2, "step_seconds": 0.1}
SCRIPTS = {"scripts.demo": demo, "scripts.demo_calibration": demo_calibration, "scripts.demo_bisect": demo_bisect}
DEFAULTS = {"scripts.demo": DEMO_DEFAULTS, "scripts.demo_calibration": CALIBRATION_DEFAULTS,
            "scripts.demo_bisect": BISECT_DEFAULTS}


def clean_env() -> dict[str, str]:
    """This process's environment without the make variables, nor what an outer `make test` passes down."""
    drop = set(ALL_VARS) | {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def dry_run(target: str, args: list[str] = (), env: dict[str, str] | None = None) -> list[str]:
    """``make -n TARGET ARGS``: the shell commands make would run (continuation lines joined)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", target, *args], cwd=REPO,
                         env=clean_env() if env is None else env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"make -n {target} {' '.join(args)} failed:\n{out.stderr}"
    return [line.strip() for line in out.stdout.replace("\\\n", " ").splitlines() if line.strip()]


def script_command(lines: list[str]) -> tuple[dict[str, str], str, list[str], str]:
    """(environment assignments, module, its arguments, the line) of the one `.venv/bin/python -m scripts.X` line."""
    found = [line for line in lines if re.search(r"\.venv/bin/python -m scripts\.", line)]
    assert len(found) == 1, lines
    words = shlex.split(found[0])
    env = {}
    while "=" in words[0] and re.fullmatch(r"[A-Z_]+", words[0].split("=", 1)[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[:2] == [".venv/bin/python", "-m"], words
    return env, words[2], words[3:], found[0]


def parse(module: str, argv: list[str], env: dict[str, str]) -> dict:
    """The settings the script would use, read in-process by its own parsing entry."""
    args = SCRIPTS[module].parse_args(argv, env)
    return {k: getattr(args, k) for k in DEFAULTS[module]}


def defaults(module: str) -> dict:
    return DEFAULTS[module]


def check_args(line: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run make's own command line for the script in bash, with ``--check-args`` (nothing is started)."""
    return subprocess.run(["bash", "-c", line + " --check-args"], cwd=REPO, env={**clean_env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=120)


# --- what the README and the Makefile document -------------------------------------------------------------------


def test_the_table_covers_every_documented_target_and_variable():
    header = MAKEFILE.read_text().split("\nSHELL")[0]
    documented = set(re.findall(r"^#\s+make ([a-z-]+)", header, re.M))
    documented |= set(re.findall(r"`make ([a-z][a-z-]*)", (REPO / "README.md").read_text()))
    documented -= {"it"}  # prose ("make it")
    assert documented <= set(TARGET_VARS), f"targets documented but not tested: {documented - set(TARGET_VARS)}"
    assert "demo-distributed" in documented
    variables = set(re.findall(r"^#\s+([A-Z_]+)=", header, re.M))
    assert variables == {v for names in TARGET_VARS.values() for v in names}
    for name in variables:  # each declared, so an unset one is empty, never inherited by accident
        assert re.search(rf"^{name} \?=", MAKEFILE.read_text(), re.M), name
    from rl_verify.orchestration.calibration import MAX_RUNS

    demo_step, calibration_step, runs = (DEMO_DEFAULTS["step_seconds"], CALIBRATION_DEFAULTS["step_seconds"],
                                         CALIBRATION_DEFAULTS["runs"])
    assert f"calibration runs (default {runs}, from 2 to {MAX_RUNS})" in header
    assert f"demo-distributed {demo_step}; demo-calibration {calibration_step};" in header
    assert f"demo-bisect {BISECT_DEFAULTS['step_seconds']})" in header


@pytest.mark.parametrize("target", sorted(TARGET_VARS))
def test_each_recipe_hands_on_exactly_its_documented_variables(target):
    lines = dry_run(target)
    handed = set()
    for line in lines:
        for word in shlex.split(line, comments=False) if "rc=" not in line else []:
            if re.fullmatch(r"[A-Z_]+=.*", word):
                handed.add(word.split("=", 1)[0])
    expected = {v for v in TARGET_VARS[target] if v != "PYTEST_ARGS"}
    assert handed == expected, f"make {target} passes {sorted(handed)}; the table says {sorted(expected)}"


# --- make -n: unset, empty on the command line, empty in the environment ------------------------------------------


def modes(target: str):
    names = TARGET_VARS[target]
    yield "unset", [], clean_env()
    yield "empty on the command line", [f"{n}=" for n in names], clean_env()
    yield "empty in the environment", [], {**clean_env(), **{n: "" for n in names}}


@pytest.mark.parametrize("target", sorted(TARGET_VARS))
def test_make_dry_run_with_variables_unset_and_empty(target):
    for mode, args, env in modes(target):
        lines = dry_run(target, args, env)
        assert lines, (target, mode)
        scripted = [line for line in lines if "-m scripts." in line]
        if target in ("demo", "demo-distributed", "demo-calibration", "demo-bisect"):
            assigned, module, argv, _ = script_command(lines)
            assert assigned == {n: "" for n in TARGET_VARS[target]}, (mode, assigned)
            settings = parse(module, argv, assigned)
            assert settings == defaults(module), (target, mode, settings)
        elif target == "demo-stop":
            _, module, argv, _ = script_command(lines)
            assert module == "scripts.demo" and demo.parse_args(argv, {}).stop
        elif target == "test":
            pytest_line = next(line for line in lines if " -m pytest " in line)
            words = shlex.split(pytest_line.split("||")[0].split(";", 1)[1])
            assert words == [".venv/bin/python", "-m", "pytest", "-q", "-n", "3", "--dist", "loadfile",
                                 "--no-loadscope-reorder", "--durations=25", "tests"], mode
        else:
            assert all("=''" not in line and '=""' not in line for line in scripted), (target, mode)


def test_pytest_args_reach_pytest_as_separate_words():
    lines = dry_run("test", ["PYTEST_ARGS=-k history -x"])
    pytest_line = next(line for line in lines if " -m pytest " in line)
    assert shlex.split(pytest_line.split("||")[0].split(";", 1)[1])[-3:] == ["-k", "history", "-x"]


def test_make_demo_distributed_without_step_seconds_uses_the_default():
    """The README command that crashed: `make demo-distributed`, as written."""
    assigned, module, argv, line = script_command(dry_run("demo-distributed"))
    assert assigned["STEP_SECONDS"] == "" and argv == ["--distributed"]
    out = check_args(line)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {**DEMO_DEFAULTS, "distributed": True}


@pytest.mark.parametrize("target", ["demo", "demo-distributed", "demo-calibration", "demo-bisect"])
def test_make_command_line_runs_with_defaults_in_a_real_shell(target):
    lines = {}  # each distinct command line once (unset and empty give the same one), with the variables empty
    for mode, args, env in modes(target):
        _, module, _, line = script_command(dry_run(target, args, env))
        lines.setdefault(line, mode)
    for line, mode in lines.items():
        out = check_args(line, {n: "" for n in TARGET_VARS[target]})
        assert out.returncode == 0 and "Traceback" not in out.stderr, (mode, out.stderr)
        settings = json.loads(out.stdout.strip().splitlines()[-1])
        assert {k: settings[k] for k in defaults(module)} == defaults(module), (mode, settings)


BAD = [
    ("demo-distributed", "STEP_SECONDS", "abc"),
    ("demo-distributed", "STEP_SECONDS", "-1"),
    ("demo-distributed", "SEQUENTIAL", "maybe"),
    ("demo", "KEEP", "2"),
    ("demo", "COMMIT", 'it\'s "quoted"'),
    ("demo", "COMMIT", "a b"),
    ("demo-calibration", "RUNS", "three"),
    ("demo-calibration", "RUNS", "1"),
    ("demo-calibration", "STEP_SECONDS", "0"),
    ("demo-bisect", "NODES", "3"),
    ("demo-bisect", "STEP_SECONDS", "fast"),
]


@pytest.mark.parametrize("target,name,value", BAD)
def test_a_bad_value_is_one_line_naming_the_variable_and_the_fix(target, name, value):
    assigned, module, argv, line = script_command(dry_run(target, [f"{name}={value}"]))
    assert assigned[name] == value  # make's quoting hands it over verbatim, whatever it holds
    with pytest.raises(make_vars.UsageError) as err:
        SCRIPTS[module].parse_args(argv, assigned)
    message = str(err.value)
    assert message.startswith(f"{name}=") and f"make {target} {name}=" in message and "unset" in message, message
    assert SCRIPTS[module].main(argv, assigned) == 2


@pytest.mark.parametrize("target,name,value", [BAD[0], BAD[4], BAD[6]])
def test_a_bad_value_through_the_shell_exits_2_without_a_traceback(target, name, value):
    _, _, _, line = script_command(dry_run(target, [f"{name}={value}"]))
    out = check_args(line)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stdout == "", out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and f"{name}=" in out.stderr, out.stderr


def test_demo_distributed_refuses_keep():
    with pytest.raises(make_vars.UsageError, match="KEEP=1 is not supported by make demo-distributed"):
        demo.parse_args(["--distributed"], {"KEEP": "1"})


# --- the parsing helpers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"X": ""}, {"X": "  "}])
def test_unset_empty_and_blank_mean_the_default(env):
    assert make_vars.text(env, "X", "d") == "d"
    assert make_vars.flag(env, "X", "demo") is False
    assert make_vars.number(env, "X", 1.5, "demo", "seconds") == 1.5
    assert make_vars.integer(env, "X", 3, "demo", "runs", 2, 20) == 3


def test_given_values_are_read():
    assert make_vars.flag({"KEEP": "1"}, "KEEP", "demo") and make_vars.flag({"KEEP": "yes"}, "KEEP", "demo")
    assert not make_vars.flag({"KEEP": "0"}, "KEEP", "demo") and not make_vars.flag({"KEEP": "off"}, "KEEP", "demo")
    assert make_vars.number({"S": " 0.5 "}, "S", 1.0, "demo", "seconds") == 0.5
    assert make_vars.integer({"RUNS": "5"}, "RUNS", 3, "demo-calibration", "runs", 2, 20) == 5
    assert make_vars.commit({"COMMIT": "sim/regress-teacher"}, "demo") == "sim/regress-teacher"
    assert make_vars.suites({"SUITES": "opd"}, "demo") == ["opd"]


def test_command_line_options_win_over_the_environment():
    args = demo.parse_args(["--commit", "sim/regress-init", "--step-seconds", "0.3", "--keep"],
                           {"COMMIT": "main", "STEP_SECONDS": "", "KEEP": ""})
    assert (args.commit, args.step_seconds, args.keep) == ("sim/regress-init", 0.3, True)
    with pytest.raises(make_vars.UsageError, match="STEP_SECONDS='x'"):
        demo.parse_args(["--step-seconds", "x"], {})
