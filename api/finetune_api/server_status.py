"""`ModelServer.status`: written by the operator alone, from its Deployment and pods.

`phase` is the one word a user reads first: Pending (no pod serves and none is loading: waiting
for a node, a GPU or the image), Loading (a pod runs and llama-server reads the model, /health
not yet 200), Ready (every replica answers), Failed (refused in one line naming the field, or the
server cannot start). `adapters` says which id a request names for which adapter.
"""

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel
from .status import Condition, Message, Path

ServerPhase = Literal["Pending", "Loading", "Ready", "Failed"]
# Validated: the spec and what it names (jobs, claims) are servable; Ready: every replica
# answers; Progressing: the Deployment rolls to the spec's adapters (False with WaitingForGpu when
# its new pod waits for a GPU, while the old ones serve on).
ServerConditionType = Literal["Validated", "Ready", "Progressing"]
Name = Annotated[str, Field(max_length=253)]


class ServedFile(ApiModel):
    """One GGUF file a pod loads: where it comes from and where the pod reads it."""

    id: int | None = Field(
        default=None, description="Adapters: the id a request names in its `lora` field ([{id, scale}])."
    )
    job: Name | None = Field(default=None, description="The FineTuneJob it comes from, if any.")
    claim_name: Name | None = Field(default=None, description="The claim that holds it.")
    path: Path | None = Field(default=None, description="The file as the server pod reads it.")


class ModelServerStatus(ApiModel):
    phase: ServerPhase | None = None
    conditions: Annotated[list[Condition], Field(max_length=8)] = Field(default_factory=list)
    observed_generation: int | None = None
    message: Message | None = Field(default=None, description="Why it is not Ready, in one line.")
    endpoint: Annotated[str, Field(max_length=512)] | None = Field(
        default=None,
        description="The OpenAI-compatible API inside the cluster (POST <endpoint>/v1/chat/completions); "
        "`ftjob chat` reaches it through the API server's service proxy.",
    )
    base: ServedFile | None = None
    adapters: Annotated[list[ServedFile], Field(max_length=16)] | None = None
    replicas: int | None = Field(default=None, description="Pods of the Deployment.")
    ready_replicas: int | None = Field(default=None, description="Pods whose llama-server answers /health.")
    updated_replicas: int | None = Field(default=None, description="Pods with the spec's current adapters.")
