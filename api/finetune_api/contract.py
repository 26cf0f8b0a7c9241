"""What the operator, the trainer and the CLI must agree on, each fact written once.

The operator builds the pod (builders/), the trainer runs inside it, and `ftjob run` plays the
pod on a laptop: where things are mounted, what the output folders are called, how the claim
the operator makes is named, which environment the libraries get, which phases are final and
how a time is written. A change here changes all three together.
"""

import datetime
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

# What the trainer writes inside its output folder (status.output points here): in layout.py,
# which the output formats (formats/) read without the spec; named here as well.
from .layout import (  # noqa: F401 (named here as well)
    ADAPTER_DIR,
    GGUF_ADAPTER_TYPE,
    GGUF_DIR,
    LOSS_CURVE_FILE,
    MERGED_DIR,
    SAMPLES_FILE,
    TENSORBOARD_DIR,
    gguf_adapter_file,
    gguf_base_file,
    gguf_merged_file,
)

if TYPE_CHECKING:
    from .object_storage import OutputS3, S3Source
    from .spec import DatasetSource, FineTuneJobSpec, HubSource, ModelSource, PvcSource
    from .status import Phase

# --- the pod's layout ------------------------------------------------------------------------

CONTAINER: Final = "trainer"
# Values of the finetune.dev/component label: the trainer's objects, and the output claim.
COMPONENT_TRAINER: Final = "trainer"
COMPONENT_OUTPUT: Final = "output"
CONFIG_DIR: Final = "/etc/finetune"
CONFIG_KEY: Final = "config.json"
CONFIG_PATH: Final = f"{CONFIG_DIR}/{CONFIG_KEY}"
# The pod template annotation that holds the config; a downwardAPI volume makes it CONFIG_PATH.
CONFIG_ANNOTATION: Final = "finetune.dev/trainer-config"
MODEL_MOUNT: Final = "/mnt/model"
DATASET_MOUNT: Final = "/mnt/dataset"
# The held-out source's claim (spec.dataset.eval.pvc), mounted on its own even when it is the
# training data's claim: its path is then read as the user wrote it, relative to its claim.
EVAL_MOUNT: Final = "/mnt/eval"
OUTPUT_MOUNT: Final = "/mnt/output"
# The object cache claim (spec.objectCache): the fetch writes the objects' copies there, the
# trainer reads them (read-only).
OBJECTS_MOUNT: Final = "/mnt/objects"
SHM_MOUNT: Final = "/dev/shm"
TMP_MOUNT: Final = "/tmp"
# Hub downloads are cached on the output claim, so a retry does not download the model again.
HUB_CACHE_DIR: Final = ".hf-cache"
HUB_CACHE: Final = f"{OUTPUT_MOUNT}/{HUB_CACHE_DIR}"
# Every folder a trainer container mounts something at; the operator fence admits no other, so a
# Job cannot lay a claim over the trainer's own code.
MOUNT_PATHS: Final = (
    CONFIG_DIR,
    OUTPUT_MOUNT,
    SHM_MOUNT,
    TMP_MOUNT,
    MODEL_MOUNT,
    DATASET_MOUNT,
    OBJECTS_MOUNT,
    EVAL_MOUNT,
)
# The container's command, and it has no args: the fence pins both to these (the chart's
# files/operator-fence-policy.yaml, held to this by tests/operator/test_fence_file.py).
TRAINER_COMMAND: Final = ("python", "-m", "finetune_trainer", "--config", CONFIG_PATH)
# The pre-flight Job's command: the same trainer, checking the inputs on the CPU before any GPU
# Job exists (the fence admits this command only in the pre-flight's shape: no GPU, no token).
CHECK_INPUTS_FLAG: Final = "--check-inputs"
PREFLIGHT_COMMAND: Final = (*TRAINER_COMMAND, CHECK_INPUTS_FLAG)
# `ftjob export NAME`'s run of the trainer: the output formats again from the saved adapter.
EXPORT_ONLY_FLAG: Final = "--export-only"
# The pre-flight Job is named after its job with this suffix, labelled with this component.
PREFLIGHT_SUFFIX: Final = "-preflight"
COMPONENT_PREFLIGHT: Final = "preflight"
# Its pods keep component "trainer", so that the chart's trainer NetworkPolicy (no ingress; DNS
# and the API server only) holds for them too; this label tells them from the trainer's.
PREFLIGHT_POD_LABEL: Final = "finetune.dev/preflight"
# The fetch Job's command: after the pre-flight listed a job's S3 objects, the same trainer on
# the CPU fetches them into the object cache claim and checks them there, before any GPU Job
# exists (the fence admits it only in its own shape, as the pre-flight's).
FETCH_INPUTS_FLAG: Final = "--fetch-inputs"
FETCH_COMMAND: Final = (*TRAINER_COMMAND, FETCH_INPUTS_FLAG)
FETCH_SUFFIX: Final = "-fetch"
COMPONENT_FETCH: Final = "fetch"


