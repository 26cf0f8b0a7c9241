"""`--check-inputs`: the pre-flight Job's run, on the CPU, before the operator creates the GPU Job.

What the trainer's first pass would find wrong before any weight loads, found without torch: the
model folder on its claim, its config.json readable and of a family the trainer trains (with the
LoRA targets it names), and the dataset (and the held-out source, spec.dataset.eval) on its claim
through the check `ftjob check-data` runs without a tokenizer (every record's format, line by
line). A bad path or a bad record then costs a CPU pod of about a second of work, not a GPU pod
after scheduling and an image pull.

Then each output format's own check (finetune_api.formats), on the model folder: for GGUF,
llama.cpp's converter's vocabulary pass over the model's own tokenizer, in a process of its own
(it imports torch: only a job that asks for GGUF pays for it).

Left to the GPU pod, which loads them anyway: the tokenizer and the token counts (importing
torch and transformers would cost the check several seconds on every job), and whatever is on
the Hub (the pre-flight pod has no network and no token).
"""

import json
import logging
from pathlib import Path
from typing import Any

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.families import ModelConfigError, check_model

from ..failures import TrainerFailure
from ..outputs.checks import check_formats

log = logging.getLogger(__name__)


def _where_model(config: TrainerConfig) -> str:
    return "spec.model.source.s3" if config.spec.model.source.s3 is not None else "spec.model.source.pvc"


def _model(config: TrainerConfig) -> dict[str, Any]:
    where = _where_model(config)
    folder = Path(config.paths.model)
    if not folder.exists():
        raise TrainerFailure(ExitReason.InvalidConfig, f"{where}: {folder}: no such folder")
    if not folder.is_dir():
        raise TrainerFailure(ExitReason.InvalidConfig, f"{where}: {folder}: a file, not a model folder")
    path = folder / "config.json"
    if not path.is_file():
        # The words model/loading.py uses, which the GPU pod would have said.
        raise TrainerFailure(
            ExitReason.InvalidConfig, f"{where}: {folder} is not a model folder (no config.json there)"
        )
    try:
        model_config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrainerFailure(
            ExitReason.InvalidConfig, f"{where}: {path}: cannot read the model config: {exc}"
        ) from None
    if not isinstance(model_config, dict):
        raise TrainerFailure(ExitReason.InvalidConfig, f"{where}: {path}: not a JSON object")
    return model_config


def check_inputs(config: TrainerConfig, *, fetched: bool = False) -> dict[str, Any]:
    """What was checked, for the log; TrainerFailure (InvalidConfig, InvalidData) at the first problem.
    `fetched`: the S3 sources' copies are on the object cache claim (the fetch Job), so they are
    checked as a claim's would be; the pre-flight, which only listed them, checks the claims alone."""
    spec = config.spec
    model_on_disk = spec.model.source.pvc is not None or (fetched and spec.model.source.s3 is not None)
    data_on_disk = spec.dataset.source.pvc is not None or (fetched and spec.dataset.source.s3 is not None)
    model_config = _model(config) if model_on_disk else None
    dataset = Path(config.paths.dataset)
    if data_on_disk and not dataset.exists():
        # Before the model's family: a wrong path is the likelier mistake, and the one to name.
        raise TrainerFailure(ExitReason.InvalidData, f"spec.dataset: {dataset}: no such file or folder")
    checked: dict[str, Any] = {}
    if model_config is not None:
        try:
            family, targets = check_model(model_config, spec.lora.target_modules)
        except ModelConfigError as exc:
            raise TrainerFailure(ExitReason.InvalidConfig, str(exc)) from None
        checked.update(model=config.paths.model, family=family.label, targets=list(targets))
    if data_on_disk:
        from ..data.loading import check_dataset

        report = check_dataset(config, tokenizer=None, model_config=None)
        checked.update(dataset=config.paths.dataset, records=report.total, samples=len(report.samples))
    checked.update(_held_out(config, fetched))
    # Each output format's own check (finetune_api.formats), e.g. llama.cpp's converter on the
    # model's tokenizer for GGUF: after the inputs, which are the likelier mistake.
    checked.update(formats=check_formats(config))
    return checked


def _held_out(config: TrainerConfig, fetched: bool) -> dict[str, Any]:
    """The held-out source (spec.dataset.eval) on its claim, checked as the training data is."""
    held_out = config.spec.dataset.eval
    if held_out is None or not (held_out.pvc is not None or (fetched and held_out.s3 is not None)):
        return {}
    path = Path(config.paths.eval_dataset or "")
    if not config.paths.eval_dataset or not path.exists():
        raise TrainerFailure(ExitReason.InvalidData, f"spec.dataset.eval: {path}: no such file or folder")
    from ..data.loading import check_dataset

    report = check_dataset(config, tokenizer=None, model_config=None, held_out=True)
    return {"evalDataset": str(path), "evalRecords": report.total, "evalSamples": len(report.samples)}
