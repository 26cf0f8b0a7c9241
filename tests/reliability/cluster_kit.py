"""What the reliability scenarios share on the real control plane: operator identities of their
own (so request counts are theirs alone), extra KWOK GPU nodes, a Job watch that timestamps
creations, the API server's per-identity request counter, peak RSS of a process.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from finetune_api.constants import GROUP, PLURAL, VERSION
from hack.cluster.nodes import TESLA_P40, gpu_node
from tests.support.harness import (
    OperatorProcess,
    free_port,
    healthz_ok,
    kubeconfig_for_token,
    leader_role,
    operator_rules,
    service_account_token,
    stop_process_group,
    trainer_identity_of,
    wait_for,
)

IDENTITY_NAMESPACE = "finetune-reliability"
FLOOR_OPERATOR = Path(__file__).with_name("floor_operator.py")
FLOOR_RULES: list[dict[str, Any]] = [
    # kopf keeps its handled-state in annotations of the object: it patches the resource itself.
    {"apiGroups": ["finetune.dev"], "resources": ["finetunejobs"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def _ignore_conflict(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


def identity(
    api: client.ApiClient, admin_kubeconfig: Path, folder: Path, name: str, rules: list[dict[str, Any]]
) -> Path:
    """A ServiceAccount `name` bound to a ClusterRole of `rules`; a kubeconfig with its token."""
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    _ignore_conflict(core.create_namespace, {"metadata": {"name": IDENTITY_NAMESPACE}})
    _ignore_conflict(core.create_namespaced_service_account, IDENTITY_NAMESPACE, {"metadata": {"name": name}})
    role = {"metadata": {"name": f"reliability-{name}"}, "rules": rules}
    try:
        rbac.create_cluster_role(role)
    except ApiException as exc:
        if exc.status != 409:
            raise
        rbac.replace_cluster_role(f"reliability-{name}", role)
    _ignore_conflict(
        rbac.create_cluster_role_binding,
        {
            "metadata": {"name": f"reliability-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"reliability-{name}"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": IDENTITY_NAMESPACE}],
        },
    )
    token = service_account_token(core, IDENTITY_NAMESPACE, name)
    return kubeconfig_for_token(admin_kubeconfig, token, folder / f"{name}.kubeconfig", IDENTITY_NAMESPACE)


def our_identity(api: client.ApiClient, admin_kubeconfig: Path, folder: Path, name: str = "ours") -> Path:
    """Our operator's account, with the chart's rules and its leader-election Role on the Lease
    `lease_of(name)` (leader_env)."""
    path = identity(api, admin_kubeconfig, folder, name, operator_rules())
    leader_role(api, IDENTITY_NAMESPACE, name, lease_of(name))
    return path


def lease_of(account: str) -> str:
    return f"reliability-{account}"


def forget_lease(api: client.ApiClient, account: str) -> None:
    """Remove the account's Lease, so that a run never waits out one a killed run left held."""
    with contextlib.suppress(ApiException):
        client.CoordinationV1Api(api).delete_namespaced_lease(lease_of(account), IDENTITY_NAMESPACE)


def leader_env(account: str) -> dict[str, str]:
    """Run our operator as the chart does, electing itself leader (alone) on its account's Lease:
    the Lease's renewals count among its requests."""
    return {
        "FINETUNE_LEADER_ELECTION": "true",
        "FINETUNE_LEASE_NAMESPACE": IDENTITY_NAMESPACE,
        "FINETUNE_LEASE_NAME": lease_of(account),
    }


