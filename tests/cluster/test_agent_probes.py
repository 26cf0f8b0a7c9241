"""The node agent's readiness probes and preStop sleeps (hack/cluster/agent/probes.py), without a
cluster: the probe's address from the pod's and its named port, a verdict that follows a real
local HTTP server, and the pod status a failing probe reports. A ModelServer's pod on the agent
is Ready only once its llama-server answers /health (tests/operator/test_e2e_serving.py)."""

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from hack.cluster.agent.pod_status import Running, pod_status
from hack.cluster.agent.probes import Prober, prestop_sleep, readiness_probe
from hack.llama_cpp import built_tools

CONTAINER: dict[str, Any] = {
    "name": "server",
    "ports": [{"name": "http", "containerPort": 8080}],
    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2, "failureThreshold": 2},
    "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
}


def test_the_probe_asks_the_pods_own_address_on_the_named_port() -> None:
    probe = readiness_probe(CONTAINER, "198.18.0.7")
    assert probe is not None
    assert (probe.url, probe.period_s, probe.failure_threshold) == ("http://198.18.0.7:8080/health", 2.0, 2)
    assert readiness_probe({"name": "trainer"}, "198.18.0.7") is None
    assert prestop_sleep(CONTAINER) == 5.0 and prestop_sleep({"name": "trainer"}) == 0.0


class _Health(BaseHTTPRequestHandler):
    healthy = False

    def do_GET(self) -> None:
        self.send_response(200 if _Health.healthy else 503)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return None


def test_the_verdict_follows_the_server_while_the_container_runs() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    container = {**CONTAINER, "ports": [{"name": "http", "containerPort": server.server_address[1]}]}
    probe = readiness_probe({**container, "readinessProbe": {**CONTAINER["readinessProbe"], "periodSeconds": 1}},
                            "127.0.0.1")  # fmt: skip
    assert probe is not None
    stop = threading.Event()
    prober = Prober({"server": probe}, lambda _name: True, stop)
    prober.start()
    try:
        time.sleep(1.5)
        assert prober.ready == {"server": False}  # loading: 503
        _Health.healthy = True
        deadline = time.monotonic() + 5
        while not prober.ready["server"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert prober.ready == {"server": True}
    finally:
        stop.set()
        server.shutdown()


def test_a_container_whose_probe_fails_is_running_but_not_ready() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [CONTAINER]}, "status": {}}
    running = [Running("2026-01-01T00:00:00Z", 7)]
    status = pod_status(pod, "Running", [], running, start_time="t", probed={"server": False})
    assert status["containerStatuses"][0]["ready"] is False and status["containerStatuses"][0]["started"] is True
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "False"
    ready = pod_status(pod, "Running", [], running, start_time="t", probed={"server": True})
    assert next(c for c in ready["conditions"] if c["type"] == "Ready")["status"] == "True"


def test_the_agent_finds_llama_server_only_where_it_is_built(monkeypatch: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("LLAMA_CPP_TOOLS", str(tmp_path))
    assert built_tools() is None
    for name in ("llama-server", "llama-quantize"):
        (tmp_path / name).write_text("")
    assert built_tools() == tmp_path
