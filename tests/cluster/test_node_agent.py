"""Pods on `local-0` really run: as local processes with the pod's volumes, env and ServiceAccount."""

import ipaddress
import json
import textwrap
from typing import Any

import pytest
from kubernetes import client

from hack.cluster.agent.network import POD_NETWORK
from tests.fixtures.cluster import Cluster, pod_of_job, wait_for, wait_job_condition, wait_pod_phase

pytestmark = pytest.mark.cluster

# Runs inside the pod: in-cluster config from the mounted token and KUBERNETES_SERVICE_HOST/PORT.
PATCH_WITH_OWN_TOKEN = textwrap.dedent(
    """
    import os, pathlib
    from kubernetes import client, config
    config.load_incluster_config()
    pathlib.Path("/data/out/hello.txt").write_text(os.environ["GREETING"] + " from " + os.environ["POD_NAME"])
    client.CoreV1Api().patch_namespaced_config_map(
        "report", os.environ["POD_NAMESPACE"], {"data": {"written-by": os.environ["POD_NAME"]}}
    )
    """
)


def cpu_job(name: str, command: list[str], **pod_spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11", "command": command}
    container.update(pod_spec.pop("container", {}))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container], **pod_spec}},
        },
    }


def _claim(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )


def _grant_configmap_patch(rbac: client.RbacAuthorizationV1Api, namespace: str) -> None:
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "report-writer"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "report-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "report-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )


