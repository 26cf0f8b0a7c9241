"""The bench's `evaluation` phase as `bench.run.Bench` runs it: the slice built once, one trainer
run through the pod's command on one GPU, and the record of the plan's evaluation seconds against
the trainer's (bench/evaluation.py). A mixin: the child runner, the record writer and the
arguments are `Bench`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import gpu_slug


class EvaluationPhase:
    """The evaluation's time, plan against measured (its state lives on `Bench`)."""

    # Bench's, used here.
    args: Any
    date: str
    model: Path
    build: Callable[[Path, int], None]
    ours: Callable[..., dict[str, Any] | None]
    write: Callable[[str, dict[str, Any]], Path]

    def evaluation(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """The plan's evaluation seconds against the trainer's, on the slice."""
        from bench import evaluation

        self.build(self.model, self.args.layers)
        steps = self.args.steps + self.args.warm
        gpu = peaks[0].get("gpu") or "NVIDIA H200"
        model_config = json.loads((self.model / "config.json").read_text())
        plan = evaluation.planned(model_config, self.args.seq, steps, gpu)
        ours = self.ours(1, "ours-evaluation", **evaluation.ours_extra(self.args.seq, steps))
        result = evaluation.record(
            date=self.date,
            gpu=peaks[0].get("gpu"),
            seq=self.args.seq,
            steps=steps,
            layers=self.args.layers,
            versions=versions,
            plan=plan,
            ours=ours,
        )
        self.write(f"{self.date}-{gpu_slug(peaks)}-evaluation.json", result)
        print(f"[bench] evaluation: within the band {result['withinBand']}\n{evaluation.table(result)}", flush=True)