def public_model_name(spec: "FineTuneJobSpec", config_name: str | None, folder: str) -> str:
    """The base model's public name, what the adapter names (base_model_name_or_path) and a server
    serves it as: spec.model.name, else the hub id, else the name the checkpoint's config carries
    (`_name_or_path`, when it is a name and not a local folder), else the folder."""
    if spec.model.name:
        return spec.model.name
    if spec.model.source.hub is not None:
        return spec.model.source.hub.id
    if config_name and not config_name.startswith(("/", ".", "~")):
        return config_name
    return folder


# --- claims ----------------------------------------------------------------------------------

# The claim the operator makes for `output.storage` (and `ftjob run`'s folder for it).
OUTPUT_CLAIM_SUFFIX: Final = "-output"


def output_claim_name(job: str, spec: "FineTuneJobSpec") -> str:
    """The claim the job's output lands on: the user's own, or the one the operator makes."""
    if spec.output.pvc is not None:
        return spec.output.pvc.claim_name
    return f"{job}{OUTPUT_CLAIM_SUFFIX}"


def preflight_job_name(job: str) -> str:
    return f"{job}{PREFLIGHT_SUFFIX}"


# What the pre-flight says of a job's S3 objects when it passes (its termination message): this
# prefix, then JSON {"bytes": total, "sources": {role: {uri, objects, bytes}}}; the operator sizes
# the object cache claim from it. The fetch Job's: FETCHED_PREFIX, then JSON [{source, uri, ...}].
LISTED_PREFIX: Final = "Listed: "
FETCHED_PREFIX: Final = "Fetched: "
# The object cache claim's size, as the fetch Job is told it: a claim on a shared file system
# shows that file system's room, not its own.
OBJECT_CACHE_SIZE_ENV: Final = "FINETUNE_OBJECT_CACHE_SIZE"


def said_after(prefix: str, message: str) -> object:
    """The JSON a passing pre-flight or fetch said after `prefix` in its termination message;
    None when it said nothing of the kind."""
    if not message.startswith(prefix):
        return None
    try:
        return json.loads(message[len(prefix) :])
    except ValueError:
        return None


def fetch_job_name(job: str) -> str:
    return f"{job}{FETCH_SUFFIX}"


def cache_claim_name(spec: "FineTuneJobSpec") -> str:
    """The claim fetched objects are kept on: the job's own, or the one the operator makes for
    the namespace (`ftjob run`: DIR/<claimName>/ alike)."""
    from .object_storage import NAMESPACE_CACHE_CLAIM

    named = spec.object_cache.claim_name if spec.object_cache is not None else None
    return named or NAMESPACE_CACHE_CLAIM


def input_sources(spec: "FineTuneJobSpec") -> "dict[str, ModelSource | DatasetSource | None]":
    """The sources a job reads, by role: model, dataset (the training data) and eval (the held-out
    source, spec.dataset.eval; None without one)."""
    return {"model": spec.model.source, "dataset": spec.dataset.source, "eval": spec.dataset.eval}


def uses_objects(spec: "FineTuneJobSpec") -> bool:
    """Whether the job reads anything from S3 (and so has a fetch before its GPU Job)."""
    return any(source is not None and source.s3 is not None for source in input_sources(spec).values())


def store_folder(source: "S3Source") -> str:
    """The store's folder in the object cache: its endpoint's host and port, or AWS's."""
    if source.endpoint:
        return source.endpoint.split("://", 1)[1].rstrip("/")
    return f"s3.{source.region}.amazonaws.com" if source.region else "s3.amazonaws.com"


def object_copy_path(source: "S3Source") -> str:
    """Where the copy of `source` lies in the object cache, relative to its root: the store, the
    bucket and the key (a prefix's folder, or the one object's file), as in the bucket."""
    return f"{store_folder(source)}/{source.bucket}/{source.key.rstrip('/')}"


