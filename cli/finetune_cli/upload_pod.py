"""The short-lived pod `ftjob upload` runs to write into a claim: a pure builder, no I/O.

The pod is the user's, made with the user's credentials (not the operator's: the operator's
fence does not apply to it), and passes Pod Security `restricted`: uid 1000 like the trainer,
no privilege, no capabilities, RuntimeDefault seccomp, a read-only root filesystem and no
service-account token (the receiver never calls the API server).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from . import upload_receiver

DEFAULT_IMAGE = "python:3.12-slim"
MOUNT_PATH = "/data"
CONTAINER = "receiver"
LABEL_COMPONENT = "finetune.dev/component"
COMPONENT = "upload"
LABEL_CLAIM = "finetune.dev/upload-claim"
ANNOTATION_RECEIVER = "finetune.dev/upload-receiver"
TRAINER_UID = 1000
NAME_PREFIX = "ftjob-upload-"
TOKEN_ENV = "FTJOB_UPLOAD_TOKEN"


def receiver_source() -> str:
    return Path(upload_receiver.__file__).read_text()


def receiver_digest(source: str) -> str:
    """Names the receiver's version: a pod running another version is not reused."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def pod_name(claim: str) -> str:
    """One upload pod per claim, found again by name after an interrupted upload."""
    name = NAME_PREFIX + claim
    if len(name) <= 63:
        return name
    return f"{name[:54]}-{hashlib.sha256(claim.encode()).hexdigest()[:8]}"


def upload_pod(claim: str, port: int, token: str, image: str, idle_seconds: int) -> dict[str, Any]:
    source = receiver_source()
    if "$(" in source:  # the kubelet would expand it as a variable reference in `command`
        raise ValueError("the receiver's source must not contain '$('")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(claim),
            "labels": {
                "app.kubernetes.io/managed-by": "ftjob",
                LABEL_COMPONENT: COMPONENT,
                LABEL_CLAIM: claim if len(claim) <= 63 else pod_name(claim)[-8:],
            },
            "annotations": {ANNOTATION_RECEIVER: receiver_digest(source)},
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 2,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": TRAINER_UID,
                "runAsGroup": TRAINER_UID,
                "fsGroup": TRAINER_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "command": ["python3", "-c", source, MOUNT_PATH, str(port), str(idle_seconds)],
                    "env": [
                        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                        {"name": TOKEN_ENV, "value": token},
                    ],
                    "ports": [{"name": "receiver", "containerPort": port}],
                    "volumeMounts": [{"name": "claim", "mountPath": MOUNT_PATH}],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "limits": {"memory": "256Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "volumes": [{"name": "claim", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }
