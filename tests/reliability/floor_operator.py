"""The floor for the load comparison: a bare kopf operator that only turns a FineTuneJob into a Job.

No validation, no status, no ConfigMap or RBAC children: whatever our operator costs beyond
this is the price of its features. Run with `kopf run --standalone -n NS floor_operator.py`.
The Job asks for what ours asks for on a GPU node (the GPUs, the product label, the GPU
taint's toleration), so the scheduler and KWOK treat both the same.
"""

import logging
from typing import Any

import kopf
from kubernetes import client, config


class _Api:
    batch: client.BatchV1Api | None = None


API = _Api()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # The same settings our operator takes: no CRD scanning, warnings-only Events, watch timeouts.
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 8
    config.load_kube_config()
    API.batch = client.BatchV1Api()


@kopf.on.create("finetune.dev", "v1alpha1", "finetunejobs")
def create_job(spec: kopf.Spec, name: str, namespace: str, body: kopf.Body, **_: Any) -> None:
    resources = spec.get("resources") or {}
    gpus = int(resources.get("gpus", 4))
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": resources.get("gpuProduct", "Tesla-P40")},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "trainer",
                            "command": ["python", "-m", "finetune_trainer"],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                }
            },
        },
    }
    kopf.adopt(job, owner=body)
    assert API.batch is not None
    API.batch.create_namespaced_job(namespace, job)
