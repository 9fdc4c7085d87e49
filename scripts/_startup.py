"""The start-up the demos and the DAG bench share: a progress printer, and a rig started in a state folder that an
earlier run of the same script left (its simulated nodes stopped, the folder removed first)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator import node as sim

if TYPE_CHECKING:
    from harness.rig import Rig


def announcer(name: str) -> Callable[[str], None]:
    """A function printing one progress line as ``[name] text``, flushed at once (read while the script runs)."""
    def say(text: str) -> None:
        print(f"[{name}] {text}", flush=True)
    return say


def fresh_rig(state: Path, record_root: Path | None, **rig_args: Any) -> Rig:
    """A rig (not started) in ``state``, once what an earlier run left there is gone: its simulated nodes stopped,
    the folder removed. ``rig_args`` go to :class:`harness.rig.Rig` (``step_seconds``, ``nodes``, ...)."""
    from harness.rig import Rig  # the Airflow client: imported once a script's arguments are known good

    sim.reset_state(state)
    return Rig(state, record_root, **rig_args)


def start_rig(state: Path, record_root: Path | None, say: Callable[[str], None], saying: str,
              extra_env: Mapping[str, str] | None = None, **rig_args: Any) -> Rig:
    """:func:`fresh_rig`, announced with ``say(saying)`` and started with ``extra_env``."""
    rig = fresh_rig(state, record_root, **rig_args)
    say(saying)
    rig.start(extra_env=extra_env)
    return rig
