"""The children of a job of several nodes (`resources.nodes` > 1): an Indexed Job and its
headless Service.

Kubernetes gives what a gang of training pods needs, and nothing here schedules or launches:
- an Indexed Job, one pod per node (`completions = parallelism = nodes`); each pod is named
  `<job>-<index>` as its hostname and gets its index as `JOB_COMPLETION_INDEX`, which is the
  trainer's node rank;
- a headless Service named after the job, the pods' `subdomain`, with
  `publishNotReadyAddresses`: a training pod is never Ready (it serves nothing), and its peers
  must resolve `<job>-0.<job>` from the moment it has an address;
- the launcher's settings in the environment (`finetune_api.multinode`, shared with the
  trainer);
- `successPolicy`: the Job is done when index 0 succeeds. Its pod holds global rank 0, which
  writes the adapter last; the others' pods may end first, or be stopped once it is done;
- the pod failure policy of a job of one node, and `podReplacementPolicy: Failed`;
- a gang restart through the Job's own retries. One attempt is all pods together: when a pod's
  trainer fails, its peers' collectives fail at once (the dead rank's sockets close), so every
  pod of the gang exits retryably, the Job replaces each failed pod, the replacements meet at a
  fresh rendezvous, and every rank resumes from rank 0's last complete checkpoint (sent to the
  other nodes). The launcher's own restarts (`max_restarts`) stay 0: a pod that restarted its
  workers in place could meet a replaced peer at a stale round, and its rank files would speak
  of the round before. Each gang attempt costs up to one failed pod per node, so
  `backoffLimit` is the spec's times `nodes` (status.restarts counts attempts, status/phase.py).

Pure functions of the spec; a job of one node keeps the Job of `job.job` exactly.
"""

from typing import Any, Final

from finetune_api import multinode
from finetune_api.contract import CONTAINER
from finetune_api.spec import FineTuneJobSpec

from ..children import Owner, labels, metadata
from ..settings import Settings
from .job import job

PROTOCOL: Final = "TCP"
# Every variable `launch_environment` may write (the fence admits these on top of job.ENV_NAMES).
ENV_NAMES: Final = frozenset(
    {multinode.NNODES_ENV, multinode.RDZV_ENDPOINT_ENV, multinode.NODE_DOMAIN_ENV, multinode.RDZV_TIMEOUT_ENV}
)


def service(owner: Owner, spec: FineTuneJobSpec) -> dict[str, Any]:
    """The headless Service that gives the job's pods their names; owned by the job.

    It lists the rendezvous port only. The collectives (gloo, NCCL) and the workers' store listen
    on ports the kernel picks (`multinode.COLLECTIVE_PORTS`): a Service cannot name a range, and a
    headless one proxies nothing, so the range is the NetworkPolicy's to allow, not the Service's.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, multinode.service_name(owner.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels(owner.name),
            "ports": [
                {
                    "name": multinode.RDZV_PORT_NAME,
                    "port": multinode.RDZV_PORT,
                    "targetPort": multinode.RDZV_PORT,
                    "protocol": PROTOCOL,
                }
            ],
        },
    }


def launch_environment(owner: Owner, spec: FineTuneJobSpec) -> list[dict[str, Any]]:
    """What the launcher of each pod reads; `JOB_COMPLETION_INDEX` is set by Kubernetes itself."""
    return [
        {"name": multinode.NNODES_ENV, "value": str(spec.resources.nodes)},
        {"name": multinode.RDZV_ENDPOINT_ENV, "value": multinode.rendezvous_endpoint(owner.name)},
        {"name": multinode.NODE_DOMAIN_ENV, "value": multinode.service_name(owner.name)},
        {"name": multinode.RDZV_TIMEOUT_ENV, "value": str(multinode.DEFAULT_RDZV_TIMEOUT_S)},
    ]


def indexed_job(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> dict[str, Any]:
    """The Job of a job of `resources.nodes` pods; for one node, `job.job`'s Job unchanged."""
    body = job(owner, spec, settings)
    if not spec.resources.multinode:
        return body
    nodes = spec.resources.nodes
    job_spec = body["spec"]
    job_spec["completionMode"] = "Indexed"
    job_spec["completions"] = nodes
    job_spec["parallelism"] = nodes
    job_spec["backoffLimit"] = spec.backoff_limit * nodes
    job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    job_spec["template"]["metadata"]["labels"][multinode.MULTINODE_LABEL] = "true"
    pod_spec = job_spec["template"]["spec"]
    pod_spec["subdomain"] = multinode.service_name(owner.name)
    container = next(c for c in pod_spec["containers"] if c["name"] == CONTAINER)
    container["env"] = [*container["env"], *launch_environment(owner, spec)]
    container["ports"] = [
        {"name": multinode.RDZV_PORT_NAME, "containerPort": multinode.RDZV_PORT, "protocol": PROTOCOL}
    ]
    return body
