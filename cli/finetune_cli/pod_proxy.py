"""HTTP to a pod through the API server's pod proxy (`pods/NAME:PORT/proxy/...`).

It needs no exec, no port-forward and no route to the pod network: only HTTPS to the API server,
which `ftjob` has anyway, and the RBAC verbs on `pods/proxy` (GET is `get`, PUT `update`, POST
`create`). Requests go through the kubernetes client's own connection pool (its TLS settings,
client certificate and proxy) with its auth headers (bearer tokens, refreshed by exec plugins).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import CliError
from .kube import Cluster
from .upload_receiver import TOKEN_HEADER

# Appends stream for as long as their body lasts; a finish hashes a whole file on the pod's side.
CONNECT_SECONDS, READ_SECONDS = 15.0, 900.0


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]

    @property
    def error(self) -> str:
        """The receiver's own `error`, else the API server's Status message (e.g. the pod does not answer)."""
        return " ".join(str(self.body.get("error") or self.body.get("message") or f"HTTP {self.status}").split())


@dataclass(frozen=True)
class PodProxy:
    cluster: Cluster
    pod: str
    port: int
    token: str  # the receiver's own check (upload_receiver.py), besides RBAC at the API server

    def url(self, endpoint: str, query: dict[str, str]) -> str:
        namespace = urllib.parse.quote(self.cluster.namespace, safe="")
        base = f"{self.cluster.host}/api/v1/namespaces/{namespace}/pods/{self.pod}:{self.port}/proxy/{endpoint}"
        return f"{base}?{urllib.parse.urlencode(query)}" if query else base

    def _headers(self) -> dict[str, str]:
        headers = {TOKEN_HEADER: self.token}
        self.cluster.api.update_params_for_auth(headers, [], ["BearerToken"], None, None, None)
        return headers

    def _send(
        self, method: str, endpoint: str, query: dict[str, str], body: Iterable[bytes] | None, length: int | None
    ) -> Any:
        """One request through the proxy: the urllib3 response, its body read."""
        import urllib3

        headers = self._headers()
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(length or 0)
        try:
            return self.cluster.api.rest_client.pool_manager.request(
                method,
                self.url(endpoint, query),
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS),
                retries=False,
                chunked=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            reason = " ".join(str(getattr(exc, "reason", None) or exc).split())
            raise CliError(f"upload pod {self.pod}: the API server's pod proxy failed: {reason}") from None

    def call(
        self,
        method: str,
        endpoint: str,
        query: dict[str, str] | None = None,
        body: Iterable[bytes] | None = None,
        length: int | None = None,
    ) -> Reply:
        """One request; `body` streams with a known `length`, so the proxy forwards it as it comes."""
        return self._reply(self._send(method, endpoint, query or {}, body, length))

    def read(self, endpoint: str, query: dict[str, str]) -> tuple[Reply, bytes]:
        """A GET whose answer is a file's bytes: (the reply, the bytes) on 200, else (the error, b"")."""
        response = self._send("GET", endpoint, query, None, None)
        if response.status == 200:
            return Reply(200, {}), bytes(response.data)
        return self._reply(response), b""

    def _reply(self, response: Any) -> Reply:
        try:
            parsed = json.loads(response.data or b"{}")
        except ValueError:
            parsed = {"error": response.data.decode(errors="replace")[:200]}
        reply = Reply(response.status, parsed if isinstance(parsed, dict) else {})
        if reply.status in (401, 403) and reply.body.get("kind") == "Status":  # the API server's, not the receiver's
            raise CliError(
                f"forbidden: {reply.error} (ftjob upload, report and compare need get, create, update on "
                f"pods/proxy in namespace {self.cluster.namespace}; the built-in edit role has them)"
            )
        return reply
