"""merged: the base with the adapter added, as safetensors, streamed shard by shard
(finetune_trainer.outputs.merge_stream)."""

from finetune_api.formats import OutputFormat, Where, register
from finetune_api.layout import MERGED_DIR


def files(where: Where) -> dict[str, str]:
    return {"path": f"{where.out}/{MERGED_DIR}"}


def serve(where: Where, written: dict[str, str]) -> str:
    return f"vllm serve {written['path']}"


register(
    OutputFormat(
        "merged",
        "the base with the adapter added, safetensors, streamed shard by shard",
        files,
        serve,
        exporter="finetune_trainer.outputs.export:export_merged",
        order=20,
    )
)
