"""The suites layer: the spec model (``spec``), the JSON specs and their data files (``data/``), and the
experiment card built from them (``card``). Imports ``core`` and ``settings`` only."""
