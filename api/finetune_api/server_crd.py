"""The ModelServer's CustomResourceDefinition, from its models as crd.py makes the FineTuneJob's."""

from .constants import MAX_NAME_LENGTH, SERVER_CRD_NAME, SERVER_KIND, SERVER_PLURAL, SERVER_SHORT_NAMES, SERVER_SINGULAR
from .crd import Schema, as_yaml, defaulted_schema, definition, structural_schema
from .server_resource import SERVER_NAME_MESSAGE, SERVER_NAME_PATTERN
from .server_spec import ModelServerSpec
from .server_status import ModelServerStatus

PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas", "description": "Pods that answer."},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.resources.gpus", "description": "GPUs of each pod."},
    {
        "name": "Endpoint",
        "type": "string",
        "jsonPath": ".status.endpoint",
        "priority": 1,
        "description": "The OpenAI-compatible API inside the cluster.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "description": "Why it is not Ready: a refusal naming the field, or what the pods wait for.",
    },
]


def spec_schema() -> Schema:
    return defaulted_schema(ModelServerSpec)


def openapi_schema() -> Schema:
    return {
        "type": "object",
        "description": "A llama.cpp server of a GGUF base with LoRA adapters, each a finished FineTuneJob's or a "
        "file on a claim; a request picks its adapter.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": structural_schema(ModelServerStatus),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH} "
                f"&& self.metadata.name.matches('{SERVER_NAME_PATTERN}')",
                "message": SERVER_NAME_MESSAGE,
            }
        ],
    }


def crd() -> Schema:
    return definition(
        crd_name=SERVER_CRD_NAME,
        kind=SERVER_KIND,
        plural=SERVER_PLURAL,
        singular=SERVER_SINGULAR,
        short_names=SERVER_SHORT_NAMES,
        columns=PRINTER_COLUMNS,
        schema=openapi_schema(),
    )


def render_yaml() -> str:
    return as_yaml(crd())
