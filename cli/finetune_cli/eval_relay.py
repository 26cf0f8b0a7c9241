"""A relay on 127.0.0.1 between lm-evaluation-harness and a ModelServer.

Why: lm-evaluation-harness's OpenAI-compatible models post with plain HTTP clients (requests,
aiohttp) to one base URL with at most a bearer token. The server is reached, as `ftjob chat`
reaches it, through the API server's service proxy, with whatever the kubeconfig authenticates
with (client certificates, an exec plugin, a token) and its CA, which those clients cannot carry;
and the adapter measured is picked by the request's `lora` field, which lm-evaluation-harness does
not send. So the relay takes each request on loopback, sets `lora` to the adapter of the run in
progress, and posts it through the kubernetes client's connection pool. It listens only on
127.0.0.1, on a port the system picks, for the command's lifetime."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .errors import CliError

Forward = Callable[[str, dict[str, Any]], dict[str, Any]]


class Relay:
    def __init__(self, forward: Forward) -> None:
        self.forward = forward
        self.lora: list[dict[str, Any]] = []  # the run in progress: [] is the base (every adapter at 0)
        self.requests = 0
        self.failure: str | None = None  # the first failure the server or the proxy answered with
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="eval-relay", daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{path}"

    def send(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One request on, with this run's adapter: (status, reply)."""
        with self._lock:
            self.requests += 1
        try:
            return 200, self.forward(path, {**body, "lora": self.lora})
        except CliError as exc:
            with self._lock:
                self.failure = self.failure or str(exc)
            return 502, {"error": {"message": str(exc)}}

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _handler(relay: Relay) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                status, reply = 400, {"error": {"message": "the body is not a JSON object"}}
            else:
                status, reply = relay.send(self.path.lstrip("/"), body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: a request per line on the terminal would bury the table."""

    return Handler
