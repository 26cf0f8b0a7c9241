"""The chart on the real local control plane: server-side dry run, install, a tiny job,
upgrade, the CRD upgrade path, Pod Security `restricted`, least-privilege RBAC, uninstall.

The operator's pod is bound to node `local-0`, where the test node agent runs its command
(`python -m finetune_operator`) as a local process, so this is the chart's Deployment, env and
ServiceAccount doing the work. Tests in this module share one release and run in file order:
install, use, upgrade, uninstall.
"""

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.fixtures.cluster import Cluster
from tests.reliability.cluster_kit import PodAnnotator
from tests.support.harness import FENCE_POLICY_FILE, free_ports, reported_the_end
from tests.support.helm import ALL_ON_VALUES, CHART, REPO, helm, render

# Serial: it installs and uninstalls a whole release on the shared control plane (tests/conftest.py).
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

LOCAL_NODE = "local-0"
TINY_JOB = REPO / "examples" / "tiny-job.yaml"
CRD_FILE = CHART / "crds" / "finetune.dev_finetunejobs.yaml"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _kubectl_binary() -> str:
    from hack.cluster import binaries

    found = binaries.resolve("kubectl")
    assert found is not None, "kubectl is missing: `make cluster-up` builds it"
    return str(found)


class Kube:
    """kubectl against the test cluster, as the admin or as someone else."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [_kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}{result.stdout}")
        return result

    def get(self, *args: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.run("get", *args, "-o", "json").stdout)
        return data

    def apply(self, objects: list[dict[str, Any]], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", *args, stdin=yaml.safe_dump_all(objects), check=check)

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        self.apply([body])

    def can_i(self, service_account: str, *args: str) -> bool:
        result = self.run("auth", "can-i", f"--as={service_account}", *args, check=False)
        answer = result.stdout.strip()
        # Exit 1 means "no"; anything but yes/no is a broken question, not a denial.
        assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {result.stderr}"
        return answer == "yes"

    def wait_for(self, what: str, predicate: Any, timeout: float, *args: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            result = self.run("get", what, *args, "-o", "json", check=False)
            if result.returncode == 0:
                last = json.loads(result.stdout)
                if predicate(last):
                    return last
            time.sleep(1)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: last seen {json.dumps(last)[-3000:]}")


@pytest.fixture(scope="module")
def kubectl(cluster: Cluster) -> Kube:
    return Kube(cluster.kubeconfig)


def _suffix() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def namespaces(kubectl: Kube) -> Iterator[tuple[str, str]]:
    """(operator namespace, job namespace), both enforcing Pod Security `restricted`."""
    suffix = _suffix()
    operator_ns, job_ns = f"chart-op-{suffix}", f"chart-jobs-{suffix}"
    for name in (operator_ns, job_ns):
        kubectl.namespace(name, RESTRICTED)
    yield operator_ns, job_ns
    for name in (operator_ns, job_ns):
        kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


# --- the API server accepts what the chart renders ------------------------------------------


@pytest.mark.parametrize("all_on", [False, True], ids=["defaults", "all-on"])
def test_rendered_objects_pass_server_side_dry_run(kubectl: Kube, namespaces: tuple[str, str], all_on: bool) -> None:
    operator_ns, job_ns = namespaces
    values = [ALL_ON_VALUES] if all_on else []
    # Never the release's own namespace: the operator writes nothing there (the chart refuses it).
    sets = [f"watch.namespaces={{{job_ns}}}"] if all_on else []
    objects = render(values, sets, namespace=operator_ns)
    # The ServiceMonitor's and PrometheusRule's CRDs belong to the Prometheus Operator: they are
    # dry-run against its CRDs in tests/chart/test_monitoring_crds.py (and promtool checks the
    # rule); Kueue's objects pass Kueue's own admission in tests/operator/test_e2e_kueue.py.
    checked = [
        o
        for o in objects
        if o["kind"] not in ("ServiceMonitor", "PrometheusRule") and not o["apiVersion"].startswith("kueue.x-k8s.io/")
    ]
    result = kubectl.apply(checked, "--dry-run=server", check=False)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == len(checked)


# --- one release, from install to uninstall --------------------------------------------------


def _release_name() -> str:
    return "ftop"


def _deployment_name() -> str:
    return "ftop-finetune-operator"


def _service_account(operator_ns: str) -> str:
    return f"system:serviceaccount:{operator_ns}:{_deployment_name()}"


def _ready_operator_pod(kubectl: Kube, operator_ns: str, timeout: float = 180) -> dict[str, Any]:
    def ready(pods: dict[str, Any]) -> bool:
        live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 1 and any(
            c["type"] == "Ready" and c["status"] == "True" for c in live[0].get("status", {}).get("conditions", [])
        )

    pods = kubectl.wait_for("pods", ready, timeout, "-n", operator_ns, "-l", "app.kubernetes.io/component=operator")
    return next(p for p in pods["items"] if not p["metadata"].get("deletionTimestamp"))


@pytest.fixture(scope="module")
def release(kubectl: Kube, namespaces: tuple[str, str]) -> Iterator[dict[str, Any]]:
    operator_ns, job_ns = namespaces
    health_port, metrics_port = free_ports(2)
    sets = [
        "watch.mode=namespaced",
        f"watch.namespaces={{{job_ns}}}",
        f"nodeSelector.kubernetes\\.io/hostname={LOCAL_NODE}",
        f"health.port={health_port}",
        f"metrics.port={metrics_port}",
        "logFormat=text",
        # The local control plane publishes no EndpointSlice for `kubernetes`: without its address
        # the chart refuses to render.
        "trainer.networkPolicy.apiServerCIDRs={127.0.0.1/32}",
        # Installed as releases before leader election were (one replica, Recreate), so that
        # test_upgrade_from_one_replica_to_two_keeps_every_running_job upgrades from that shape.
        "replicaCount=1",
        "leaderElection.enabled=false",
        # Pods of the node agent share the machine's network: each replica listens on its own address.
        "extraEnv[0].name=FINETUNE_LISTEN_ADDRESS",
        "extraEnv[0].valueFrom.fieldRef.fieldPath=status.podIP",
    ]
    args = ["install", _release_name(), str(CHART), "--namespace", operator_ns, "--wait", "--timeout", "5m"]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, kubeconfig=kubectl.kubeconfig, timeout=400)
    yield {"operator_ns": operator_ns, "job_ns": job_ns, "sets": sets, "install_output": result.stdout}
    helm("uninstall", _release_name(), "--namespace", operator_ns, kubeconfig=kubectl.kubeconfig, check=False)


def test_install_runs_the_operator_on_the_node_agent(kubectl: Kube, release: dict[str, Any]) -> None:
    pod = _ready_operator_pod(kubectl, release["operator_ns"])
    assert pod["spec"]["nodeName"] == LOCAL_NODE
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "finetune_operator"]
    # NOTES.txt tells the user the next command.
    assert "kubectl apply -f job.yaml" in release["install_output"]
    assert f"rollout status deployment/{_deployment_name()}" in release["install_output"]


def test_operator_rbac_is_least_privilege(kubectl: Kube, release: dict[str, Any]) -> None:
    sa, job_ns = _service_account(release["operator_ns"]), release["job_ns"]
    # What it needs, where it watches.
    assert kubectl.can_i(sa, "create", "jobs.batch", "-n", job_ns)
    assert kubectl.can_i(sa, "patch", "finetunejobs.finetune.dev", "--subresource=status", "-n", job_ns)
    assert kubectl.can_i(sa, "watch", "finetunejobs.finetune.dev", "-n", job_ns)
    # Nothing else.
    assert not kubectl.can_i(sa, "get", "secrets", "-n", job_ns)
    assert not kubectl.can_i(sa, "list", "secrets", "--all-namespaces")
    assert not kubectl.can_i(sa, "delete", "nodes")
    assert not kubectl.can_i(sa, "delete", "pods", "-n", job_ns)
    assert not kubectl.can_i(sa, "create", "jobs.batch", "-n", "default")
    assert not kubectl.can_i(sa, "list", "finetunejobs.finetune.dev", "--all-namespaces")


def test_restricted_namespace_rejects_what_breaks_the_profile(kubectl: Kube, release: dict[str, Any]) -> None:
    """The control for the next test: enforcement is really on in these namespaces."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": release["job_ns"]},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]},
    }
    result = kubectl.apply([pod], "--dry-run=server", check=False)
    assert result.returncode != 0 and "violates PodSecurity" in result.stderr


