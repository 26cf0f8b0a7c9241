"""GGUF for llama.cpp, written by llama.cpp's own converters, never by code of ours.

The converters (`convert_hf_to_gguf.py`, `convert_lora_to_gguf.py`, their `conversion/`
package and `gguf-py`) come from the pinned `llama-cpp-python` sdist: the trainer image unpacks
them to /opt/llama.cpp; elsewhere `FINETUNE_LLAMA_CPP` names the folder (`python -m
hack.llama_cpp converters` prints it). Each runs as its own process, the way llama.cpp documents
them, and reads the safetensors lazily: the merged GGUF is converted from the streamed merge's
folder, so host memory stays at about one tensor beyond what the merge held.

f16 and q8_0 are the converter's own output types. q4_k_m is llama.cpp's C++ quantiser's:
the converter writes f16 beside the target, `llama-quantize` (built by the trainer image from the
same sdist's tree, /opt/llama.cpp/bin; elsewhere `FINETUNE_LLAMA_QUANTIZE` names it, else PATH;
`python -m hack.llama_cpp tools` builds it here) makes Q4_K_M of it, and the f16 file is removed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from finetune_api.formats import FormatError

if TYPE_CHECKING:
    from finetune_api.trainer_config import TrainerConfig

CONVERTERS_ENV = "FINETUNE_LLAMA_CPP"
IMAGE_CONVERTERS = Path("/opt/llama.cpp")
QUANTIZE_ENV = "FINETUNE_LLAMA_QUANTIZE"
QUANTIZE = "llama-quantize"
IMAGE_QUANTIZE = IMAGE_CONVERTERS / "bin" / QUANTIZE
# The converters' own output types (spec.output.ggufType).
CONVERTER_TYPES = ("f16", "q8_0")
# The types llama-quantize makes from the converter's f16 file, by its own names.
QUANTIZED_TYPES = {"q4_k_m": "Q4_K_M"}


class GgufError(FormatError):
    """A converter or the quantiser failed; the message is one line naming what."""


def converters() -> Path:
    folder = Path(os.environ.get(CONVERTERS_ENV) or IMAGE_CONVERTERS)
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise GgufError(f"llama.cpp's converters are not in {folder} (set {CONVERTERS_ENV})")
    return folder


def quantizer() -> Path:
    """llama-quantize: FINETUNE_LLAMA_QUANTIZE, else the image's, else the one on PATH."""
    named = os.environ.get(QUANTIZE_ENV)
    if named:
        if not os.access(named, os.X_OK):
            raise GgufError(f"{QUANTIZE} is not at {named} ({QUANTIZE_ENV})")
        return Path(named)
    if os.access(IMAGE_QUANTIZE, os.X_OK):
        return IMAGE_QUANTIZE
    found = shutil.which(QUANTIZE)
    if not found:
        raise GgufError(f"{QUANTIZE} is missing: not in {IMAGE_QUANTIZE.parent} nor on PATH (set {QUANTIZE_ENV})")
    return Path(found)


def check_tools(gguf_type: str) -> None:
    """Before training: what the export of `gguf_type` will need is there (one line if not)."""
    converters()
    if gguf_type in QUANTIZED_TYPES:
        quantizer()


def check_format(config: TrainerConfig) -> None:
    """The GGUF formats' pre-flight, on the CPU before any GPU time: the converters (and
    llama-quantize for q4_k_m) are there, and llama.cpp's converter takes the model's own tokenizer
    (`check_vocabulary`) when the model is a folder here. Imports no torch itself."""
    # Each missing tool named with the field that asks for it: the converters serve every GGUF
    # format (spec.output.formats), llama-quantize only ggufType's quantised types.
    try:
        converters()
    except GgufError as exc:
        raise GgufError(str(exc), field="spec.output.formats") from None
    try:
        check_tools(config.spec.output.gguf_type)
    except GgufError as exc:
        raise GgufError(str(exc), field="spec.output.ggufType") from None
    folder = Path(config.paths.model)
    if folder.is_dir():
        check_vocabulary(folder)


# What the converter says of a tokenizer it cannot take, in its own words (the exception's line).
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception)|NotImplementedError|AssertionError): (?P<said>.+)$")


def check_vocabulary(folder: Path) -> None:
    """Run the converter's own vocabulary pass (`convert_hf_to_gguf.py --vocab-only`: the model
    class's set_vocab, get_vocab_base_pre's tokenizer hash and all) on the model folder, into a
    scratch file: a tokenizer it refuses fails here, in one line, not after training. It runs in
    its own process, which imports torch, so the pre-flight itself stays torch-free."""
    with tempfile.TemporaryDirectory(prefix="gguf-vocab-") as scratch:
        outfile = Path(scratch) / "vocab.gguf"
        command = [sys.executable, str(converters() / "convert_hf_to_gguf.py"), str(folder), "--vocab-only"]
        result = subprocess.run([*command, "--outfile", str(outfile)], capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    said = next((m["said"] for line in reversed(lines) if (m := _EXCEPTION_LINE.match(line))), None)
    cause = said or (lines[-1] if lines else f"exit {result.returncode}")
    raise GgufError(f"llama.cpp's converter cannot convert this model's tokenizer: {cause}")


def _failed(name: str, result: subprocess.CompletedProcess[str]) -> GgufError:
    lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    return GgufError(f"{name} failed: {lines[-1] if lines else f'exit {result.returncode}'}")


def _run(script: str, *args: str) -> None:
    command = [sys.executable, str(converters() / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise _failed(script, result)


def quantize(source: Path, outfile: Path, gguf_type: str) -> Path:
    """llama-quantize SOURCE OUTFILE TYPE: an f16 GGUF as `gguf_type` (q4_k_m)."""
    command = [str(quantizer()), str(source), str(outfile), QUANTIZED_TYPES[gguf_type]]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise _failed(QUANTIZE, result)
    return outfile


def convert_model(folder: Path, outfile: Path, gguf_type: str) -> Path:
    """A Hugging Face folder (the base, or the merged model) as one GGUF of `gguf_type`."""
    outfile.parent.mkdir(parents=True, exist_ok=True)
    if gguf_type in CONVERTER_TYPES:
        _run("convert_hf_to_gguf.py", str(folder), "--outfile", str(outfile), "--outtype", gguf_type)
        return outfile
    if gguf_type in QUANTIZED_TYPES:
        quantizer()  # missing: fail before the conversion, not after
        f16 = outfile.with_name(f".{outfile.name}.f16")
        try:
            convert_model(folder, f16, "f16")
            return quantize(f16, outfile, gguf_type)
        finally:
            f16.unlink(missing_ok=True)
    known = [*CONVERTER_TYPES, *QUANTIZED_TYPES]
    raise GgufError(f"spec.output.ggufType {gguf_type}: llama.cpp writes {', '.join(known)}")


def convert_lora(adapter: Path, base: Path, outfile: Path, outtype: str) -> Path:
    """The PEFT adapter as a GGUF LoRA for `llama-server --lora`; `base` is the base's folder
    (its config.json; the base's weights are not read)."""
    outfile.parent.mkdir(parents=True, exist_ok=True)
    _run("convert_lora_to_gguf.py", str(adapter), "--base", str(base), "--outfile", str(outfile), "--outtype", outtype)
    return outfile
