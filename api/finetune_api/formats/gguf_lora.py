"""gguf-lora: the adapter as a GGUF LoRA for llama.cpp's --lora, with the base as GGUF of
ggufType beside it, both written by llama.cpp's own converters (finetune_trainer.outputs.gguf_export)."""

from finetune_api.formats import OutputFormat, Where, register
from finetune_api.layout import gguf_adapter_file, gguf_base_file

# The trainer's check that llama.cpp's converter can convert the model (shared with gguf).
GGUF_CHECK = "finetune_trainer.outputs.gguf_export:check_format"


def files(where: Where) -> dict[str, str]:
    return {
        "path": f"{where.out}/{gguf_adapter_file()}",
        "basePath": f"{where.out}/{gguf_base_file(where.gguf_type)}",
    }


def serve(where: Where, written: dict[str, str]) -> str:
    return f"llama-server -m {written['basePath']} --lora {written['path']}"


register(
    OutputFormat(
        "gguf-lora",
        "the adapter for llama.cpp's --lora, with the base as GGUF beside it, by llama.cpp's own converters",
        files,
        serve,
        exporter="finetune_trainer.outputs.export:export_gguf_lora",
        check=GGUF_CHECK,
        order=30,
    )
)