def machine(before: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the run shared the machine with, for its record: the CPU count and the load average
    (1, 5, 15 min) now, and at the start when `before` is that start's figures. The development
    machine has two cores and other engineers' test runs; a record says how busy it was."""
    now = {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    if before is None:
        return now
    return {"cpus": now["cpus"], "load_average_start": before["load_average"], "load_average_end": now["load_average"]}


def floor_identity(api: client.ApiClient, admin_kubeconfig: Path, folder: Path) -> Path:
    return identity(api, admin_kubeconfig, folder, "floor", FLOOR_RULES)


# --- counting an identity's API requests: API Priority and Fairness does it per FlowSchema ---


def _flow_schema(api: client.ApiClient, name: str, account: str, precedence: int, verbs: Any, groups: Any) -> str:
    """A FlowSchema matching this ServiceAccount's requests of `verbs` on `groups` (with `["*"]`
    verbs, its non-resource requests too: every request); returns its name for `dispatched()`."""
    rule: dict[str, Any] = {
        "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": IDENTITY_NAMESPACE}}],
        "resourceRules": [
            {"verbs": verbs, "apiGroups": groups, "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
        ],
    }
    if verbs == ["*"]:
        rule["nonResourceRules"] = [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
    body = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": "workload-high"},
            "matchingPrecedence": precedence,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [rule],
        },
    }
    _ignore_conflict(client.FlowcontrolApiserverV1Api(api).create_flow_schema, body)
    return name


def count_requests_of(api: client.ApiClient, account: str) -> str:
    """A FlowSchema that matches only this ServiceAccount; returns its name for `dispatched()`."""
    return _flow_schema(api, f"reliability-count-{account}", account, 500, ["*"], ["*"])


# What the operator writes, by API group: every write it makes but its Lease's.
WRITE_GROUPS = ["", "batch", "finetune.dev", "networking.k8s.io", "rbac.authorization.k8s.io", "events.k8s.io"]
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]


def count_writes_of(api: client.ApiClient, account: str) -> str:
    """A FlowSchema that matches this ServiceAccount's writes of anything but a Lease, ahead of
    `count_requests_of`'s (a request counts in the first schema it matches); its name."""
    return _flow_schema(api, f"reliability-writes-{account}", account, 400, WRITE_VERBS, WRITE_GROUPS)


def apiserver_metrics(api: client.ApiClient) -> str:
    headers = {}
    token = api.configuration.get_api_key_with_prefix("authorization")
    if token:
        headers["Authorization"] = token
    response = api.call_api("GET", f"{api.configuration.host}/metrics", header_params=headers)
    response.read()
    return bytes(response.data).decode()