def _prepare_tiny_inputs(kubectl: Kube, job_ns: str) -> None:
    from hack.cluster.layout import Layout

    claims = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": job_ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        for name in ("models", "datasets", "outputs")
    ]
    kubectl.apply(claims)
    for claim in ("models", "datasets", "outputs"):
        kubectl.wait_for(f"pvc/{claim}", lambda c: c.get("status", {}).get("phase") == "Bound", 60, "-n", job_ns)
    layout = Layout.for_repo()
    models, datasets = layout.volume_dir(job_ns, "models"), layout.volume_dir(job_ns, "datasets")
    ftjob = REPO / ".venv" / "bin" / "ftjob"
    subprocess.run(
        [
            str(ftjob),
            "make-tiny-model",
            str(models / "tiny-llama"),
            "--dataset",
            str(datasets / "tiny" / "alpaca.jsonl"),
        ],
        check=True,
        timeout=300,
    )


def _phase(job: dict[str, Any]) -> str | None:
    phase = job.get("status", {}).get("phase")
    return str(phase) if phase is not None else None


def test_tiny_job_succeeds_in_a_restricted_namespace(kubectl: Kube, release: dict[str, Any]) -> None:
    job_ns = release["job_ns"]
    _prepare_tiny_inputs(kubectl, job_ns)
    kubectl.run("apply", "-n", job_ns, "-f", str(TINY_JOB))
    job = kubectl.wait_for("finetunejob/tiny", lambda j: _phase(j) in ("Succeeded", "Failed"), 900, "-n", job_ns)
    assert _phase(job) == "Succeeded", json.dumps(job.get("status"), indent=1)
    # The trainer's last progress comes from its status thread, not with the phase: waited for.
    job = kubectl.wait_for("finetunejob/tiny", lambda j: reported_the_end(j.get("status") or {}), 75, "-n", job_ns)
    # PROGRESS and LOSS read as numbers should: a percentage, and 4 significant digits.
    progress = job["status"]["progress"]
    assert progress["percentText"] == "100.0%" and progress["lossText"] == f"{progress['loss']:.4g}"
    columns = kubectl.run("get", "finetunejob/tiny", "-n", job_ns).stdout.splitlines()
    assert "100.0%" in columns[1].split() and progress["lossText"] in columns[1].split(), columns
    # The trainer's pod was admitted by Pod Security `restricted` and ran as a non-root user.
    pods = kubectl.get("pods", "-n", job_ns, "-l", "finetune.dev/job=tiny")["items"]
    assert pods and all(p["spec"]["securityContext"]["runAsNonRoot"] for p in pods)
    assert kubectl.get("namespace", job_ns)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # The chart's operator did the work (not some other operator that happens to watch too).
    log = kubectl.run("logs", "-n", release["operator_ns"], f"deployment/{_deployment_name()}").stdout
    assert f"{job_ns}/tiny" in log, log[-3000:]
    # ...with the chart's defaults on: its pod is one the namespace's trainer policy (made by the
    # operator, no job's) selects, and not one the Hub jobs' policy (HTTPS) selects; a one-node
    # job has no policy of its own. Its Job and the policies got through the operator fence (the
    # status patches above went through too).
    pod_labels = pods[0]["metadata"]["labels"]

    def selects(policy: dict[str, Any]) -> bool:
        return all(pod_labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())

    policy = kubectl.get("networkpolicy", "finetune-trainers", "-n", job_ns)
    assert selects(policy) and not policy["metadata"].get("ownerReferences"), policy["metadata"]
    assert all(rule.get("ports") != [{"port": 443, "protocol": "TCP"}] for rule in policy["spec"]["egress"]), (
        "every trainer got HTTPS egress"
    )
    hub = kubectl.get("networkpolicy", "finetune-trainers-hub", "-n", job_ns)
    assert not selects(hub), "a job without a Hub source got HTTPS egress"
    names = {p["metadata"]["name"] for p in kubectl.get("networkpolicy", "-n", job_ns)["items"]}
    assert "tiny-network" not in names, names


