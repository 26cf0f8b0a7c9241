"""GGUF for llama.cpp, written by llama.cpp's own converters, never by code of ours.

The converters (`convert_hf_to_gguf.py`, `convert_lora_to_gguf.py`, their `conversion/`
package and `gguf-py`) come from the pinned `llama-cpp-python` sdist: the trainer image unpacks
them to /opt/llama.cpp; elsewhere `FINETUNE_LLAMA_CPP` names the folder (`python -m
hack.llama_cpp converters` prints it). Each runs as its own process, the way llama.cpp documents
them, and reads the safetensors lazily: the merged GGUF is converted from the streamed merge's
folder, so host memory stays at about one tensor beyond what the merge held.

q4_k_m is not offered: it needs llama.cpp's C++ quantiser (`llama-quantize`), which the image
does not build; the README says how to make it from the f16 file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONVERTERS_ENV = "FINETUNE_LLAMA_CPP"
IMAGE_CONVERTERS = Path("/opt/llama.cpp")
# The converters' own output types (spec.output.ggufType).
CONVERTER_TYPES = ("f16", "q8_0")


class GgufError(RuntimeError):
    """A converter or the quantiser failed; the message is one line naming what."""


def converters() -> Path:
    folder = Path(os.environ.get(CONVERTERS_ENV) or IMAGE_CONVERTERS)
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise GgufError(f"llama.cpp's converters are not in {folder} (set {CONVERTERS_ENV})")
    return folder


def _run(script: str, *args: str) -> None:
    command = [sys.executable, str(converters() / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        raise GgufError(f"{script} failed: {lines[-1] if lines else f'exit {result.returncode}'}")


def convert_model(folder: Path, outfile: Path, gguf_type: str) -> Path:
    """A Hugging Face folder (the base, or the merged model) as one GGUF of `gguf_type`."""
    outfile.parent.mkdir(parents=True, exist_ok=True)
    if gguf_type in CONVERTER_TYPES:
        _run("convert_hf_to_gguf.py", str(folder), "--outfile", str(outfile), "--outtype", gguf_type)
        return outfile
    raise GgufError(f"spec.output.ggufType {gguf_type}: llama.cpp's converter writes {', '.join(CONVERTER_TYPES)}")


def convert_lora(adapter: Path, base: Path, outfile: Path, outtype: str) -> Path:
    """The PEFT adapter as a GGUF LoRA for `llama-server --lora`; `base` is the base's folder
    (its config.json; the base's weights are not read)."""
    outfile.parent.mkdir(parents=True, exist_ok=True)
    _run("convert_lora_to_gguf.py", str(adapter), "--base", str(base), "--outfile", str(outfile), "--outtype", outtype)
    return outfile