def test_job_without_gpus_runs_its_command_on_local_0(
    cluster: Cluster, core: client.CoreV1Api, batch: client.BatchV1Api, rbac: client.RbacAuthorizationV1Api,
    namespace: str,
) -> None:  # fmt: skip
    _claim(core, namespace, "data")
    _grant_configmap_patch(rbac, namespace)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "report"}, "data": {}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "greeting"}, "stringData": {"text": "hello"}})
    job = cpu_job(
        "writer",
        ["python", "-c", PATCH_WITH_OWN_TOKEN],
        container={
            "env": [
                {"name": "GREETING", "valueFrom": {"secretKeyRef": {"name": "greeting", "key": "text"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            ],
            "volumeMounts": [{"name": "data", "mountPath": "/data/out"}],
        },
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    )
    batch.create_namespaced_job(namespace, job)
    wait_job_condition(batch, namespace, "writer", "Complete", timeout=90)
    pod = pod_of_job(core, namespace, "writer")
    assert pod.spec.node_name == "local-0"
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    written = cluster.volume_dir(namespace, "data") / "hello.txt"
    assert written.read_text() == f"hello from {pod.metadata.name}"
    assert core.read_namespaced_config_map("report", namespace).data == {"written-by": pod.metadata.name}


def test_failing_command_ends_failed_with_its_exit_code_and_message(
    core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str
) -> None:
    script = "printf 'InvalidData: line 3 is empty' > /dev/termination-log; exit 11"
    batch.create_namespaced_job(namespace, cpu_job("fails", ["sh", "-c", script]))
    wait_job_condition(batch, namespace, "fails", "Failed", timeout=60)
    pod = pod_of_job(core, namespace, "fails")
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (11, "Error")
    assert terminated.message == "InvalidData: line 3 is empty"


def test_on_failure_restarts_the_container_with_its_volumes(core: client.CoreV1Api, namespace: str) -> None:
    fail_once = "if [ -e /work/tried ]; then exit 0; fi; touch /work/tried; exit 3"
    pod = {
        "metadata": {"name": "retry"},
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sh", "-c", fail_once],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                }
            ],
            "volumes": [{"name": "work", "emptyDir": {}}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    done = wait_pod_phase(core, namespace, "retry", {"Succeeded", "Failed"})
    status = done.status.container_statuses[0]
    assert done.status.phase == "Succeeded"
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 3


def test_pod_logs_come_through_the_api(core: client.CoreV1Api, namespace: str) -> None:
    pod = {
        "metadata": {"name": "talker"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "x", "command": ["sh", "-c", "echo one; echo two >&2"]}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    wait_pod_phase(core, namespace, "talker", {"Succeeded"})
    assert core.read_namespaced_pod_log("talker", namespace).splitlines() == ["one", "two"]
    assert core.read_namespaced_pod_log("talker", namespace, tail_lines=1) == "two\n"


def test_a_hardened_pod_runs_like_the_chart_would_run_it(core: client.CoreV1Api, namespace: str) -> None:
    """runAsUser/readOnlyRootFilesystem as the operator chart sets them: admitted by restricted, and it runs."""
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    hardened = {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = {
        "metadata": {"name": "hardened"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["python", "-c", "import kubernetes; open('/tmp/x', 'w').write('ok')"],
                    "securityContext": hardened,
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    done = wait_pod_phase(core, namespace, "hardened", {"Succeeded", "Failed"})
    assert done.status.phase == "Succeeded", done.status.container_statuses[0].state.terminated.message


def test_config_files_env_and_paths_are_what_a_pod_sees(
    cluster: Cluster, core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "cfg"}, "data": {"config.json": '{"a": 1}', "mode": "fast"}}
    )
    _claim(core, namespace, "out")
    checks = " && ".join(
        [
            'test "$(cat /etc/finetune/config.json)" = \'{"a": 1}\'',
            'test "$MODE" = fast',
            'test "$FROM_ENV" = "mode-fast"',
            "test -s /var/run/secrets/kubernetes.io/serviceaccount/token",
            "test -s /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            f'test "$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)" = {namespace}',
            'test "$KUBERNETES_SERVICE_PORT" = ' + str(cluster.state.ports.apiserver),
            'test -f "$KUBECONFIG"',
            "touch /dev/shm/x",
            "! touch /etc/finetune/nope 2>/dev/null",
            "echo ok > /mnt/output/marker",
            "command -v python | grep -q /bin/python",
        ]
    )
    pod = {
        "metadata": {"name": "paths"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sh", "-c", checks],
                    "env": [
                        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                        {"name": "FROM_ENV", "value": "mode-$(MODE)"},
                    ],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/finetune", "readOnly": True},
                        {"name": "shm", "mountPath": "/dev/shm"},
                        {"name": "out", "mountPath": "/mnt/output"},
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "config",
                    "configMap": {"name": "cfg", "items": [{"key": "config.json", "path": "config.json"}]},
                },
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
                {"name": "out", "persistentVolumeClaim": {"claimName": "out"}},
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    done = wait_pod_phase(core, namespace, "paths", {"Succeeded", "Failed"}, timeout=60)
    terminated = done.status.container_statuses[0].state.terminated
    assert done.status.phase == "Succeeded", terminated.message
    assert (cluster.volume_dir(namespace, "out") / "marker").read_text() == "ok\n"


def test_deleting_a_pod_sends_sigterm_then_removes_it(cluster: Cluster, core: client.CoreV1Api, namespace: str) -> None:
    _claim(core, namespace, "out")
    script = "trap 'echo term > /out/signal; exit 0' TERM; echo started > /out/signal; while true; do sleep 0.1; done"
    pod = {
        "metadata": {"name": "sleeper"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {"name": "main", "image": "x", "command": ["sh", "-c", script],
                 "volumeMounts": [{"name": "out", "mountPath": "/out"}]}
            ],
            "volumes": [{"name": "out", "persistentVolumeClaim": {"claimName": "out"}}],
        },
    }  # fmt: skip
    core.create_namespaced_pod(namespace, pod)
    wait_pod_phase(core, namespace, "sleeper", {"Running"})
    signal_file = cluster.volume_dir(namespace, "out") / "signal"
    wait_for(lambda: signal_file.exists() and signal_file.read_text() == "started\n", 30, "the command to start")
    core.delete_namespaced_pod("sleeper", namespace)
    wait_for(lambda: not core.list_namespaced_pod(namespace, field_selector="metadata.name=sleeper").items, 30,
             "the pod to be removed")  # fmt: skip
    assert signal_file.read_text() == "term\n"


def test_several_pods_run_at_once_on_local_0(core: client.CoreV1Api, namespace: str) -> None:
    for index in range(3):
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": f"p{index}"},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "x", "command": ["sleep", "3"]}],
                },
            },
        )
    for index in range(3):
        wait_pod_phase(core, namespace, f"p{index}", {"Succeeded"}, timeout=60)
    # At once means their runs overlap: the last to start started no later than the first to
    # finish finished (one after another, the third would start 3 s or more after the first
    # finish). Read from the pods' own start and finish times (whole seconds), so a slow machine
    # cannot fail it.
    runs = []
    for index in range(3):
        pod = core.read_namespaced_pod(f"p{index}", namespace)
        terminated = pod.status.container_statuses[0].state.terminated
        runs.append((terminated.started_at, terminated.finished_at))
    assert max(start for start, _ in runs) <= min(finish for _, finish in runs), runs


def test_a_pod_without_command_fails_with_a_clear_message(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "nocmd"},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]},
        },
    )
    pod = wait_pod_phase(core, namespace, "nocmd", {"Failed"}, timeout=30)
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.reason == "StartError"
    assert "must set `command`" in terminated.message


