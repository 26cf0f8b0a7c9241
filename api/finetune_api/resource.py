"""The whole `FineTuneJob` object as users write it in YAML."""

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from .base import ApiModel, LabelMap
from .constants import API_VERSION, KIND, MAX_NAME_LENGTH
from .objectives import services_of
from .services import outside
from .spec import FineTuneJobSpec
from .status import FineTuneJobStatus

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(ApiModel):
    """The parts of metadata `ftjob validate` checks; the API server owns the rest."""

    model_config = ConfigDict(extra="allow")

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_LABEL_PATTERN)] | None = None
    generate_name: Annotated[str, Field(max_length=MAX_NAME_LENGTH)] | None = None
    namespace: Annotated[str, Field(max_length=63, pattern=DNS_LABEL_PATTERN)] | None = None
    labels: LabelMap | None = None
    annotations: dict[str, Any] | None = None


class FineTuneJob(ApiModel):
    api_version: Literal["finetune.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["FineTuneJob"]
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: FineTuneJobSpec
    status: FineTuneJobStatus | None = None

    @model_validator(mode="after")
    def _services_in_its_namespace(self) -> Self:
        """A Service the trainer calls is in the job's namespace: checked here where the manifest
        names its namespace, by the operator always (admission's rules cannot see it)."""
        if self.metadata.namespace is not None:
            refusal = outside(services_of(self.spec.training), self.metadata.namespace)
            if refusal is not None:
                raise ValueError(refusal)
        return self


assert API_VERSION == "finetune.dev/v1alpha1" and KIND == "FineTuneJob"
