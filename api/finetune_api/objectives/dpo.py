"""Direct preference optimisation (`training.method: dpo`, `training.dpo`).

The loss of a pair is -log sigmoid(beta x ((chosen - reference chosen) - (rejected - reference
rejected))) on the answers' summed log-probabilities (`lossType: sigmoid`, Rafailov et al.), or
IPO's squared distance of the per-token log-ratios from 1/(2 beta) (`lossType: ipo`). The
reference is the same model with the adapter switched off: one more forward of each sequence,
without gradients, and no second copy of the weights.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field

from finetune_api.base import ApiModel
from finetune_api.objectives import Objective, register
from finetune_api.objectives.preference import FORMATS, SEQUENCE_NAMES, SEQUENCES_PER_ROW

DpoLossType = Literal["sigmoid", "ipo"]


class DpoSpec(ApiModel):
    model_config = ConfigDict(title="DPO's settings")

    beta: Annotated[float, Field(gt=0, le=100)] = Field(
        default=0.1, description="How far the policy may move from the reference: the log-ratios' scale."
    )
    loss_type: DpoLossType = Field(
        default="sigmoid",
        description="sigmoid = DPO's logistic loss on the summed log-ratios; ipo = IPO's squared loss on the "
        "per-token log-ratios.",
    )


DPO: Final = register(
    Objective(
        name="dpo",
        description="direct preference optimisation against the model without its adapter (training.dpo)",
        dataset_formats=dict(FORMATS),
        trainer="finetune_trainer.objectives.preference:Dpo",
        sequences_per_row=SEQUENCES_PER_ROW,
        sequence_names=SEQUENCE_NAMES,
        reference_forwards=1,
        # The method too: another one's checkpoint is named as such, not only by its settings block.
        tracked=("spec.training.method", "spec.dataset.format", "spec.training.dpo"),
        packs=False,
        settings=DpoSpec,
        order=20,
    )
)
