"""The local Airflow stack and simulated-node rig used by ``make demo`` and the tests.

Development tooling only: not shipped with the DAG package (include/, dags/, plugins/). One module per
concern; an arrow is "imports", and there is no import circle (tests/unit/test_harness.py checks it,
imports inside functions included):

    rig ──> airflow_stack ──> airflow_api          (REST client on the official apache-airflow-client)
     │           ├──────────> celery_hostname      (the Celery workers' hostname callable)
     │           └──────────> processes            (free ports, log tails, process-tree kills)
     ├──> services ─────────> processes            (private PostgreSQL, Redis, SeaweedFS S3)
     └──> airflow_api, processes

- ``airflow_stack``: the lifecycle of a real local Airflow (api-server, scheduler, triggerer,
  dag-processor; LocalExecutor on SQLite or CeleryExecutor with workers) and its CLI.
- ``airflow_api``: ``AirflowClient``, the public REST API as plain data; knows nothing of the stack.
- ``services``: the distributed stack's servers; the stack is given their addresses, never imports them.
- ``rig``: wires a stack to the simulated GPU node(s) the way a deployment is wired.
- ``browser`` (Playwright on Debian's chromium) and ``receiver`` (records notifications): standalone.
"""
