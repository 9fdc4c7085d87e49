"""Connect arguments for a test stack's SQLite metadata database (``[database] sql_alchemy_connect_args`` names
``CONNECT_ARGS`` by import path): SQLite lets one writer in at a time, and Python's sqlite3 gives up after 5 s
with "database is locked". On two busy cores a scheduler write held the lock longer, and the triggerer died of it
mid-test (its deferred training tasks then never resumed). Waiting up to a minute rides that out."""

CONNECT_ARGS = {"timeout": 60}
