"""Supervised fine-tuning: next-token cross-entropy on the tokens the format labels (the answer,
the assistant turns `dataset.trainOn` chooses, or every token of plain text)."""

from __future__ import annotations

from typing import Final, Literal

from finetune_api.objectives import Objective, register

SftFormat = Literal["alpaca", "sharegpt", "messages", "text", "completion"]
# The formats, in the API's order, and what a record of each holds (empty: the name says it).
# The field's description, `ftjob check-data --format` and the trainer's parsers
# (finetune_trainer.data.formats) all read this table.
FORMATS: Final[dict[SftFormat, str]] = {
    "alpaca": "instruction/input/output",
    "sharegpt": "conversations",
    "messages": "role/content, rendered with the model's chat template",
    "text": "",
    "completion": "prompt/completion",
}
# The formats rendered with the model's chat template: the ones `trainOn` chooses the loss of.
CONVERSATION_FORMATS: Final = ("messages", "sharegpt")

SFT: Final = register(
    Objective(
        name="sft",
        description="supervised fine-tuning: next-token cross-entropy on the labelled tokens",
        dataset_formats={str(name): holds for name, holds in FORMATS.items()},
        trainer="finetune_trainer.objectives.sft:Sft",
        sequences_per_row=1,
        # What a row is and which of its tokens count: the format, the turns trained on, packing.
        tracked=("spec.dataset.format", "spec.dataset.trainOn", "spec.training.packing"),
        order=10,
        conversation_formats=CONVERSATION_FORMATS,
    )
)
