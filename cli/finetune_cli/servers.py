"""ModelServers from a terminal: reading one, what it names checked on the cluster as the operator
checks it, the adapter id a job's name stands for, and how a server's status reads."""

from __future__ import annotations

from typing import Any, Final

from finetune_api.constants import GROUP, SERVER_PLURAL, VERSION
from finetune_api.problems import Problem
from finetune_api.served_files import named_jobs, resolve
from finetune_api.server_spec import ModelServerSpec

from . import kube
from .display import age, one_line
from .errors import CliError

# Reads of a check that may find no cluster at all: a few seconds, not the client's minutes.
CHECK_TIMEOUT_S: Final = 10.0


def get_server(cluster: kube.Cluster, name: str) -> dict[str, Any]:
    with kube.api_errors(cluster, f"modelserver {name}"):
        server: dict[str, Any] = cluster.custom().get_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, SERVER_PLURAL, name
        )
    return server


def _exists(cluster: kube.Cluster, what: str, read: Any, *args: Any) -> Any:
    """The object, or None where the API server says 404; any other failure is one line."""
    from kubernetes.client.exceptions import ApiException

    with kube.api_errors(cluster, what):
        try:
            return read(*args, _request_timeout=CHECK_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def cluster_problems(cluster: kube.Cluster, spec: ModelServerSpec) -> list[Problem]:
    """What the operator would refuse of the spec in this namespace: its jobs and claims, read
    from the API server and checked by finetune_api.served_files, as the operator checks them."""
    custom, core, namespace = cluster.custom(), cluster.core(), cluster.namespace
    jobs = {
        name: _exists(cluster, f"finetunejob {name}", custom.get_namespaced_custom_object, GROUP, VERSION, namespace,
                      "finetunejobs", name)
        for name in named_jobs(spec)
    }  # fmt: skip
    claims = {s.pvc.claim_name for s in [spec.base, *spec.adapters] if s.pvc is not None}
    claims |= {
        str(c) for j in jobs.values() if (c := ((j or {}).get("status") or {}).get("output", {}).get("claimName"))
    }
    present = {
        claim
        for claim in sorted(claims)
        if _exists(cluster, f"claim {claim}", core.read_namespaced_persistent_volume_claim, claim, namespace)
        is not None
    }
    return resolve(spec, namespace, jobs, present).problems


def adapter_id(server: dict[str, Any], adapter: str) -> int:
    """The llama-server id of `adapter`: a job's name, or the id itself, as status.adapters lists them."""
    listed = (server.get("status") or {}).get("adapters") or []
    for entry in listed:
        if entry.get("job") == adapter or str(entry.get("id")) == adapter:
            return int(entry["id"])
    name = server["metadata"]["name"]
    known = ", ".join(f"{e.get('id')} ({e.get('job') or e.get('path')})" for e in listed) or "none"
    raise CliError(f"modelserver {name} serves no adapter {adapter!r} (its adapters: {known})")


def describe(server: dict[str, Any]) -> str:
    """`ftjob status` of a ModelServer: phase, endpoint, what it loads and how a request picks it."""
    meta, spec, status = server.get("metadata") or {}, server.get("spec") or {}, server.get("status") or {}
    lines = [
        f"ModelServer: {meta.get('name')}",
        f"Namespace:   {meta.get('namespace')}",
        f"Phase:       {status.get('phase') or 'Pending (not yet seen by the operator)'}",
    ]
    if status.get("message"):
        lines.append(f"Message:     {one_line(status['message'])}")
    ready, replicas = status.get("readyReplicas") or 0, spec.get("replicas", 1)
    lines.append(f"Replicas:    {ready}/{replicas} answering")
    if status.get("endpoint"):
        lines.append(f"Endpoint:    {status['endpoint']}/v1  (OpenAI API; `ftjob chat {meta.get('name')}` from here)")
    base = status.get("base") or {}
    if base:
        lines.append(f"Base:        {base.get('path')}" + (f"  (job {base['job']})" if base.get("job") else ""))
    adapters = status.get("adapters") or []
    if adapters:
        lines.append('Adapters:    a request picks one by id: "lora": [{"id": ID, "scale": 1.0}]')
        for entry in adapters:
            origin = f"job {entry['job']}" if entry.get("job") else "file"
            lines.append(f"  id {entry.get('id')}: {origin}, {entry.get('path')}")
    for condition in status.get("conditions") or []:
        lines.append(
            f"Condition:   {condition.get('type')}={condition.get('status')} {condition.get('reason') or ''} "
            f"({age(condition.get('lastTransitionTime'))}) {one_line(str(condition.get('message') or ''))}".rstrip()
        )
    return "\n".join(line.rstrip() for line in lines)
