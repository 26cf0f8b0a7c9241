"""`status.output`: what the job writes, where, and a command that serves each format.

Paths are the pod's (the output claim at contract.OUTPUT_MOUNT): a serving pod that mounts the
claim at the same folder runs the commands as they are.
"""

from typing import Any

from finetune_api import contract
from finetune_api.formats import FORMATS, Where
from finetune_api.formats.peft import lora_rank_warning
from finetune_api.spec import FineTuneJobSpec

from . import paths


def base_model(job: str, spec: FineTuneJobSpec) -> str:
    """The name the operator knows before the pod runs: spec.model.name, the hub id, else the
    model folder (the trainer may find a better one in the checkpoint's config for the adapter)."""
    return contract.public_model_name(spec, None, paths.runtime_paths(job, spec).model)


def output_formats(job: str, spec: FineTuneJobSpec, claim: str) -> list[dict[str, Any]]:
    """Each written format's files and serve command, as its registry entry makes them."""
    out, lora_rank, gguf_type = paths.output_dir(job, spec), spec.lora.r, spec.output.gguf_type
    where = Where(job, out, base_model(job, spec), lora_rank, gguf_type)
    entries = []
    for name in spec.output.written:
        fmt = FORMATS.get(name)
        files = fmt.files(where)
        entries.append({"format": name, "claimName": claim, **files, "serve": fmt.serve(where, files)})
    return entries


def output_status(job: str, spec: FineTuneJobSpec, claim: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "claimName": claim,
        "adapterPath": paths.adapter_path(job, spec),
        "baseModel": base_model(job, spec),
        "rank": spec.lora.r,
        "alpha": spec.lora.alpha,
        "targetModules": list(spec.lora.target_modules),
        "formats": output_formats(job, spec, claim),
        "lossCurvePath": paths.loss_curve_path(job, spec),
        "tensorboardPath": paths.tensorboard_path(job, spec),
    }
    if spec.output.s3 is not None:
        out["s3"] = spec.output.s3.uri
    merged = paths.merged_path(job, spec)
    if merged:
        out["mergedPath"] = merged
    warning = lora_rank_warning(spec.lora.r)
    if warning:
        out["warning"] = warning
    return out
