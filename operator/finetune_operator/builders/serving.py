"""`status.output`: what the job writes, where, and a command that serves each format.

Paths are the pod's (the output claim at contract.OUTPUT_MOUNT): a serving pod that mounts the
claim at the same folder runs the commands as they are.
"""

from typing import Any

from finetune_api import contract
from finetune_api.spec import FineTuneJobSpec, OutputFormat, lora_rank_warning, vllm_max_lora_rank

from . import paths


def base_model(job: str, spec: FineTuneJobSpec) -> str:
    """The name the operator knows before the pod runs: spec.model.name, the hub id, else the
    model folder (the trainer may find a better one in the checkpoint's config for the adapter)."""
    return contract.public_model_name(spec, None, paths.runtime_paths(job, spec).model)


def _serve(fmt: OutputFormat, job: str, spec: FineTuneJobSpec, files: dict[str, str]) -> str:
    rank = vllm_max_lora_rank(spec.lora.r)
    if fmt == "peft":
        return (
            f"vllm serve {base_model(job, spec)} --enable-lora --lora-modules {job}={files['path']} "
            f"--max-lora-rank {rank}"
        )
    if fmt == "merged":
        return f"vllm serve {files['path']}"
    if fmt == "gguf-lora":
        return f"llama-server -m {files['basePath']} --lora {files['path']}"
    return f"llama-server -m {files['path']}"


def _files(fmt: OutputFormat, out: str, spec: FineTuneJobSpec) -> dict[str, str]:
    kind = spec.output.gguf_type
    if fmt == "peft":
        return {"path": f"{out}/{contract.ADAPTER_DIR}"}
    if fmt == "merged":
        return {"path": f"{out}/{contract.MERGED_DIR}"}
    if fmt == "gguf-lora":
        return {"path": f"{out}/{contract.gguf_adapter_file()}", "basePath": f"{out}/{contract.gguf_base_file(kind)}"}
    return {"path": f"{out}/{contract.gguf_merged_file(kind)}"}


def output_formats(job: str, spec: FineTuneJobSpec, claim: str) -> list[dict[str, Any]]:
    out = paths.output_dir(job, spec)
    entries = []
    for fmt in spec.output.written:
        files = _files(fmt, out, spec)
        entries.append({"format": fmt, "claimName": claim, **files, "serve": _serve(fmt, job, spec, files)})
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
    }
    merged = paths.merged_path(job, spec)
    if merged:
        out["mergedPath"] = merged
    warning = lora_rank_warning(spec.lora.r)
    if warning:
        out["warning"] = warning
    return out