# Runs in both pods of an Indexed Job: pod 0 listens, pod 1 finds it by name and says who it is.
PAIR = textwrap.dedent(
    """
    import json, os, socket, time
    port, index = int(os.environ["PORT"]), int(os.environ["JOB_COMPLETION_INDEX"])
    me = socket.gethostbyname(os.environ["HOSTNAME"] + ".pair")
    if index == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(1)
        server.settimeout(90)
        said = server.accept()[0].recv(200).decode()
    else:
        deadline = time.monotonic() + 90
        while True:
            try:
                peer = socket.create_connection(("pair-0.pair", port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        peer.sendall(f"{os.environ['HOSTNAME']} {me}".encode())
        said = ""
    result = {"me": me, "podIP": os.environ["POD_IP"], "said": said}
    open("/dev/termination-log", "w").write(json.dumps(result))
    """
)


def test_pods_of_two_nodes_have_their_own_addresses_and_find_each_other_by_name(
    core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str
) -> None:
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "pair"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "pair"},
                "ports": [{"name": "talk", "port": 29555}],
            },
        },
    )
    job = cpu_job(
        "pair",
        ["python", "-c", PAIR],
        subdomain="pair",
        tolerations=[{"key": "finetune.dev/local-node", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "pair"}}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        },
        nodeSelector={"finetune.dev/node-agent": "true"},
        container={
            "env": [
                {"name": "PORT", "value": "29555"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ]
        },
    )
    job["spec"].update(completionMode="Indexed", completions=2, parallelism=2)
    job["spec"]["template"]["metadata"] = {"labels": {"app": "pair"}}
    batch.create_namespaced_job(namespace, job)
    wait_job_condition(batch, namespace, "pair", "Complete", timeout=120)
    pods = sorted(
        core.list_namespaced_pod(namespace, label_selector="job-name=pair").items,
        key=lambda p: p.metadata.annotations["batch.kubernetes.io/job-completion-index"],
    )
    assert {p.spec.node_name for p in pods} == {"local-0", "local-1"}
    results = [json.loads(p.status.container_statuses[0].state.terminated.message) for p in pods]
    addresses = [p.status.pod_ip for p in pods]
    assert len(set(addresses)) == 2
    # Routable, unlike 127.x: the API server's pod proxy refuses loopback pod addresses.
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network(POD_NETWORK) for a in addresses)
    # Each resolves its own name to its own address, and that address is what status.podIP says.
    assert [r["me"] for r in results] == [r["podIP"] for r in results] == addresses
    # Pod 0 heard from pod 1, which found it as pair-0.pair.
    assert results[0]["said"] == f"pair-1 {addresses[1]}"