def _join(root: str, relative: str) -> str:
    return f"{root}/{relative}" if relative else root


def _hub_id(hub: "HubSource | None") -> str:
    return hub.id if hub is not None else ""


def uses_hub(spec: "FineTuneJobSpec") -> bool:
    return any(source is not None and source.hub is not None for source in input_sources(spec).values())


def trainer_paths(
    job: str, spec: "FineTuneJobSpec", mount: Callable[[str, str], str], hub_cache: str
) -> dict[str, str | None]:
    """The trainer's paths (the fields of trainer_config.RuntimePaths), given where each claim is
    mounted: `mount(role, claimName)` with role model, dataset, eval, objects or output (the pod: a
    fixed folder per role; `ftjob run`: DIR/<claimName>). An S3 source is read from its copy on
    the object cache claim."""
    model, data, held_out, out = spec.model.source, spec.dataset.source, spec.dataset.eval, spec.output
    relative = out.pvc.path if out.pvc is not None and out.pvc.path else job

    def where(role: str, pvc: "PvcSource | None", hub: "HubSource | None", s3: "S3Source | None") -> str:
        if pvc is not None:
            return _join(mount(role, pvc.claim_name), pvc.path)
        if s3 is not None:
            return _join(mount("objects", cache_claim_name(spec)), object_copy_path(s3))
        return _hub_id(hub)

    return {
        "model": where("model", model.pvc, model.hub, model.s3),
        "dataset": where("dataset", data.pvc, data.hub, data.s3),
        "eval_dataset": where("eval", held_out.pvc, held_out.hub, held_out.s3) if held_out is not None else None,
        "output": _join(mount("output", output_claim_name(job, spec)), relative),
        "cache": hub_cache if uses_hub(spec) else None,
        "objects": mount("objects", cache_claim_name(spec)) if uses_objects(spec) else None,
    }


# A path in a trainer's message ends at a blank, a colon, a semicolon, a comma or a quote.
_REST_OF_PATH: Final = r"(/[^\s:;,'\"]*)?(?=[\s:;,'\"]|$)"


def _in_claim(claim: str) -> Callable[["re.Match[str]"], str]:
    def written(match: "re.Match[str]") -> str:
        return f"claim {claim!r}, path {(match.group(1) or '').strip('/') or '/'!r}"

    return written


def on_claims(message: str, spec: "FineTuneJobSpec") -> str:
    """A trainer's message with each in-pod path of the model or dataset written as the claim and
    the path in it, the way the user wrote the spec: "/mnt/dataset/support/train.json" becomes
    "claim 'data', path 'support/train.json'" (the mount is the pod's detail, not the user's)."""
    held_out = spec.dataset.eval.pvc if spec.dataset.eval is not None else None
    mounts = ((MODEL_MOUNT, spec.model.source.pvc), (DATASET_MOUNT, spec.dataset.source.pvc), (EVAL_MOUNT, held_out))
    for mount, source in mounts:
        if source is not None:
            message = re.sub(re.escape(mount) + _REST_OF_PATH, _in_claim(source.claim_name), message)
    return message


# --- the environment the libraries read at import ----------------------------------------------

# Nothing to download: a pod must never hang on the network.
OFFLINE: Final = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# The allocator setting fights fragmentation on long runs with varying sequence lengths.
ALLOCATOR: Final = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
# torch.compile / Triton need compute capability 7.0 (Pascal is 6.1), and on the CPU a compiler.
COMPILER_OFF: Final = {"TORCHDYNAMO_DISABLE": "1"}


# The Hub token reaches the pod only as one of these, each from key HUB_TOKEN_KEY of a Secret.
HUB_TOKEN_ENV: Final = "HF_TOKEN"
DATASET_HUB_TOKEN_ENV: Final = "HF_DATASET_TOKEN"
EVAL_HUB_TOKEN_ENV: Final = "HF_EVAL_TOKEN"
HUB_TOKEN_KEY: Final = "token"
# The variable each role's token takes when its Secret is another than those before it (the
# first Secret always takes HUB_TOKEN_ENV).
_HUB_TOKEN_ENVS: Final = {"model": HUB_TOKEN_ENV, "dataset": DATASET_HUB_TOKEN_ENV, "eval": EVAL_HUB_TOKEN_ENV}


