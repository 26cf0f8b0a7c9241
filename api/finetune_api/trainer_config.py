"""What the trainer reads: the validated spec plus where things are mounted.

The operator renders this into the Job's pod template (an annotation); `ftjob run` builds it
from a local workdir. One model for both, so the pod and the laptop take the same code path.
"""

from typing import Annotated

from pydantic import Field

from .base import ApiModel
from .spec import FineTuneJobSpec


class RuntimePaths(ApiModel):
    model: Annotated[str, Field(min_length=1)] = Field(
        description="Folder of the base model, or a Hub id when downloading."
    )
    dataset: Annotated[str, Field(min_length=1)] = Field(description="Dataset file or folder, or a Hub id.")
    eval_dataset: str | None = Field(
        default=None,
        description="The held-out source (spec.dataset.eval): a file or folder, or a Hub id; None without one.",
    )
    output: Annotated[str, Field(min_length=1)] = Field(description="Writable output folder.")
    cache: str | None = Field(default=None, description="HF cache folder (hub downloads).")
    objects: str | None = Field(
        default=None, description="Folder of the object cache claim, where S3 sources are fetched to and read from."
    )


class TrainerConfig(ApiModel):
    job_name: str = Field(description="FineTuneJob name, for status patches and logs.")
    namespace: str | None = Field(default=None, description="Namespace of the FineTuneJob; None when run locally.")
    job_uid: str | None = Field(
        default=None,
        description="The FineTuneJob's uid: tells this job's own checkpoints from those of a job deleted and "
        "re-created under the same name; None when run locally (every checkpoint found is then another run's).",
    )
    spec: FineTuneJobSpec
    paths: RuntimePaths
