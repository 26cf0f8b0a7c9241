"""The bench's `grpo` phase as `bench.run.Bench` runs it: the slice built once, the prompts and
tokenizer written once for both sides, TRL's GRPOTrainer in a child (bench/trl_grpo.py), then
our GRPO through the pod's command, and the record (bench/grpo.py). A mixin: the child runner,
the record writer, the budget and the arguments are `Bench`'s.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import gpu_slug


class GrpoPhase:
    """GRPO against TRL's GRPOTrainer (its state lives on `Bench`)."""

    # Bench's, used here.
    args: Any
    date: str
    model: Path
    build: Callable[[Path, int], None]
    left_s: Callable[[], float]
    child: Callable[..., list[dict[str, Any]]]
    ours: Callable[..., dict[str, Any] | None]
    write: Callable[[str, dict[str, Any]], Path]

    def grpo(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """TRL's GRPOTrainer, then ours, on the slice, one prompt and its G completions per step."""
        from bench import grpo
        from bench.trainer_job import prepare

        self.build(self.model, self.args.layers)
        length, completion = self.args.grpo_length, self.args.grpo_completion
        work = self.args.work / "grpo"
        extra = grpo.ours_extra(length, completion, self.args.steps, self.args.warm)
        prepare({"path": str(self.model), "work": str(work), **extra})  # the links, tokenizer and prompts
        spec = {
            "work": str(work),
            "steps": self.args.steps,
            "warm": self.args.warm,
            "trl": grpo.trl_settings(completion),
            "reward": grpo.REWARD,
        }
        argv = [sys.executable, "-m", "bench.trl_grpo", json.dumps(spec)]
        trl = next((x for x in reversed(self.child("trl-grpo", argv, 1)) if x.get("event") == "trl-grpo"), None)
        ours = self.ours(1, "ours-grpo", work=str(work), **extra) if self.left_s() > 60 else None
        result = grpo.record(
            date=self.date,
            gpu=peaks[0].get("gpu"),
            layers=self.args.layers,
            length=length,
            completion=completion,
            steps=self.args.steps,
            warm=self.args.warm,
            versions=versions,
            trl=trl,
            ours=ours,
        )
        self.write(f"{self.date}-{gpu_slug(peaks)}-grpo.json", result)
        print(f"[bench] grpo: passed {result['passed']}\n{grpo.table(result)}", flush=True)
