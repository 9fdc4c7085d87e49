"""The record store layer: every run's record (``record``, through Airflow's ObjectStoragePath) and the
versioned baselines (``baselines``). Imports engines, suites, core and settings; never the node layer."""
