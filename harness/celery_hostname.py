"""The hostname that the harness's Celery workers record on their task instances.

A leaf that imports only the standard library: Airflow imports ``worker_hostname`` (its
``[core] hostname_callable``) in every task process of a worker, and ``AirflowStack`` imports the
names below to configure each worker.
"""

from __future__ import annotations

import os
import socket

#: The variable through which AirflowStack gives each Celery worker its own hostname.
WORKER_HOSTNAME_ENV = "RL_VERIFY_WORKER_HOSTNAME"


def worker_hostname() -> str:
    """Airflow's ``[core] hostname_callable`` for the harness's Celery workers: the worker's own name from
    $RL_VERIFY_WORKER_HOSTNAME (else the machine's FQDN, Airflow's default), so that the API's task instance
    ``hostname`` tells which of several workers on one machine ran a task."""
    return os.environ.get(WORKER_HOSTNAME_ENV) or socket.getfqdn()


#: The dotted path Airflow is given for ``[core] hostname_callable``.
WORKER_HOSTNAME_CALLABLE = f"{__name__}.{worker_hostname.__name__}"
