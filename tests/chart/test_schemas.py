"""A third party's reading of our objects: every object the chart renders (default values and
the all-on set) and every child the operator's builders make for the example jobs validate
against the Kubernetes OpenAPI schemas of the oldest minor the chart supports (Chart.yaml's
kubeVersion), the current one (the local control plane's) and the newest the package ships.

The schemas come with the pinned `kubernetes-validate` package (its strict form: an unknown
field is an error, as `kubectl apply --validate=strict` makes it), so nothing is fetched.
Chart rendering needs the helm binary only (the `helm_binary` fixture); no cluster.
"""

import copy
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from finetune_api.served_files import named_jobs, resolve
from finetune_api.server_spec import ModelServerSpec
from finetune_api.spec import FineTuneJobSpec
from finetune_operator.builders import model_server
from finetune_operator.builders.model_server import ServerOwner
from finetune_operator.children import Owner
from finetune_operator.decide import desired_children, namespace_children
from finetune_operator.settings import SETTINGS, Settings, from_env
from hack.cluster.binaries import K8S_VERSION
from tests.support.harness import TRAINER_NETWORK
from tests.support.helm import ALL_ON_VALUES, CHART, REPO, render
from tests.support.server_cases import job

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# Kinds of other projects' CRDs: no Kubernetes schema describes them (Kueue's objects are checked
# against Kueue's own CRDs and webhooks in tests/operator/test_e2e_kueue.py, the Prometheus
# Operator's against its CRDs in tests/chart/test_monitoring_crds.py).
NOT_KUBERNETES = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")} | {
    ("kueue.x-k8s.io/v1beta2", kind)
    for kind in ("ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass")
}


def _minor(version: str) -> str:
    match = re.search(r"(\d+)\.(\d+)", version)
    assert match, f"no minor version in {version!r}"
    return f"{match.group(1)}.{match.group(2)}"


OLDEST = _minor(yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"])
CURRENT = _minor(K8S_VERSION)
# And the newest the pinned package knows: what the next upgrades will meet.
NEWEST = _minor(kubernetes_validate.utils.latest_version())
VERSIONS = sorted({OLDEST, CURRENT, NEWEST}, key=lambda v: tuple(int(p) for p in v.split(".")))


def problems(obj: dict[str, Any], version: str) -> str | None:
    """None when `obj` is valid for this Kubernetes minor; else one line naming the field."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "(top)"
        return f"{obj['kind']}/{obj['metadata'].get('name')}: {where}: {exc.message}"
    return None


def builder_children() -> list[dict[str, Any]]:
    """What the operator creates for each example: for a job, what the namespace's jobs share (the
    trainer identity, the trainers' NetworkPolicies with the tests' network rules), the job's own
    policy when it spans nodes, the output claim when the job asks for one, and the Job; for a
    ModelServer, its NetworkPolicy, Service and Deployment (its jobs' files on their claims)."""
    network = from_env({SETTINGS["trainer_network"].env: json.dumps(TRAINER_NETWORK)}).trainer_network
    settings = Settings(trainer_network=network)
    objects: list[dict[str, Any]] = []
    for path in EXAMPLES:
        manifest = yaml.safe_load(path.read_text())
        if manifest["kind"] == "ModelServer":
            objects += server_children(manifest, settings)
            continue
        spec = FineTuneJobSpec.model_validate(manifest["spec"])
        owner = Owner(name=manifest["metadata"]["name"], namespace="team-a", uid="0000-uid")
        objects += namespace_children(owner.namespace, settings) + desired_children(owner, spec, settings)
    return objects


def server_children(manifest: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    spec = ModelServerSpec.model_validate(manifest["spec"])
    owner = ServerOwner(manifest["metadata"]["name"], "team-a", "0000-uid")
    jobs = {name: job(name) for name in named_jobs(spec)}
    return model_server.children(owner, spec, resolve(spec, owner.namespace, jobs, None), settings)


def test_the_supported_versions_have_schemas_in_the_package() -> None:
    shipped = kubernetes_validate.utils.all_versions()
    for version in VERSIONS:
        assert any(_minor(v) == version for v in shipped), f"kubernetes-validate ships no {version} schemas"
    assert OLDEST == "1.30", "Chart.yaml's kubeVersion moved: check the admission policy API is GA there"


def test_there_are_example_jobs_and_their_children() -> None:
    kinds = {o["kind"] for o in builder_children()}
    assert len(EXAMPLES) >= 2
    assert {"Job", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "Deployment", "Service"} <= kinds


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_every_rendered_object_is_valid(values: list[Path], version: str) -> None:
    objects = [o for o in render(values) if (o["apiVersion"], o["kind"]) not in NOT_KUBERNETES]
    assert len(objects) >= 10
    found = [p for o in objects if (p := problems(o, version))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_child_of_the_example_jobs_is_valid(version: str) -> None:
    found = [p for o in builder_children() if (p := problems(o, version))]
    assert not found, "\n".join(found)


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("version", VERSIONS)
def test_a_planted_invalid_field_fails_the_validation(version: str) -> None:
    """The check can fail: one unknown field, one wrong type, each named by its path."""
    job = next(o for o in builder_children() if o["kind"] == "Job")
    assert problems(job, version) is None
    unknown = copy.deepcopy(job)
    unknown["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    found = problems(unknown, version)
    assert found is not None and "spec.template.spec.containers.0" in found and "imagePullPolicyy" in found
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["backoffLimit"] = "three"
    found = problems(wrong_type, version)
    assert found is not None and "spec.backoffLimit" in found
    deployment = next(o for o in render() if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoots"] = True
    found = problems(deployment, version)
    assert found is not None and "runAsNonRoots" in found
