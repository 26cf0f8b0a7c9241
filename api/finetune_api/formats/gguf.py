"""gguf: the merged model as one GGUF of ggufType, converted by llama.cpp's own converter from the
streamed merge's folder (finetune_trainer.outputs.gguf_export)."""

from finetune_api.formats import OutputFormat, Where, register
from finetune_api.formats.gguf_lora import GGUF_CHECK
from finetune_api.layout import gguf_merged_file


def files(where: Where) -> dict[str, str]:
    return {"path": f"{where.out}/{gguf_merged_file(where.gguf_type)}"}


def serve(where: Where, written: dict[str, str]) -> str:
    return f"llama-server -m {written['path']}"


register(
    OutputFormat(
        "gguf",
        "the merged model as one GGUF of ggufType, by llama.cpp's own converter",
        files,
        serve,
        exporter="finetune_trainer.outputs.export:export_gguf",
        check=GGUF_CHECK,
        order=40,
    )
)
