"""Odds-ratio preference optimisation (`training.method: orpo`, `training.orpo`).

The loss is the chosen sequences' next-token cross-entropy (every token the pair's chosen
sequence holds, the prompt too, as TRL's ORPOTrainer takes it) less beta x log sigmoid of the
log odds ratio of the chosen over the rejected answer, from their mean per-token
log-probabilities (Hong et al.). No reference model.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import ConfigDict, Field

from finetune_api.base import ApiModel
from finetune_api.objectives import Objective, register
from finetune_api.objectives.preference import FORMATS, SEQUENCE_NAMES, SEQUENCES_PER_ROW


class OrpoSpec(ApiModel):
    model_config = ConfigDict(title="ORPO's settings")

    beta: Annotated[float, Field(gt=0, le=100)] = Field(
        default=0.1, description="Weight of the odds-ratio term against the chosen answers' cross-entropy."
    )


ORPO: Final = register(
    Objective(
        name="orpo",
        description="odds-ratio preference optimisation: SFT on the chosen answer plus an odds-ratio term "
        "(training.orpo)",
        dataset_formats=dict(FORMATS),
        trainer="finetune_trainer.objectives.preference:Orpo",
        sequences_per_row=SEQUENCES_PER_ROW,
        sequence_names=SEQUENCE_NAMES,
        # The method too: another one's checkpoint is named as such, not only by its settings block.
        tracked=("spec.training.method", "spec.dataset.format", "spec.training.orpo"),
        packs=False,
        settings=OrpoSpec,
        order=30,
    )
)
