"""Which GPU node each suite trains on, and the pool that serialises the trainings on each node.

The run's ``node`` param is one Airflow connection id (every suite on that node) or one per suite,
``grpo=node_a,opd=node_b``. Pure functions: the DAG file (pattern), the tasks (validation) and the
scheduler-side cluster policy (``rl_verify.orchestration.policy``: the pool of a run's task) all read it here.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from rl_verify import settings
from rl_verify.node.remote import BadInput

_CONN = r"[A-Za-z0-9_.-]{1,100}"
_PAIR = rf"[A-Za-z0-9_]+={_CONN}"
#: JSON-schema pattern of the ``node`` param (the trigger form refuses anything else).
NODE_PARAM_PATTERN = rf"^(?:{_CONN}|{_PAIR}(?:,{_PAIR})*)(?![\s\S])"
_CONN_RE = re.compile(_CONN)
_UNSAFE_POOL_CHARS = re.compile(r"[^A-Za-z0-9_]")


def node_pool(conn_id: str) -> str:
    """Name of the one-slot pool that serialises trainings on the node of connection ``conn_id``."""
    return "rl_node_" + _UNSAFE_POOL_CHARS.sub("_", conn_id)


def suite_nodes(value: object, suites: Iterable[str]) -> dict[str, str]:
    """``{suite: connection id}`` for the selected ``suites`` (in their order) from the ``node`` param.

    Raises BadInput naming every problem (bad connection id, unknown or unselected suite named,
    selected suite without a node) and the form to use.
    """
    suites = list(suites)
    form = "give one connection id (e.g. rl_gpu_node) or one per suite (e.g. grpo=node_a,opd=node_b)"
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"param 'node' is empty: {form}")
    if "=" not in value:
        if not _CONN_RE.fullmatch(value):
            raise BadInput(f"param 'node' must be an Airflow connection id (letters, digits, _ . -): {value!r}; {form}")
        return {s: value for s in suites}
    problems: list[str] = []
    chosen: dict[str, str] = {}
    for pair in value.split(","):
        suite, _, conn = pair.partition("=")
        suite, conn = suite.strip(), conn.strip()
        if not _CONN_RE.fullmatch(conn):
            problems.append(f"{pair!r}: {conn!r} is not a connection id (letters, digits, _ . -)")
        elif suite in chosen:
            problems.append(f"{suite!r} is given twice")
        elif suite not in suites:
            problems.append(f"{suite!r} is not a selected suite ({', '.join(suites)})")
        else:
            chosen[suite] = conn
    problems += [f"no node for selected suite {s!r}" for s in suites if s not in chosen and not problems]
    if problems:
        raise BadInput(f"param 'node' {value!r}: " + "; ".join(problems) + f"; {form}")
    return {s: chosen[s] for s in suites}


def nodes_in_order(placement: Mapping[str, str]) -> list[str]:
    """The distinct nodes of a placement, in the order of the suites that use them."""
    return list(dict.fromkeys(placement.values()))


def describe(placement: Mapping[str, str]) -> str:
    """``rl_gpu_node`` when one node takes every suite, else ``grpo on node_a, opd on node_b``."""
    nodes = nodes_in_order(placement)
    if len(nodes) == 1:
        return nodes[0]
    return ", ".join(f"{suite} on {conn}" for suite, conn in placement.items())


def task_pool(task_id: str, node_value: object, suites: Iterable[str]) -> str | None:
    """The pool a task of a run must take for the run's ``node`` param, or None to keep the task's own.

    ``run_<suite>`` and its repeats ``run_<suite>-r<k>``: the pool of that suite's node. None for every
    other task (cleanup must run whatever happened, even for a node whose pool does not exist) and for a
    param that does not parse (``resolve_commit`` fails such a run before any training).
    """
    suites = list(suites)
    try:
        placement = suite_nodes(node_value, suites)
    except BadInput:
        return None
    suite = settings.suite_of_training_task(task_id)
    if suite in placement:
        return node_pool(placement[suite])
    return None


#: JSON-schema pattern of the calibration DAG's ``nodes`` param: connection ids separated by commas.
NODE_LIST_PATTERN = rf"^{_CONN}(?:,{_CONN})*(?![\s\S])"


def node_list(value: object) -> list[str]:
    """The calibration DAG's ``nodes`` param (``node_a`` or ``node_a,node_b``) as distinct connection ids;
    BadInput naming every bad id."""
    form = "give one connection id or several separated by commas (e.g. node_a,node_b)"
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"param 'nodes' is empty: {form}")
    ids = [part.strip() for part in value.split(",")]
    bad = [repr(i) for i in ids if not _CONN_RE.fullmatch(i)]
    if bad:
        raise BadInput(f"param 'nodes' {value!r}: {', '.join(bad)} is not a connection id (letters, digits, _ . -); "
                       f"{form}")
    return list(dict.fromkeys(ids))


def calibration_nodes(nodes: list[str], trainings: int) -> list[str]:
    """The node of each of ``trainings`` calibration trainings, in order: round robin over ``nodes``
    (each node trains one at a time, in its pool; several nodes train at the same time)."""
    return [nodes[k % len(nodes)] for k in range(trainings)]