def test_default_policies_name_this_release_and_the_real_api_server(kubectl: Kube, release: dict[str, Any]) -> None:
    """The trainers' rules reach the API server's addresses only, and the fence is keyed to this
    release's operator account. The local control plane publishes no EndpointSlice for
    `kubernetes` (hack/cluster runs the API server without the endpoint reconciler), so the
    install names the address (apiServerCIDRs); without it the chart would refuse to render."""
    operator_ns, job_ns = release["operator_ns"], release["job_ns"]
    selector = f"app.kubernetes.io/instance={_release_name()}"
    # The chart places no trainer policy: the operator makes them, in whatever namespace a job runs.
    assert not kubectl.get("networkpolicy", "-n", job_ns, "-l", selector)["items"]
    env = {e["name"]: e.get("value") for e in _ready_operator_pod(kubectl, operator_ns)["spec"]["containers"][0]["env"]}
    api = json.loads(env["FINETUNE_TRAINER_NETWORK"])["egress"][0]
    cidrs = {peer["ipBlock"]["cidr"] for peer in api["to"]}
    assert cidrs == {"127.0.0.1/32"}, cidrs
    kubectl.get("networkpolicy", f"{_deployment_name()}-operator", "-n", operator_ns)
    fence = [
        p
        for p in kubectl.get("validatingadmissionpolicy", "-l", selector)["items"]
        if "-fence-" in p["metadata"]["name"]
    ]
    # Every policy of files/operator-fence-policy.yaml, named for this release.
    assert len(fence) == len(yaml.safe_load(FENCE_POLICY_FILE.read_text()))
    for policy in fence:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{_service_account(operator_ns)}'"


