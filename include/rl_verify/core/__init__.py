"""The core layer: the pure result model, the tracker reader, shapes, thresholds, next steps, live-check
primitives, calibration statistics, plots, the report and the history. No Airflow, no SSH; imports
only ``rl_verify.settings`` below it."""
