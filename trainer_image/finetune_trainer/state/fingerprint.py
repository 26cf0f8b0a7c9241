"""What a checkpoint's state depends on, recorded beside it, so a resume never loads the wrong one.

A checkpoint holds an adapter of one shape, optimizer and scheduler state of one schedule, and a
step that means a position in one data order (`data.batches.Schedule`). Resuming it under another
model, LoRA shape, dataset or schedule either crashes deep inside torch after the weights loaded
(another `lora.r`: a tensor size mismatch, retried on every attempt) or, worse, silently trains
on. So every checkpoint folder carries `fingerprint.json`: the spec fields its state depends on,
the identity of the model's config and of the dataset's bytes, and the checkpoint format; a start
compares the newest checkpoint's with its own before any weight loads.

The fingerprint is built from the spec the user asked for, never the tighter one an OOM retry
trains with (`launch_plan.Decision.applied`): that retry resumes its own checkpoints by design.
The data order depends on the batch only through the samples of one optimizer step, batchSize x
gradientAccumulation x processes (data.batches.Schedule), so that product is recorded, not its
factors: a checkpoint resumes on another process count with the same global batch (accumulation
doubled as the processes halve), as it always could, and refuses one that would skip or repeat data.

Besides the fingerprint the file names the job that wrote it (the FineTuneJob's uid), which is
how `spec.output.onExisting` tells a job's own checkpoints, always resumed, from another's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from finetune_api.objectives import OBJECTIVES
from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import TrainerConfig

FILE: Final = "fingerprint.json"
# Bumped when the files of a checkpoint change in a way an older trainer cannot read.
FORMAT_VERSION: Final = 1
# The dataset's identity reads at most this many bytes: its size and start, never the whole file.
HEAD_BYTES: Final = 1 << 20
MAX_FILES: Final = 64  # files of a dataset folder whose start is hashed (all are sized)

# The spec fields a checkpoint's state depends on whatever the objective, by their API path; the
# objective adds its own (finetune_api.objectives: SFT's format, trainOn and packing; DPO's and
# ORPO's method, format and settings block, beta and lossType).
TRACKED: Final = (
    "spec.model.source",
    "spec.lora",
    "spec.quantization",
    "spec.dataset.source",
    "spec.dataset.evalFraction",
    "spec.training.maxLength",
    "spec.training.seed",
    "spec.training.learningRate",
    "spec.training.lrScheduler",
    "spec.training.warmupRatio",
    "spec.training.maxSteps",
    "spec.training.epochs",
    "spec.training.optimizer",
)
MODEL_CONFIG: Final = "the model's config.json"
DATASET_BYTES: Final = "the dataset's bytes"
# An S3 source's objects as they were fetched: their keys and ETags (the copy's manifest), so a
# checkpoint made on other objects under the same key is refused as one made on other data.
MODEL_OBJECTS: Final = "the model's objects (keys and ETags)"
DATASET_OBJECTS: Final = "the dataset's objects (keys and ETags)"
FORMAT: Final = "the trainer's checkpoint format"
GLOBAL_BATCH: Final = "samples per optimizer step (batchSize x gradientAccumulation x processes)"


def _at(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for key in path.split(".")[1:]:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    # Leaves by path, so a difference names the one field (`spec.lora.r`), not its parent.
    if isinstance(value, dict):
        for key, inner in sorted(value.items()):
            _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = value


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _head(path: Path, limit: int) -> bytes:
    with path.open("rb") as handle:
        return handle.read(limit)


def model_identity(model: str) -> str | None:
    """The model folder's config.json, hashed; None for a Hub id (its revision is in the spec)."""
    config = Path(model) / "config.json"
    return _digest(config.read_bytes()) if config.is_file() else None


