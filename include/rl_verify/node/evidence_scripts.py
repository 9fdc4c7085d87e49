"""The scripts of executed-code evidence (issues 44, 53), each validated and rendered as ``node.remote`` renders every
script: a job's recording prepared and read, the lane's evidence run's config, and a diff read so that no file is
lost. What they print is read by ``node.ops`` and ``core.evidence``."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable

from rl_verify.node.remote import GLOB_RE, BadInput, render, validate_path, validate_relative, validate_sha


def evidence_setup_script(evidence_dir: str, source: str, python: str = "python3") -> str:
    """Script: one job's executed-code evidence prepared (``sh/evidence_setup.sh``): a sitecustomize.py starting
    coverage.py in every Python process of the job (and in the children multiprocessing forks or spawns) and its
    config measuring ``source``, with coverage.py's subprocess patch where the launch interpreter ``python`` has
    coverage.py 7.10 or later; prints SITE= and CONFIG= (the job's PYTHONPATH entry and COVERAGE_PROCESS_START)."""
    return render("evidence_setup", evidence_dir=validate_path(evidence_dir, "evidence dir"),
                  source=validate_path(source, "worktree"), py=_interpreter(python))


#: A config attribute path the evidence run's config sets (``suites.spec.StopConfig.attribute``).
_ATTRIBUTE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){1,4}")


def evidence_config_text(config: str, attribute: str, value: int) -> str:
    """The config of the lane's executed-code evidence run (issue 53, the spec's ``evidence.stop_config``): it runs
    the suite's config file ``config`` (absolute, on the node) as XTuner's CLI runs a config (the module executed,
    every top-level name not starting with ``__`` kept: its ``trainer`` is the one the CLI builds), then sets
    ``attribute`` (``<top-level name>.<attribute path>``, e.g. ``trainer.rollout_steps``) to ``value``, so that the
    run ends by itself after the lane's steps. A config without that attribute fails the run (no evidence), never
    a silent full-length one."""
    validate_path(config, "evidence config's suite config")
    if not config.startswith("/") or not config.endswith(".py"):
        raise BadInput(f"the suite's config {config!r} must be an absolute .py path on the node")
    if not isinstance(attribute, str) or not _ATTRIBUTE_RE.fullmatch(attribute) \
            or any(part.startswith("__") for part in attribute.split(".")):
        raise BadInput(f"evidence.stop_config.attribute {attribute!r} must be <name>.<attribute>, e.g. "
                       "trainer.rollout_steps")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInput(f"evidence.stop_config's value {value!r} must be a whole number")
    owner, name = attribute.rsplit(".", 1)
    return (f'''"""rl-verify (issue 53): the config of the lane's executed-code evidence run, for that run only. It runs
{config}
as XTuner's CLI runs a config (every top-level name not starting with __ kept), then sets
{attribute} = {value}, so that the run ends by itself after the lane's steps. The lane's own jobs run that config
as it is."""
import runpy as _rl_verify_runpy

globals().update({{_name: _value for _name, _value in _rl_verify_runpy.run_path({config!r}).items()
                  if not _name.startswith("__")}})
del _rl_verify_runpy
if not hasattr({owner}, {name!r}):
    raise AttributeError("rl-verify's evidence config: {owner} has no attribute {name!r} to set (the suite "
                         "spec's evidence.stop_config names what the config does not have)")
{attribute} = {value}
''')


def evidence_config_script(evidence_dir: str, worktree: str, config: str, attribute: str, value: int) -> str:
    """Script: the lane's evidence run's config (:func:`evidence_config_text` over ``config``, relative to the
    ``worktree``) written into the job's evidence folder ``evidence_dir`` (``sh/evidence_config.sh``), under the
    suite's config's own file name; prints CONFIG= (its path, the launch argument in place of ``config``). Exit 3:
    the worktree has no such config."""
    worktree = validate_path(worktree, "worktree")
    rel = validate_relative(config, "the suite's config")
    text = evidence_config_text(f"{worktree}/{rel}", attribute, value)
    return render("evidence_config", evidence_dir=validate_path(evidence_dir, "evidence dir"),
                  config=f"{worktree}/{rel}", name=posixpath.basename(rel), text=text)


def _interpreter(python: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,40}", python or ""):
        raise BadInput(f"launch interpreter {python!r} must be a command name such as python or python3")
    return python


def _process_kinds(processes: Iterable[tuple[str, str]]) -> str:
    """The suite's expected kinds of process as evidence_read.sh's ``kinds`` JSON ([kind, path, qualname] each), every
    part validated (issue 53)."""
    out = []
    for kind, runs in processes:
        path, _, qualname = runs.partition(":")
        if not re.fullmatch(r"[a-z][a-z0-9 _-]{0,39}", kind or ""):
            raise BadInput(f"process kind {kind!r} must be lower-case letters, digits, space, _ or -")
        if not path.endswith(".py") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", qualname):
            raise BadInput(f"process kind {kind!r}: {runs!r} must be <path>.py:<function or Class.method>")
        out.append([kind, validate_relative(path, f"process kind {kind!r}'s file"), qualname])
    return json.dumps(out)


def _package_source(package: str, name: str) -> str:
    """The text of one of the package's modules (a stdlib-only one the node runs as it is)."""
    from importlib.resources import files

    return files(package).joinpath(name).read_text()


def evidence_read_script(evidence_dir: str, source: str, python: str, compiled_re: str, work_dir: str,
                         tracker_glob: str, processes: Iterable[tuple[str, str]] = ()) -> str:
    """Script: the lines of ``source`` every process of one job ran, combined (``sh/evidence_read.sh``), as JSON,
    read with the launch interpreter ``python``, and the last step of the job's tracker; with ``processes`` (the
    suite's expected kinds, (kind, ``path.py:qualname``) each), the pids whose own data file proves each kind."""
    return render("evidence_read", evidence_dir=validate_path(evidence_dir, "evidence dir"),
                  source=validate_path(source, "worktree"), py=_interpreter(python), compiled_re=compiled_re,
                  blocks_py=_package_source("rl_verify.core", "blocks.py"), kinds=_process_kinds(processes),
                  work_dir=validate_path(work_dir, "work dir"),
                  tracker_glob=validate_relative(tracker_glob, "tracker glob", GLOB_RE))


def changed_lines_script(checkout: str, base: str, head: str, python: str = "python3") -> str:
    """Script: the diff's files as git lists them (modes, blobs, status), each file's hunks and whether each changed
    ``.py`` file parses at ``head`` with ``python`` (``sh/changed_lines.sh``; read by ``core.evidence.read_changes``).
    Exit 3: a commit is not in the checkout; 4: no checkout."""
    return render("changed_lines", checkout=validate_path(checkout, "node checkout"),
                  base=validate_sha(base, "base commit"), head=validate_sha(head, "head commit"),
                  py=_interpreter(python))
