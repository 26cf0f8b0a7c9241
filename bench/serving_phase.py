"""The bench's `serving` phase as `bench.run.Bench` runs it: one child (bench/serving.py) on one
GPU, its last line written as the record. A mixin: the child runner, the record writer, the
budget and the arguments are `Bench`'s.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import gpu_slug

REPO = Path(__file__).resolve().parents[1]
# Where `python -m bench.serving pack` puts the trimmed llama.cpp source a GPU call carries.
SERVING_SOURCE = REPO / ".bench-llama"
# The served model: the trainer's tiny Llama at about 180M parameters (f16 GGUF about 350 MB).
SERVING_SIZES = {"hidden": 1024, "layers": 16, "heads": 16, "kv_heads": 4, "intermediate": 2816}


class ServingPhase:
    """llama-server as the serving image builds it, on this GPU (its state lives on `Bench`)."""

    # Bench's, used here.
    args: Any
    date: str
    left_s: Callable[[], float]
    child: Callable[..., list[dict[str, Any]]]
    write: Callable[[str, dict[str, Any]], Path]

    def serving(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """llama-server as the serving image builds it, on this GPU (bench/serving.py)."""
        source = self.args.serving_source
        if source.is_dir():
            source = next(iter(sorted(source.glob("*.tar.gz"))), source)
        spec = {"work": str(self.args.work / "serving"), "source": str(source), "sizes": SERVING_SIZES}
        argv = [sys.executable, "-m", "bench.serving", "run", json.dumps(spec)]
        lines = self.child("serving", argv, 1, timeout=self.left_s())
        found = next((x for x in reversed(lines) if x.get("event") == "bench-serving"), None)
        if found is None:
            return
        record = {"date": self.date, "gpu": peaks[0].get("gpu"), "versions": versions, **found}
        record.pop("event", None)
        self.write(f"{self.date}-{gpu_slug(peaks)}-serving.json", record)
