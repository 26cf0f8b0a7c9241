"""peft: the adapter folder in PEFT's layout (adapter_config.json, adapter_model.safetensors and
the tokenizer), written by training itself; every other format is made from it. vLLM serves it
over the base model."""

from typing import Final

from finetune_api.formats import OutputFormat, Where, register
from finetune_api.layout import ADAPTER_DIR

# vLLM's default --max-lora-rank: an adapter of a higher rank needs the flag.
VLLM_DEFAULT_MAX_LORA_RANK: Final = 16
VLLM_LORA_RANKS: Final = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(r: int) -> int:
    """The smallest --max-lora-rank vLLM allows that holds rank r."""
    return next(rank for rank in VLLM_LORA_RANKS if rank >= r)


def lora_rank_warning(r: int) -> str | None:
    """The line `ftjob validate` and the status give for an adapter vLLM refuses by default."""
    if r <= VLLM_DEFAULT_MAX_LORA_RANK:
        return None
    return (
        f"lora.r is {r}: vLLM serves LoRA ranks up to {VLLM_DEFAULT_MAX_LORA_RANK} by default; "
        f"serve it with --max-lora-rank {vllm_max_lora_rank(r)}"
    )


def files(where: Where) -> dict[str, str]:
    return {"path": f"{where.out}/{ADAPTER_DIR}"}


def serve(where: Where, written: dict[str, str]) -> str:
    rank = vllm_max_lora_rank(where.lora_rank)
    return (
        f"vllm serve {where.base_model} --enable-lora --lora-modules {where.job}={written['path']} "
        f"--max-lora-rank {rank}"
    )


register(OutputFormat("peft", "the adapter folder, always written", files, serve, exporter=None, order=10))
