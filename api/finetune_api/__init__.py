"""The FineTuneJob API (finetune.dev/v1alpha1) as typed pydantic models: the one source of
truth for the CRD, `ftjob validate`, the operator and the trainer's config."""

from .constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .manifest import ManifestError, ParsedDocument, parse_document, parse_file
from .problems import Problem
from .resource import FineTuneJob, ObjectMeta
from .spec import FineTuneJobSpec
from .status import Condition, FineTuneJobStatus, Phase, Progress
from .trainer_config import RuntimePaths, TrainerConfig

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "FineTuneJob",
    "FineTuneJobSpec",
    "FineTuneJobStatus",
    "ManifestError",
    "ObjectMeta",
    "ParsedDocument",
    "Phase",
    "Problem",
    "Progress",
    "RuntimePaths",
    "TrainerConfig",
    "parse_document",
    "parse_file",
]
