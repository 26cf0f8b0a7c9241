"""The checkpoint's safetensors files, read tensor by tensor, and the bytes read from them.

A tensor is read through `safe_open`'s memory map: its bytes come from the page cache (shared,
droppable), and only the copy a read makes is this process's own memory, one tensor at a time.
`bytes_read` counts the tensor bytes this process read, so the pod's sum shows that each byte of
the checkpoint was read once per pod, not once per process.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

INDEX = "model.safetensors.index.json"
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def files_of(folder: Path) -> list[Path]:
    """The folder's safetensors files as from_pretrained picks them: those its index names, else
    `model.safetensors`, else every one there (a folder may also hold another format's copy,
    e.g. `consolidated.safetensors`); [] when none."""
    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else sorted(folder.glob("*.safetensors"))


def size_of(files: list[Path]) -> int:
    """The files' bytes: what a loader that reads every tensor of them reads."""
    return sum(path.stat().st_size for path in files)


class CheckpointFiles:
    """The files opened once (headers only); `read` copies one tensor out of its file's map."""

    def __init__(self, files: list[Path]) -> None:
        from safetensors import safe_open

        self._stack = ExitStack()
        self._where: dict[str, Any] = {}
        self.bytes_read = 0
        for path in files:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            stored: list[str] = handle.keys()  # safe_open's handle is not iterable
            self._where.update(dict.fromkeys(stored, handle))

    def names(self) -> list[str]:
        return list(self._where)

    def meta(self, key: str) -> torch.Tensor:
        """An empty tensor of the stored tensor's shape and dtype (no byte read)."""
        piece = self._where[key].get_slice(key)
        return torch.empty(piece.get_shape(), dtype=DTYPES[piece.get_dtype()], device="meta")

    def read(self, key: str) -> torch.Tensor:
        tensor: torch.Tensor = self._where[key].get_slice(key)[...]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._stack.close()
