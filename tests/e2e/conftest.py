"""Fixtures shared by the end-to-end tests. The rigs themselves stay module-scoped fixtures in each file (each
file its own settings); they are built with ``start_rig`` (see e2e_rigs.py for what every rig shares)."""

from __future__ import annotations

import functools

import pytest

from e2e_rigs import started_rig


@pytest.fixture(scope="session")
def start_rig(tmp_path_factory):
    """``start_rig(name, **settings)``: a context manager giving a started rig in a fresh state folder (see
    :func:`e2e_rigs.started_rig`), stopped and its task logs removed when the block ends."""
    return functools.partial(started_rig, tmp_path_factory)
