"""The kubelet's `containerLogs` endpoint, so `kubectl logs` (and the API's pods/log) work for local-0 pods.

The API server proxies pods/log to the node's `daemonEndpoints.kubeletEndpoint`; this serves
`/containerLogs/<namespace>/<pod>/<container>` from the container's log file, with `follow`,
`tailLines` and `limitBytes`. TLS with the cluster's serving certificate (the API server does
not verify kubelet certificates here).
"""

import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..layout import Layout

FOLLOW_POLL_SECONDS = 0.2


def find_log(layout: Layout, namespace: str, pod: str, container: str) -> Path | None:
    """The newest log of that container (pod names repeat across uids)."""
    candidates = list(layout.pods.glob(f"{namespace}_{pod}_*/{container}.log"))
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def tail(data: bytes, lines: int) -> bytes:
    if lines < 0:
        return data
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:]) if lines else b""


def _handler(layout: Layout) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/<namespace>/<pod>/<container> is served")
                return
            query = urllib.parse.parse_qs(url.query)
            path = find_log(layout, parts[1], parts[2], parts[3])
            if path is None:
                self.send_error(404, f"no log for container {parts[3]} of pod {parts[1]}/{parts[2]}")
                return
            follow = query.get("follow", ["false"])[0] == "true"
            limit = int(query.get("limitBytes", ["-1"])[0])
            data = tail(path.read_bytes(), int(query.get("tailLines", ["-1"])[0]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            sent = self._send(data, limit, 0)
            if follow:
                self._follow(path, path.stat().st_size, limit, sent)

        def _send(self, data: bytes, limit: int, sent: int) -> int:
            if limit >= 0:
                data = data[: max(limit - sent, 0)]
            self.wfile.write(data)
            self.wfile.flush()
            return sent + len(data)

        def _follow(self, path: Path, offset: int, limit: int, sent: int) -> None:
            done = path.with_suffix(".exit")
            while limit < 0 or sent < limit:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                if chunk:
                    offset += len(chunk)
                    sent = self._send(chunk, limit, sent)
                elif done.exists():
                    return
                else:
                    time.sleep(FOLLOW_POLL_SECONDS)

    return Handler


def serve(layout: Layout, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(layout))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(layout.pki / "apiserver.crt"), str(layout.pki / "apiserver.key"))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="logs", daemon=True).start()
    return server
