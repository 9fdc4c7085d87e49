#!/usr/bin/env python3
"""SIMULATED rollout-teacher HTTP server (rl-verify simulator): no model is loaded.

``teacher_server.py --rlsim-teacher NAME --model DIR --port-file F --pid-file P``
binds 127.0.0.1 on a free port, writes the port and its pid, and answers
``GET /health`` (200 JSON) and ``POST /v1/logprobs`` (fake per-token logprobs) until killed.
A model directory without config.json makes it exit 1 at start, like a failed model load.
Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rlsim-teacher", dest="name", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--pid-file", required=True)
    a = p.parse_args()
    if not (Path(a.model) / "config.json").is_file():
        print(f"OSError: {a.model} is not a model directory (config.json missing)", file=sys.stderr)
        return 1

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok", "teacher": a.name, "model": a.model, "simulated": True})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(n) or b"{}")
            tokens = req.get("tokens") or [0]
            self._send(200, {"teacher": a.name, "logprobs": [-0.35 for _ in tokens]})

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stderr.write(f"[teacher {a.name}] " + fmt % args + "\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(a.pid_file).write_text(f"{os.getpid()}\n")
    # Whole or absent, never half-written: the launch script takes a non-empty port file for "listening".
    staged = Path(f"{a.port_file}.tmp")
    staged.write_text(f"{server.server_address[1]}\n")
    staged.replace(a.port_file)
    print(f"[teacher {a.name}] SIMULATED teacher serving {a.model} on port {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
