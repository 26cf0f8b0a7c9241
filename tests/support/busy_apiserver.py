"""A busy API server, for real: an HTTPS proxy in front of the local kube-apiserver that answers
503 to the status patches a test picks, until it has refused as many as asked, and forwards
every other request as it came (the caller's own token, so authentication, RBAC and admission
are the real server's).

It serves the API server's own certificate (its names include 127.0.0.1), so a kubeconfig that
trusts the cluster's CA trusts it: only the server's port changes.
"""

import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

# Hop-by-hop headers: they describe one connection, not the request, and are not forwarded.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})
BUSY = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "ServiceUnavailable", "code": 503}


class BusyApiServer:
    """Refuses the first `refuse` status patches whose body `picks` accepts (all when None)."""

    def __init__(self, upstream: str, pki: Path, refuse: float, picks: Callable[[dict[str, Any]], bool] | None = None):
        self.upstream = urlsplit(upstream)
        self.refuse = refuse
        self.picks = picks or (lambda _body: True)
        self.refused = 0
        self.forwarded_patches = 0
        self._lock = threading.Lock()
        self._upstream_tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._server.socket = serving.wrap_socket(self._server.socket, server_side=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, original: Path, path: Path) -> Path:
        """`original` with its server moved to this proxy."""
        config = yaml.safe_load(original.read_text())
        for entry in config["clusters"]:
            entry["cluster"]["server"] = self.url
        path.write_text(yaml.safe_dump(config))
        return path

    def refuses(self, method: str, path: str, body: bytes) -> bool:
        """Whether this request is one to answer 503 (counted as refused)."""
        if method != "PATCH" or not path.split("?", maxsplit=1)[0].endswith("/status"):
            return False
        with self._lock:
            if self.refused < self.refuse and self.picks(json.loads(body or b"{}")):
                self.refused += 1
                return True
            self.forwarded_patches += 1
            return False

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> http.client.HTTPResponse:
        connection = http.client.HTTPSConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, context=self._upstream_tls, timeout=30
        )
        connection.request(method, path, body=body or None, headers=headers)
        return connection.getresponse()

    @contextmanager
    def running(self) -> Iterator["BusyApiServer"]:
        thread = threading.Thread(target=self._server.serve_forever, name="busy-apiserver", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(10)


def _handler(proxy: BusyApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if proxy.refuses(self.command, self.path, body):
                self._answer(503, {"Content-Type": "application/json"}, json.dumps(BUSY).encode())
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
            answer = proxy.forward(self.command, self.path, headers, body)
            kept = {k: v for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}}
            self._answer(answer.status, kept, answer.read())

        def _answer(self, code: int, headers: dict[str, str], payload: bytes) -> None:
            self.send_response(code)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test's assertions say what happened."""

    return Handler
