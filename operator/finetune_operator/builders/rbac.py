"""The trainer's identity in a namespace: one ServiceAccount, a Role to patch FineTuneJob status,
and the binding between them, shared by every job of the namespace.

One identity per namespace, not per job: a job then costs the API server one write (its Job)
instead of four. Which job a trainer may patch is decided at admission, by the chart's
ValidatingAdmissionPolicy: the token of a Job's pod names that pod, and the pod's name names the
job (charts/finetune-operator/files/trainer-status-policy.yaml).
"""

from typing import Any

from finetune_api.constants import GROUP, LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY, PLURAL, TRAINER_SERVICE_ACCOUNT
from finetune_api.contract import COMPONENT_TRAINER

# A merge patch of status: the trainer never reads (progress and checkpoints only go out).
TRAINER_VERBS = ("patch",)
ROLE_NAME = TRAINER_SERVICE_ACCOUNT


def _metadata(namespace: str, name: str) -> dict[str, Any]:
    # No owner: the identity serves every job of the namespace and outlives each of them.
    return {
        "name": name,
        "namespace": namespace,
        "labels": {LABEL_COMPONENT: COMPONENT_TRAINER, LABEL_MANAGED_BY: MANAGED_BY},
    }


def service_account(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(namespace, TRAINER_SERVICE_ACCOUNT),
        # The trainer pod mounts its token explicitly; nothing else should get one by default.
        "automountServiceAccountToken": False,
    }


def role(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(namespace, ROLE_NAME),
        "rules": [{"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": list(TRAINER_VERBS)}],
    }


def role_binding(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(namespace, ROLE_NAME),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": TRAINER_SERVICE_ACCOUNT, "namespace": namespace}],
    }


def identity(namespace: str) -> list[dict[str, Any]]:
    """In creation order: the API server refuses a binding to a Role that is not there yet."""
    return [service_account(namespace), role(namespace), role_binding(namespace)]