def hub_tokens(spec: "FineTuneJobSpec") -> list[tuple[str, str, str]]:
    """(role, variable, Secret) of each hub source whose tokenSecret is set, model, dataset, eval:
    the first Secret is HF_TOKEN; a role whose Secret an earlier one holds shares its variable."""
    found: list[tuple[str, str, str]] = []
    for role, source in input_sources(spec).items():
        hub = source.hub if source is not None else None
        if hub is None or hub.token_secret is None:
            continue
        taken = {secret: env for _, env, secret in found}
        env = taken.get(hub.token_secret) or (_HUB_TOKEN_ENVS[role] if found else HUB_TOKEN_ENV)
        found.append((role, env, hub.token_secret))
    return found


def hub_token_env(spec: "FineTuneJobSpec", role: str) -> str | None:
    """The variable the trainer reads `role`'s Hub token from; None when its source names no Secret."""
    return next((env for named, env, _ in hub_tokens(spec) if named == role), None)


# S3 credentials reach a pod only as these, each from the key of the same name of the Secret an
# s3 source names (object_storage.ACCESS_KEY_FIELDS), in the pods that fetch and upload alone.
# The dataset's, when its Secret is another than the model's, take DATASET_ before the name.
S3_KEY_ENV: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
DATASET_S3_PREFIX: Final = "DATASET_"
DATASET_S3_KEY_ENV: Final = tuple(DATASET_S3_PREFIX + name for name in S3_KEY_ENV)
# The held-out source's (spec.dataset.eval.s3), when its Secret is another than both of those.
EVAL_S3_PREFIX: Final = "EVAL_"
EVAL_S3_KEY_ENV: Final = tuple(EVAL_S3_PREFIX + name for name in S3_KEY_ENV)
_S3_PREFIXES: Final = {"model": "", "dataset": DATASET_S3_PREFIX, "eval": EVAL_S3_PREFIX, "output": ""}
# Whose credentials a pod holds: the pre-flight's and the fetch's, the inputs'; the trainer's,
# the output's.
S3_INPUT_ROLES: Final = ("model", "dataset", "eval")
# Where each role's s3 field is written in the spec.
S3_FIELDS: Final = {
    "model": "spec.model.source.s3",
    "dataset": "spec.dataset.source.s3",
    "eval": "spec.dataset.eval.s3",
    "output": "spec.output.s3",
}
S3_OUTPUT_ROLES: Final = ("output",)


def s3_secrets(spec: "FineTuneJobSpec", roles: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(role, environment prefix, Secret) of each of `roles` (model, dataset, eval, output) whose
    s3 names a Secret: the pod's variables are prefix + AWS_ACCESS_KEY_ID and the like."""
    sources = s3_sources(spec)
    found: list[tuple[str, str, str]] = []
    for role in roles:
        source = sources[role]
        if source is None or source.secret_name is None:
            continue
        taken = {secret: prefix for _, prefix, secret in found}
        if source.secret_name in taken:
            found.append((role, taken[source.secret_name], source.secret_name))
        else:
            found.append((role, _S3_PREFIXES[role] if found else "", source.secret_name))
    return found


def s3_sources(spec: "FineTuneJobSpec") -> "dict[str, S3Source | OutputS3 | None]":
    """Each role's s3 field (model, dataset, eval, output); None where it reads no bucket."""
    inputs = {role: source.s3 if source is not None else None for role, source in input_sources(spec).items()}
    return {**inputs, "output": spec.output.s3}


# Where the Hub is and how to reach it: the platform sets these once (the chart's
# `trainer.hubEnv`), on Hub jobs only, and the fence admits them at those values alone, since a
# Hub token sent to another endpoint is a stolen token.
HUB_ENDPOINT_ENV: Final = (
    "HF_ENDPOINT",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
)


def library_environment(*, hub: bool, compiler: bool) -> dict[str, str]:
    """The variables the pod starts with: the trainer sets the same ones for `ftjob run`."""
    return {**ALLOCATOR, **({} if hub else OFFLINE), **({} if compiler else COMPILER_OFF)}


# --- status and names ------------------------------------------------------------------------

TERMINAL_PHASES: Final[tuple["Phase", ...]] = ("Succeeded", "Failed")


def now() -> str:
    """The current time as status, Events and checkpoints write it: RFC 3339, UTC, seconds."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
