"""A suite's path rules as the shortcut decision takes them (``core.lane.Rules``), from its spec: one place, so that
the DAG, ``rl-verify shortcut`` and the benches judge with the same rules."""

from __future__ import annotations

from rl_verify.core import lane
from rl_verify.suites.spec import SuiteSpec

_CHECKOUT = "${CHECKOUT}/"


def read_by_the_training(spec: SuiteSpec) -> list[str]:
    """The checkout files a suite's training and verdict read whatever executed-code evidence says (issue 44): its
    launch script and the spec's checkout inputs (config, checker): a config can be read without running a line."""
    return list(dict.fromkeys([spec.launch.script] + [i.path[len(_CHECKOUT):] for i in spec.inputs
                                                       if i.path.startswith(_CHECKOUT)]))


def rules_of(spec: SuiteSpec, with_lane: bool = True) -> lane.Rules:
    """The suite's rules: ``affects``/``unaffecting``, its lane's ``disabled_by`` (None: no lane, or ``with_lane``
    off: the caller decides PASS (unchanged) only) and the files its training reads whatever runs."""
    return lane.Rules(spec.affects, spec.unaffecting,
                      spec.bitwise.disabled_by if with_lane and spec.bitwise else None, read_by_the_training(spec))