def test_upgrade_with_a_changed_value_rolls_the_operator(kubectl: Kube, release: dict[str, Any]) -> None:
    operator_ns = release["operator_ns"]
    before = _ready_operator_pod(kubectl, operator_ns)
    helm(
        "upgrade",
        _release_name(),
        str(CHART),
        "--namespace",
        operator_ns,
        "--reuse-values",
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "5m",
        kubeconfig=kubectl.kubeconfig,
        timeout=400,
    )
    after = _ready_operator_pod(kubectl, operator_ns)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    env = {e["name"]: e.get("value") for e in after["spec"]["containers"][0]["env"]}
    assert env["FINETUNE_LOG_LEVEL"] == "debug"


def test_crd_upgrade_path_is_server_side_apply_then_helm_upgrade(kubectl: Kube, release: dict[str, Any]) -> None:
    """Helm never upgrades crds/: the documented path (test_crd_upgrade_command.py) is a server-side
    apply with --force-conflicts, then `helm upgrade`."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    newer = json.loads(json.dumps(crd))
    column = {"name": "UpgradeProbe", "type": "string", "jsonPath": ".metadata.uid", "priority": 1}
    newer["spec"]["versions"][0]["additionalPrinterColumns"].append(column)
    try:
        applied = kubectl.run("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(newer))
        assert "serverside-applied" in applied.stdout
        live = kubectl.get("crd", crd["metadata"]["name"])
        assert column["name"] in [c["name"] for c in live["spec"]["versions"][0]["additionalPrinterColumns"]]
        helm(
            "upgrade",
            _release_name(),
            str(CHART),
            "--namespace",
            release["operator_ns"],
            "--reuse-values",
            "--wait",
            "--timeout",
            "5m",
            kubeconfig=kubectl.kubeconfig,
            timeout=400,
        )
        # Helm left the CRD as applied, and existing FineTuneJobs are still served.
        live = kubectl.get("crd", crd["metadata"]["name"])
        assert column["name"] in [c["name"] for c in live["spec"]["versions"][0]["additionalPrinterColumns"]]
        assert _phase(kubectl.get("finetunejob/tiny", "-n", release["job_ns"])) == "Succeeded"
    finally:
        # Back to the chart's own CRD, the documented command exactly.
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    live = kubectl.get("crd", crd["metadata"]["name"])
    assert column["name"] not in [c["name"] for c in live["spec"]["versions"][0]["additionalPrinterColumns"]]


# A job on a KWOK GPU node whose pod runs until the test lets it end (KWOK ends a pod
# `kwok.finetune.dev/run-ms` after it starts); Hub sources, so no input check runs first.
STEADY = "steady"
STEADY_SPEC: dict[str, Any] = {
    "model": {"source": {"hub": {"id": "org/model"}}},
    "dataset": {"source": {"hub": {"id": "org/data"}}, "format": "alpaca"},
    "output": {"storage": {"size": "1Gi"}},
    "resources": {"gpus": 1, "gpuProduct": "Tesla-P40"},
    "training": {"maxSteps": 2},
}
STEADY_RUN_MS = 90_000


def _steady_pod(kubectl: Kube, job_ns: str) -> dict[str, Any] | None:
    pods = kubectl.get("pods", "-n", job_ns, "-l", f"finetune.dev/job={STEADY}")["items"]
    return pods[0] if len(pods) == 1 else None


def test_upgrade_from_one_replica_to_two_keeps_every_running_job(
    kubectl: Kube, kube: client.ApiClient, release: dict[str, Any]
) -> None:
    """`helm upgrade` from the one-replica shape (Recreate, no election) to two replicas with a
    leader: the job running through it keeps its Job and its pod (nothing made again, nothing
    restarted), and one of the new replicas, the Lease's holder, carries it to Succeeded."""
    operator_ns, job_ns = release["operator_ns"], release["job_ns"]
    job = {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": {"name": STEADY}}
    # Set the moment the pod appears: KWOK reads it when the pod starts running.
    with PodAnnotator(kube, job_ns, {STEADY}, {"kwok.finetune.dev/run-ms": f"{STEADY_RUN_MS}ms"}):
        kubectl.apply([{**job, "spec": STEADY_SPEC}], "-n", job_ns)
        running = kubectl.wait_for(f"finetunejob/{STEADY}", lambda j: _phase(j) == "Running", 120, "-n", job_ns)
    job_before = kubectl.get(f"job/{STEADY}", "-n", job_ns)["metadata"]["uid"]
    pod_before = _steady_pod(kubectl, job_ns)
    assert pod_before is not None and pod_before["status"]["phase"] == "Running", pod_before
    # The finished tiny job's Job, when its test ran before this one: kept as it was too.
    tiny = kubectl.run("get", "job/tiny", "-n", job_ns, "-o", "jsonpath={.metadata.uid}", check=False).stdout

    started = time.monotonic()
    helm(
        "upgrade",
        _release_name(),
        str(CHART),
        "--namespace",
        operator_ns,
        "--reuse-values",
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=true",
        "--wait",
        "--timeout",
        "5m",
        kubeconfig=kubectl.kubeconfig,
        timeout=400,
    )
    upgraded_s = time.monotonic() - started
    # Two replicas, one of them holding the Lease.
    pods = kubectl.wait_for(
        "pods",
        lambda p: len([x for x in p["items"] if not x["metadata"].get("deletionTimestamp")]) == 2,
        120,
        "-n",
        operator_ns,
        "-l",
        "app.kubernetes.io/component=operator",
    )
    names = {p["metadata"]["name"] for p in pods["items"] if not p["metadata"].get("deletionTimestamp")}
    lease = kubectl.wait_for(
        f"lease/{_deployment_name()}",
        lambda lease: (lease["spec"].get("holderIdentity") or "").split("_")[0] in names,
        60,
        "-n",
        operator_ns,
    )
    # The running job went through untouched, and the leader finishes it.
    pod_after = _steady_pod(kubectl, job_ns)
    assert pod_after is not None and pod_after["metadata"]["uid"] == pod_before["metadata"]["uid"]
    assert kubectl.get(f"job/{STEADY}", "-n", job_ns)["metadata"]["uid"] == job_before
    if tiny:
        assert kubectl.get("job/tiny", "-n", job_ns)["metadata"]["uid"] == tiny
    done = kubectl.wait_for(
        f"finetunejob/{STEADY}",
        lambda j: _phase(j) in ("Succeeded", "Failed"),
        STEADY_RUN_MS / 1000 + 120,
        "-n",
        job_ns,
    )
    assert _phase(done) == "Succeeded", json.dumps(done.get("status"), indent=1)
    assert (done["status"].get("restarts") or 0) == 0 and running["status"].get("startTime") == done["status"].get(
        "startTime"
    )
    assert len(kubectl.get("jobs", "-n", job_ns, "-l", f"finetune.dev/job={STEADY}")["items"]) == 1
    print(json.dumps({"upgrade_s": round(upgraded_s, 1), "leader": lease["spec"]["holderIdentity"]}))


def test_uninstall_removes_everything_but_the_crd_and_the_outputs(kubectl: Kube, release: dict[str, Any]) -> None:
    from hack.cluster.layout import Layout

    operator_ns, job_ns = release["operator_ns"], release["job_ns"]
    helm("uninstall", _release_name(), "--namespace", operator_ns, "--wait", kubeconfig=kubectl.kubeconfig, timeout=300)
    remaining = kubectl.run(
        "get",
        "deployment,serviceaccount,service,role,rolebinding,networkpolicy",
        "-n",
        operator_ns,
        "-l",
        "app.kubernetes.io/instance=" + _release_name(),
        "-o",
        "name",
    ).stdout.split()
    assert remaining == []
    selector = "app.kubernetes.io/instance=" + _release_name()
    cluster_wide = kubectl.run(
        "get", "validatingadmissionpolicy,validatingadmissionpolicybinding", "-l", selector, "-o", "name"
    ).stdout.split()
    assert cluster_wide == []
    assert (
        kubectl.run(
            "get", "role,rolebinding", "-n", job_ns, "-l", "app.kubernetes.io/instance=" + _release_name(), "-o", "name"
        ).stdout.split()
        == []
    )
    kubectl.wait_for(
        "pods", lambda p: not p["items"], 120, "-n", operator_ns, "-l", "app.kubernetes.io/component=operator"
    )
    # Kept: the CRD, so every FineTuneJob; the output claim and what the trainer wrote.
    kubectl.get("crd", "finetunejobs.finetune.dev")
    assert _phase(kubectl.get("finetunejob/tiny", "-n", job_ns)) == "Succeeded"
    kubectl.get("pvc/outputs", "-n", job_ns)
    outputs = Layout.for_repo().volume_dir(job_ns, "outputs")
    assert any(outputs.rglob("adapter_config.json")), f"no adapter under {outputs}"
