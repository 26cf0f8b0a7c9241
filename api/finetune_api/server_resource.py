"""The whole `ModelServer` object as users write it in YAML."""

from typing import Annotated, Final, Literal

from pydantic import Field

from .base import ApiModel
from .constants import API_VERSION, MAX_NAME_LENGTH, SERVER_KIND
from .resource import ObjectMeta
from .server_spec import ModelServerSpec
from .server_status import ModelServerStatus

# Its name is the Service's, and a Service name is a DNS-1035 label: it starts with a letter.
SERVER_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
SERVER_NAME_MESSAGE: Final = (
    f"metadata.name must start with a letter and be at most {MAX_NAME_LENGTH} characters "
    "(it names the Service, the Deployment and its pods)"
)


class ServerMeta(ObjectMeta):
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=SERVER_NAME_PATTERN)] | None = None


class ModelServer(ApiModel):
    api_version: Literal["finetune.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ModelServer"]
    metadata: ServerMeta = Field(default_factory=ServerMeta)
    spec: ModelServerSpec
    status: ModelServerStatus | None = None


assert API_VERSION == "finetune.dev/v1alpha1" and SERVER_KIND == "ModelServer"
