"""`ModelServer.spec`: a llama.cpp server of a GGUF base with a team's adapters, each a finished
FineTuneJob's `gguf-lora` output or a GGUF file on a claim.

The rules that need only this object are here twice, as in spec.py: pydantic validators (`ftjob
validate`, the operator) and CEL rules (admission), with one message each. Those that need other
objects (the adapter's job finished, wrote gguf-lora, on the same base; the claim exists) are
server_checks.py's, run by the operator and by `ftjob validate` where it reaches the cluster.
"""

from typing import Annotated, Final, Self

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from .base import (
    LABEL_VALUE_PATTERN,
    AnyObject,
    ApiModel,
    LabelMap,
    PositiveQuantity,
    RelativePath,
    ResourceName,
    ShortString,
)
from .constants import MAX_NAME_LENGTH
from .resource import DNS_LABEL_PATTERN
from .spec import Toleration


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


ONE_FILE: Final = "exactly one of job or pvc must be set"
GGUF_FILE: Final = "path must name a .gguf file, without a comma or a colon (llama-server's --lora-scaled list)"
ADAPTER_TWICE: Final = "adapters lists an adapter twice (the same job, or the same claim and path)"
MIN_SLOT_TOKENS: Final = 128
SLOT_CONTEXT: Final = f"contextSize / parallel (each slot's context) must be at least {MIN_SLOT_TOKENS} tokens"
MAX_ADAPTERS: Final = 16
# llama-server's port in the pod and the Service's; the NetworkPolicy opens this one alone.
SERVER_PORT: Final = 8080
SERVER_PORT_NAME: Final = "http"


def servable_path(path: str) -> bool:
    """A GGUF file llama-server's arguments can name: `--lora-scaled` splits its list at commas and
    each entry at its last colon."""
    return path.endswith(".gguf") and "," not in path and ":" not in path


JobName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL_PATTERN)]


class GgufPvc(ApiModel):
    """A GGUF file on a PersistentVolumeClaim of the server's namespace, mounted read-only."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.path.endsWith('.gguf') && !self.path.contains(',') && !self.path.contains(':')",
                    GGUF_FILE,
                    ".path",
                )
            ]
        }
    )

    claim_name: ResourceName = Field(description="Name of the PersistentVolumeClaim.")
    path: RelativePath = Field(description="The .gguf file inside the claim.")

    @model_validator(mode="after")
    def _gguf(self) -> Self:
        if not servable_path(self.path):
            raise ValueError(GGUF_FILE)
        return self


class GgufSource(ApiModel):
    """A finished FineTuneJob of the namespace by name (its gguf-lora output), or a file on a claim."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_cel("has(self.job) != has(self.pvc)", ONE_FILE)]}
    )

    job: JobName | None = Field(
        default=None,
        description="A FineTuneJob of this namespace that Succeeded and wrote gguf-lora: its GGUF adapter (for an "
        "adapter) or the GGUF base written beside it (for the base).",
    )
    pvc: GgufPvc | None = Field(default=None, description="A GGUF file on a claim of this namespace.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.job is None) == (self.pvc is None):
            raise ValueError(ONE_FILE)
        return self

    def key(self) -> tuple[str, ...]:
        """What makes two entries the same adapter: the job, or the claim and path."""
        if self.pvc is not None:
            return ("pvc", self.pvc.claim_name, self.pvc.path)
        return ("job", str(self.job))


class ServerResources(ApiModel):
    gpus: Annotated[int, Field(ge=0, le=8)] = Field(
        default=1, description="GPUs of each server pod (0 = CPU); llama.cpp splits the layers over them."
    )
    gpu_product: Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)] = Field(
        default="Tesla-P40", description="Value of the node label nvidia.com/gpu.product, as a job's."
    )
    cpu: PositiveQuantity | None = Field(default=None, description="CPU request and limit (the chart's default).")
    memory: PositiveQuantity | None = Field(
        default=None, description="Memory request and limit (the chart's default): the model's file is read into it."
    )


class ServerPlacement(ApiModel):
    node_selector: LabelMap = Field(default_factory=dict, description="Extra node labels the pods require.")
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list, description="Extra tolerations (the GPU taint is tolerated already)."
    )
    affinity: AnyObject | None = Field(default=None, description="A core/v1 Affinity, passed through.")
    priority_class_name: ResourceName | None = Field(default=None, description="PriorityClass of the pods.")


def _spec_rules(schema: JsonDict, _: object = None) -> None:
    same = (
        "(has(a.job) && has(b.job) && a.job == b.job) || (has(a.pvc) && has(b.pvc) "
        "&& a.pvc.claimName == b.pvc.claimName && a.pvc.path == b.pvc.path)"
    )
    schema["x-kubernetes-validations"] = [
        _cel(
            f"!has(self.adapters) || self.adapters.all(a, self.adapters.filter(b, {same}).size() == 1)",
            ADAPTER_TWICE,
            ".adapters",
        ),
        _cel(
            f"(has(self.contextSize) ? self.contextSize : 4096) / (has(self.parallel) ? self.parallel : 4) "
            f">= {MIN_SLOT_TOKENS}",
            SLOT_CONTEXT,
            ".contextSize",
        ),
    ]


class ModelServerSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=_spec_rules)

    base: GgufSource = Field(
        description="The GGUF base llama-server loads (-m): a finished job's (the base-<ggufType>.gguf its gguf-lora "
        "format writes beside the adapter), or a GGUF file on a claim."
    )
    adapters: Annotated[list[GgufSource], Field(max_length=MAX_ADAPTERS)] = Field(
        default_factory=list,
        description="The LoRA adapters loaded at start (--lora, each at scale 0): a request picks its own by the id "
        "status.adapters lists (its `lora` field), so one server answers for every team's adapter. Changing the "
        "list rolls the pods (llama-server loads adapters only at start); appending keeps the earlier ids.",
    )
    resources: ServerResources = Field(default_factory=ServerResources, description="GPUs, CPU and memory of a pod.")
    replicas: Annotated[int, Field(ge=1, le=16)] = Field(default=1, description="Server pods behind the Service.")
    context_size: Annotated[int, Field(ge=256, le=131072)] = Field(
        default=4096, description="Tokens of context of a pod (--ctx-size), shared by its slots."
    )
    parallel: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4, description="Requests a pod serves at once (--parallel), each with contextSize / parallel tokens."
    )
    placement: ServerPlacement = Field(default_factory=ServerPlacement, description="Scheduling constraints.")
    image: ShortString | None = Field(
        default=None,
        description="Serving image; the operator's default if unset. It must be in the platform's serving image "
        "allow-list (the chart's serving.allowedImages).",
    )

    @model_validator(mode="after")
    def _each_adapter_once(self) -> Self:
        keys = [a.key() for a in self.adapters]
        if len(set(keys)) != len(keys):
            raise ValueError(ADAPTER_TWICE)
        return self

    @model_validator(mode="after")
    def _slot_context(self) -> Self:
        if self.context_size // self.parallel < MIN_SLOT_TOKENS:
            raise ValueError(SLOT_CONTEXT)
        return self
