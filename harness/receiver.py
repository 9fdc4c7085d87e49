"""A small HTTP receiver on 127.0.0.1 that records what notifications it got (Apprise ``json://``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Records every POSTed JSON body; ``url`` is the Apprise URL that posts here."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    data = json.loads(body or b"{}")
                except ValueError:
                    data = {"raw": body.decode(errors="replace")}
                with receiver._lock:
                    receiver.messages.append({"path": self.path, **data})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self._server.server_port}/hook"

    def connection_env(self, conn_id: str = "rl_verify_notify") -> dict[str, str]:
        """``AIRFLOW_CONN_<ID>`` of an Apprise connection that posts here."""
        conn = {"conn_type": "apprise", "extra": {"config": {"path": self.url}}}
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}

    def start(self) -> "Receiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, predicate, timeout: float = 120) -> list[dict[str, Any]]:
        """The messages once ``predicate(messages)`` holds; AssertionError with what came otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                got = list(self.messages)
            if predicate(got):
                return got
            time.sleep(0.2)
        raise AssertionError(f"notifications never matched; received: {json.dumps(self.messages)[:3000]}")
