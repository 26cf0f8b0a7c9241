"""The per-job identity of the trainer: it may read and patch its own job's status, nothing else."""

from typing import Any

from finetune_api.constants import GROUP, PLURAL

from ..children import Owner, metadata, role_name, service_account_name

TRAINER_VERBS = ("get", "patch")


def service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(owner, service_account_name(owner.name)),
        # The trainer pod mounts its token explicitly; nothing else should get one by default.
        "automountServiceAccountToken": False,
    }


def role(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(owner, role_name(owner.name)),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": [f"{PLURAL}/status"],
                "resourceNames": [owner.name],
                "verbs": list(TRAINER_VERBS),
            }
        ],
    }


def role_binding(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(owner, role_name(owner.name)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name(owner.name)},
        "subjects": [
            {"kind": "ServiceAccount", "name": service_account_name(owner.name), "namespace": owner.namespace}
        ],
    }