def dispatched(api: client.ApiClient, flow_schema: str) -> int:
    """Requests the API server has executed for this FlowSchema since it started."""
    total = 0.0
    for line in apiserver_metrics(api).splitlines():
        if (
            line.startswith("apiserver_flowcontrol_dispatched_requests_total{")
            and f'flow_schema="{flow_schema}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


# --- nodes ---------------------------------------------------------------------------------


def add_gpu_nodes(core: client.CoreV1Api, prefix: str, count: int) -> list[str]:
    """Fake P40 nodes (4 GPUs each) that KWOK manages; waits until they are Ready."""
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        _ignore_conflict(core.create_node, gpu_node(name, TESLA_P40, 4))

    def ready() -> bool:
        nodes = {n.metadata.name: n for n in core.list_node(label_selector="type=kwok").items}
        return all(
            name in nodes and any(c.type == "Ready" and c.status == "True" for c in nodes[name].status.conditions or [])
            for name in names
        )

    wait_for(ready, 120, f"{count} KWOK nodes {prefix}-* Ready", interval=1)
    return names


def remove_nodes(core: client.CoreV1Api, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(ApiException):
            core.delete_node(name)


# --- watching Jobs appear ------------------------------------------------------------------


class JobWatch:
    """Timestamps (time.monotonic) of the first sight of each Job in a namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.batch = client.BatchV1Api(api)
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.created_twice: list[str] = []
        # Jobs whose Complete or Failed condition was seen: a count that costs no list of them all.
        self.finished: set[str] = set()
        self._uids: dict[str, str] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "JobWatch":
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        # Plain JSON, never the client's models: building a V1Job per event took 0.67 ms for
        # one of ours (5.7 KB, its trainer config in the pod template) against 0.05 ms for the
        # floor's, in this process, on the thread that stamps the first sight and beside the
        # submitter; a Job's every status change is an event. What is timed is the API server's
        # delivery, not the client library's model for the Job's size.
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listing = self._plain(self.batch.list_namespaced_job(self.namespace, _preload_content=False))
                    version = listing["metadata"]["resourceVersion"]
                    for job in listing["items"]:
                        self._saw(job)
                self._ready.set()
                version = self._watch(version)
            except ApiException as exc:
                if exc.status == 410:
                    version = ""
                else:
                    time.sleep(0.5)
            except Exception:
                time.sleep(0.5)

    @staticmethod
    def _plain(response: Any) -> Any:
        return json.loads(response.data)

    def _watch(self, version: str) -> str:
        """Events from `version` until the server ends the watch (5 s); the last version seen."""
        response = self.batch.list_namespaced_job(
            self.namespace, watch=True, resource_version=version, timeout_seconds=5, _preload_content=False
        )
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                job = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiException(status=job.get("code"), reason=job.get("message"))
                version = job["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._saw(job)
                if self._stop.is_set():
                    break
        finally:
            response.release_conn()
        return version

    def _saw(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        name, uid = meta["name"], meta["uid"]
        conditions = (job.get("status") or {}).get("conditions") or []
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
            self.finished.add(name)
        if name not in self.seen:
            self.seen[name] = time.monotonic()
            self._uids[name] = uid
        elif self._uids[name] != uid:
            self.created_twice.append(name)
            self._uids[name] = uid


class PhaseWatch:
    """The latest status phase of each FineTuneJob in a namespace, from a watch: at thousands of
    jobs a list every few seconds would cost the API server (and this process) more than the
    operator under test."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.phases: dict[str, str] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PhaseWatch":
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def count(self, *phases: str) -> int:
        return sum(1 for phase in list(self.phases.values()) if phase in phases)

    def _list(self) -> str:
        listing = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        for item in listing["items"]:
            self._saw(item)
        version: str = listing["metadata"]["resourceVersion"]
        return version

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                if not version:
                    version = self._list()
                self._ready.set()
                for event in stream.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    resource_version=version,
                    timeout_seconds=5,
                ):
                    item = event["object"]
                    if event["type"] == "ERROR":
                        version = ""
                        break
                    version = item["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._saw(item)
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if exc.status == 410:
                    version = ""
                else:
                    time.sleep(0.5)
            except Exception:
                time.sleep(0.5)

    def _saw(self, item: dict[str, Any]) -> None:
        phase = (item.get("status") or {}).get("phase")
        if phase:
            self.phases[item["metadata"]["name"]] = phase


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU the process has used so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the most resident memory the process ever had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- the floor operator --------------------------------------------------------------------


class FloorOperator:
    """`kopf run floor_operator.py -n NS`: the same process model as ours, no logic beyond a Job."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log = log
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "FloorOperator":
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env.pop(key, None)
        cmd = [
            sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", self.namespace,
            f"--liveness=http://127.0.0.1:{self.port}/healthz", str(FLOOR_OPERATOR),
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_for(self._healthy, 60, f"floor operator healthz; log:\n{self.tail()}")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"floor operator exited {self.proc.returncode}:\n{self.tail()}")
        return healthz_ok(self.port)

    def stop(self) -> None:
        stop_process_group(self.proc)

    def tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


@contextlib.contextmanager
def running(operator: OperatorProcess | FloorOperator) -> Iterator[Any]:
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()


def has_default_sa(core: client.CoreV1Api, namespace: str) -> bool:
    """A new namespace's default ServiceAccount exists (pods are refused until it does)."""
    try:
        core.read_namespaced_service_account("default", namespace)
    except client.ApiException:
        return False
    return True


def load_pvcs(core: client.CoreV1Api, namespace: str) -> None:
    """The claims a load job mounts; bound at once by the local provisioner."""
    for claim in ("models", "datasets", "outputs"):
        _ignore_conflict(
            core.create_namespaced_persistent_volume_claim,
            namespace,
            {
                "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )

    def bound() -> bool:
        claims = core.list_namespaced_persistent_volume_claim(namespace).items
        return len(claims) >= 3 and all(c.status.phase == "Bound" for c in claims)

    wait_for(bound, 60, "load PVCs bound", interval=0.5)


class PodFailer:
    """Makes the KWOK pods of chosen jobs fail with a trainer exit code and termination message.

    KWOK reads `kwok.finetune.dev/exit-code` when it ends a pod (a second after it runs), so the
    annotation is set the moment the pod appears.
    """

    def __init__(self, api: client.ApiClient, namespace: str, jobs: set[str], exit_code: int, message: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.jobs = jobs
        self.annotations = {
            "kwok.finetune.dev/exit-code": str(exit_code),
            "kwok.finetune.dev/message": message,
        }
        self.done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PodFailer":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(
                    self.core.list_namespaced_pod, self.namespace, label_selector="finetune.dev/job", timeout_seconds=5
                ):
                    pod = event["object"]
                    job = (pod.metadata.labels or {}).get("finetune.dev/job")
                    if job in self.jobs and pod.metadata.name not in self.done and event["type"] == "ADDED":
                        with contextlib.suppress(ApiException):
                            self.core.patch_namespaced_pod(
                                pod.metadata.name, self.namespace, {"metadata": {"annotations": self.annotations}}
                            )
                            self.done.add(pod.metadata.name)
                    if self._stop.is_set():
                        break
            except Exception:
                time.sleep(0.3)


class PodAnnotator(PodFailer):
    """Sets other annotations on the pods of chosen jobs the moment they appear, e.g. KWOK's
    `kwok.finetune.dev/run-ms` to keep a pod running (read when the pod starts)."""

    def __init__(self, api: client.ApiClient, namespace: str, jobs: set[str], annotations: dict[str, str]) -> None:
        super().__init__(api, namespace, jobs, 0, "")
        self.annotations = dict(annotations)


def children_of(api: client.ApiClient, namespace: str) -> dict[str, dict[str, int]]:
    """Per job name: how many of each child kind carry its label (kinds a job never owns are
    listed too, so a stray one shows up as a duplicate)."""
    core, batch, rbac = client.CoreV1Api(api), client.BatchV1Api(api), client.RbacAuthorizationV1Api(api)
    listings = {
        "Job": batch.list_namespaced_job,
        "ConfigMap": core.list_namespaced_config_map,
        "ServiceAccount": core.list_namespaced_service_account,
        "Role": rbac.list_namespaced_role,
        "RoleBinding": rbac.list_namespaced_role_binding,
        "PersistentVolumeClaim": core.list_namespaced_persistent_volume_claim,
    }
    counts: dict[str, dict[str, int]] = {}
    for kind, listing in listings.items():
        for item in listing(namespace, label_selector="finetune.dev/job").items:
            job = item.metadata.labels["finetune.dev/job"]
            counts.setdefault(job, {}).setdefault(kind, 0)
            counts[job][kind] += 1
    return counts


def trainer_identities(api: client.ApiClient, namespace: str) -> dict[str, int]:
    """How many of each part of the namespace's shared trainer identity exist (1 each is right)."""
    return {kind: len(names) for kind, names in trainer_identity_of(api, namespace).items()}


LOAD_SPEC: dict[str, Any] = {
    "model": {"source": {"pvc": {"claimName": "models", "path": "tiny"}}},
    "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "a.jsonl"}}, "format": "alpaca"},
    "output": {"pvc": {"claimName": "outputs"}},
    "training": {"maxSteps": 10},
    "resources": {"gpus": 4, "gpuProduct": "Tesla-P40"},
    "backoffLimit": 0,
}
