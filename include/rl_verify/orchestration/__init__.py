"""The Airflow glue: the operators and the trigger, the task bodies of each DAG (``verification``,
``calibration``) and what they share (``nodes``), the UI plugin's views, notifications, the cluster
policy, standing approvals and the REST API client. The only layer that imports Airflow beyond
``ObjectStoragePath``."""
