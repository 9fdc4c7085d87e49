"""The node layer: what reaches a GPU node's shell (``remote``: validated, quoted command builders of the
``sh/`` templates), the operations over one SSH connection (``ops``) and where each suite trains
(``placement``). Imports engines, suites, core and settings; never the record store."""
