"""`training.gradientCheckpointing`, `training.activationOffload` and `training.keptLayers` as a
spec says them: `auto`, true or false (offload: inputs too), and the layers kept, read here and
nowhere else (tests/architecture/test_handoff.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finetune_api.spec import TrainingSpec

Choice = bool | Literal["auto"]
OffloadChoice = bool | Literal["auto", "inputs"]


@dataclass(frozen=True)
class ActivationAsk:
    """`training.gradientCheckpointing`, `training.activationOffload` and `training.keptLayers` as
    a spec says them: the one place `auto`, true, false and inputs are read (the planner's recipe,
    its sizing, the memory savers of a retry, the trainer's choice where no plan sizes the layers)."""

    checkpointing: Choice = "auto"
    offload: OffloadChoice = "auto"
    # `keptLayers`: the layers that keep their activations under `auto` (None: the plan sizes them).
    kept: int | None = None

    @classmethod
    def of(cls, training: TrainingSpec) -> ActivationAsk:
        """From a spec's `training` block."""
        return cls(training.gradient_checkpointing, training.activation_offload, training.kept_layers)

    @property
    def recomputes(self) -> bool:
        """Whether any layer may recompute: `auto` is planned all-recompute first, then sized."""
        return self.checkpointing is not False

    @property
    def recomputes_all(self) -> bool:
        """Every layer recomputes, none kept (`true`)."""
        return self.checkpointing is True

    @property
    def offloads(self) -> bool:
        """Every layer not kept offloads (`true`)."""
        return self.offload is True

    @property
    def may_offload(self) -> bool:
        """Offload may be chosen (`auto`) or is asked (`true`)."""
        return self.offload is not False

    @property
    def inputs(self) -> bool:
        """Only the recomputing layers' inputs wait in host memory (`inputs`)."""
        return self.offload == "inputs"

    @property
    def weighs_offload(self) -> bool:
        """`auto`: offload where the speed model says it pays and the host holds it."""
        return self.offload == "auto"
