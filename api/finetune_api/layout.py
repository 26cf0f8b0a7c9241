"""What the trainer writes inside its output folder (status.output points here): the folder and
file names every layer agrees on. No import: the output formats (formats/) read it, and the spec
reads them."""

from typing import Final

ADAPTER_DIR: Final = "adapter"
MERGED_DIR: Final = "merged"
GGUF_DIR: Final = "gguf"
# The sample answers, beside the adapter (one JSON object a line).
SAMPLES_FILE: Final = "samples.jsonl"
# The run's loss curve (train and eval loss, the learning rate), drawn at the end, beside the adapter.
LOSS_CURVE_FILE: Final = "loss-curve.png"
# The base-against-tuned evaluation (figures, per-example losses, greedy answers, seconds), beside the adapter.
EVALUATION_FILE: Final = "evaluation.json"
# The page a person reads (curves, the base-against-tuned table, the answers), self-contained, beside the adapter.
REPORT_FILE: Final = "report.html"
# TensorBoard's event files of every attempt (the curve is drawn from them).
TENSORBOARD_DIR: Final = "tensorboard"
# The GGUF adapter is f16 whatever ggufType: llama.cpp applies it to a quantised base as it is.
GGUF_ADAPTER_TYPE: Final = "f16"


def gguf_base_file(gguf_type: str) -> str:
    """The base model alone as GGUF, what llama-server -m loads under a gguf-lora adapter."""
    return f"{GGUF_DIR}/base-{gguf_type}.gguf"


def gguf_adapter_file() -> str:
    return f"{GGUF_DIR}/adapter-{GGUF_ADAPTER_TYPE}.gguf"


def gguf_merged_file(gguf_type: str) -> str:
    return f"{GGUF_DIR}/merged-{gguf_type}.gguf"