def base_identity(config: TrainerConfig) -> str | None:
    """The base model's config.json, hashed as `model_identity` hashes it, for a Hub model too (its
    file in the Hub cache, once the trainer has it): what the trainer reports as the job's
    status.modelFingerprint, by which a ModelServer tells adapters of one base from another's."""
    found = model_identity(config.paths.model)
    hub = config.spec.model.source.hub
    if found is not None or hub is None:
        return found
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(hub.id, "config.json", cache_dir=config.paths.cache, revision=hub.revision)
    return _digest(Path(cached).read_bytes()) if isinstance(cached, str) and Path(cached).is_file() else None


def dataset_identity(dataset: str) -> str | None:
    """Size and start of the dataset's files (a file, or a folder's files in name order); None for
    a Hub id, whose id, revision and split are in the spec. A rewrite of a file's start or a change
    of its size changes it; an edit in the middle of a large file of the same size does not."""
    root = Path(dataset)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        return None
    digest = hashlib.sha256()
    for number, path in enumerate(files):
        digest.update(f"{path.relative_to(root) if path != root else path.name}:{path.stat().st_size}\n".encode())
        if number < MAX_FILES:
            digest.update(_head(path, HEAD_BYTES))
    return f"{sum(p.stat().st_size for p in files)} bytes, sha256 of names, sizes and starts {digest.hexdigest()[:16]}"


def objects_identity(config: TrainerConfig, role: str) -> str | None:
    """The keys and ETags of the copy of an S3 source, as its manifest records them; None for a
    source not read from S3 (the field is then left out, as for checkpoints made before it)."""
    from ..objects.copies import copy_etags

    source = config.spec.model.source.s3 if role == "model" else config.spec.dataset.source.s3
    if source is None or config.paths.objects is None:
        return None
    listing = copy_etags(Path(config.paths.objects), source)
    return None if listing is None else listing.identity()


def _in_force(spec: FineTuneJobSpec) -> FineTuneJobSpec:
    """The spec with its method's settings block as it trains: an unset `training.dpo` trains
    with DPO's defaults, so it records as `dpo: {}` does (a resume is not refused over nothing)."""
    training = spec.training
    settings = training.method_settings
    if settings is None:
        return spec
    return spec.model_copy(update={"training": training.model_copy(update={training.method: settings})})


def fingerprint(config: TrainerConfig, world_size: int) -> dict[str, Any]:
    """{field: value} for everything the state of this job's checkpoints depends on, for a run of
    `world_size` processes in all."""
    spec = _in_force(config.spec).model_dump(by_alias=True, mode="json", exclude_none=True)
    fields: dict[str, Any] = {FORMAT: FORMAT_VERSION}
    for path in (*TRACKED, *OBJECTIVES.get(config.spec.training.method).tracked):
        _flatten(path, _at(spec, path), fields)
    training = config.spec.training
    fields[GLOBAL_BATCH] = training.batch_size * training.gradient_accumulation * world_size
    fields[MODEL_CONFIG] = model_identity(config.paths.model)
    fields[DATASET_BYTES] = dataset_identity(config.paths.dataset)
    for name, role in ((MODEL_OBJECTS, "model"), (DATASET_OBJECTS, "dataset")):
        if (objects := objects_identity(config, role)) is not None:
            fields[name] = objects
    return fields


def record(config: TrainerConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """What `fingerprint.json` holds: the fingerprint and the job that wrote the checkpoint."""
    return {"job": config.job_name, "jobUid": config.job_uid, "fingerprint": fields}


def write(folder: Path, content: dict[str, Any]) -> None:
    (folder / FILE).write_text(json.dumps(content, indent=1, sort_keys=True), encoding="utf-8")


def read(folder: Path) -> dict[str, Any] | None:
    """The checkpoint's record; None when it has none (written before fingerprints) or it is unreadable."""
    try:
        data = json.loads((folder / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("fingerprint"), dict) else None


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`field: checkpoint X, job Y` for each field that differs, in the fingerprint's order."""
    keys = list(current) + [k for k in saved if k not in current]
    return [
        f"{key}: checkpoint {_shown(saved.get(key))}, job {_shown(current.get(key))}"
        for key in keys
        if saved.get(key) != current.get(key)
    ]
