"""The local Airflow stack and simulated-node rig used by ``make demo`` and the tests.

``airflow_stack`` starts a real local Airflow (api-server, scheduler, triggerer, dag-processor) and talks to
it through the official ``apache-airflow-client``; ``rig`` wires it to the simulated GPU node the way a
deployment is wired. Development tooling only: not shipped with the DAG package (include/, dags/, plugins/).
"""
