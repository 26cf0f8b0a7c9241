"""Names that identify the FineTuneJob API on the wire."""

from typing import Final

GROUP: Final = "finetune.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "FineTuneJob"
PLURAL: Final = "finetunejobs"
SINGULAR: Final = "finetunejob"
SHORT_NAMES: Final = ("ftj",)
CATEGORIES: Final = ("finetune",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# Child objects are named after the job; Job pods inherit the name in a label, and label
# values stop at 63 characters, so the job name leaves room for the longest suffix we add.
MAX_NAME_LENGTH: Final = 52

# Labels every child carries, so `kubectl get all -l finetune.dev/job=NAME` finds them.
LABEL_JOB: Final = f"{GROUP}/job"
LABEL_COMPONENT: Final = f"{GROUP}/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "finetune-operator"

# Every trainer pod of a namespace runs as this one ServiceAccount (created by the operator on
# the namespace's first job). Its Role lets it patch FineTuneJob status; the chart's
# ValidatingAdmissionPolicy (charts/finetune-operator/files/trainer-status-policy.yaml) narrows
# that to the job whose pod holds the token.
TRAINER_SERVICE_ACCOUNT: Final = "finetune-trainer"

DEFAULT_IMAGE: Final = "ghcr.io/finetune-operator/trainer:0.1.0"

# The second resource: a llama.cpp server of a finished job's GGUF base with its teams' adapters.
SERVER_KIND: Final = "ModelServer"
SERVER_PLURAL: Final = "modelservers"
SERVER_SINGULAR: Final = "modelserver"
SERVER_SHORT_NAMES: Final = ("ms",)
SERVER_CRD_NAME: Final = f"{SERVER_PLURAL}.{GROUP}"
# A server's children (Deployment, Service, NetworkPolicy) and its pods carry this label with
# its name, as a job's carry LABEL_JOB: `kubectl get all -l finetune.dev/server=NAME`.
LABEL_SERVER: Final = f"{GROUP}/server"
# The serving image (serving_image/Dockerfile): llama-server built from the pinned llama.cpp.
DEFAULT_SERVING_IMAGE: Final = "ghcr.io/finetune-operator/server:0.1.0"
