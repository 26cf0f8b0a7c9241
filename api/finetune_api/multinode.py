"""The contract between the Job the operator builds for `resources.nodes` > 1 and the trainer's
launcher: the environment variables, the rendezvous port and the names pods reach each other by.

The operator's builders set these on the pod template of an Indexed Job; the launcher
(`finetune_trainer.launch.launcher`) reads them. One list, imported by both, so they agree by
construction. A pod without `NNODES_ENV` (or with 1) is a job of one node, launched as before.
"""

from typing import Final

# Pods of the job, all alike; the Job's `completions` and `parallelism`.
NNODES_ENV: Final = "FINETUNE_NNODES"
# This pod's node rank. Kubernetes itself sets it on every pod of an Indexed Job.
NODE_RANK_ENV: Final = "JOB_COMPLETION_INDEX"
# host:port of the rendezvous store, served by the launcher of the pod of index 0.
RDZV_ENDPOINT_ENV: Final = "FINETUNE_RDZV_ENDPOINT"
# The headless Service (the pods' `subdomain`): this pod is `<hostname>.<domain>` to its peers.
NODE_DOMAIN_ENV: Final = "FINETUNE_NODE_DOMAIN"
# How peers reach this pod, when not `<hostname>.<domain>` (local runs, the GPU bench).
NODE_ADDR_ENV: Final = "FINETUNE_NODE_ADDR"
# Seconds a launcher waits for every node at the rendezvous before it exits RendezvousTimeout.
RDZV_TIMEOUT_ENV: Final = "FINETUNE_RDZV_TIMEOUT_S"

# On the pod template of a multi-node job, and no other: marks its pods (a job's own
# NetworkPolicy, builders/network.py, opens their ports to the job's own pods by its job label).
MULTINODE_LABEL: Final = "finetune.dev/multinode"

# Kubernetes writes each Indexed Job pod's completion index (its node rank) here too, so
# `ftjob logs --rank` and the tests find the pod of a rank without reading its environment.
COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"

LAUNCH_ENV: Final = (NNODES_ENV, NODE_RANK_ENV, RDZV_ENDPOINT_ENV, NODE_DOMAIN_ENV, NODE_ADDR_ENV, RDZV_TIMEOUT_ENV)

# The rendezvous store (torch's c10d TCPStore) listens here on the pod of index 0. torchrun's port.
RDZV_PORT: Final = 29400
RDZV_PORT_NAME: Final = "rendezvous"
# The collectives (gloo, NCCL's socket transport) and the workers' own store listen on ports the
# kernel picks from its ephemeral range; Linux's default range, which a NetworkPolicy must allow
# between the job's pods. Neither library can be pinned to a fixed port.
COLLECTIVE_PORTS: Final = (32768, 60999)
COLLECTIVE_PORT_NAME: Final = "collectives"
# Long enough for every pod of the gang to be scheduled, pull the image and start; the Job's
# activeDeadlineSeconds bounds the whole, this bounds one attempt's wait for its peers.
DEFAULT_RDZV_TIMEOUT_S: Final = 900


def several_nodes(nodes: int) -> bool:
    """Whether a job of `nodes` pods (`resources.nodes`) is a job of several nodes: an Indexed Job,
    a headless Service, one gang whose claims every node mounts, this contract in its environment."""
    return nodes > 1


def service_name(job_name: str) -> str:
    """The headless Service of a multi-node job: the job's name (a DNS label, at most 52 characters)."""
    return job_name


def pod_hostname(job_name: str, index: int) -> str:
    """The hostname Kubernetes gives the pod of `index` of an Indexed Job named `job_name`."""
    return f"{job_name}-{index}"


def rendezvous_endpoint(job_name: str, port: int = RDZV_PORT) -> str:
    """host:port of the pod of index 0, by the name its peers resolve (`<hostname>.<subdomain>`)."""
    return f"{pod_hostname(job_name, 0)}.{service_name(job_name)}:{port}"
