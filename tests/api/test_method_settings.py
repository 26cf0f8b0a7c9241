"""The methods' settings blocks come from the objectives registry (finetune_api.method_settings):
a field per objective with a settings model, after `method`, typed as the model and unset by
default; the trainer's accessor gives the block or its defaults; and a process whose registry
gains a block after the spec was built is told so instead of being given a CRD without it.
(A plugin's block, loaded as plugins are, is shown in tests/architecture/test_throwaway_settings.py.)"""

from collections.abc import Iterator

import pytest

from finetune_api import crd
from finetune_api.base import ApiModel
from finetune_api.method_settings import add_blocks
from finetune_api.objectives import OBJECTIVES, Objective
from finetune_api.objectives.dpo import DpoSpec
from finetune_api.objectives.grpo import GrpoSpec
from finetune_api.objectives.orpo import OrpoSpec
from finetune_api.spec import FineTuneJobSpec, TrainingSpec
from tests.support.specs import body


class LateSpec(ApiModel):
    every: int = 1


def _training(**training: object) -> TrainingSpec:
    fields = {"training": training, "dataset": {"format": "preference"}} if training.get("method") else {}
    return FineTuneJobSpec.model_validate(body(**fields)).training


def test_each_block_is_a_field_after_method_typed_as_its_model_and_unset_by_default() -> None:
    _training()
    names = list(TrainingSpec.model_fields)
    assert names[names.index("method") :][:5] == ["method", "dpo", "orpo", "grpo", "parallelism"]
    for name, model in (("dpo", DpoSpec), ("orpo", OrpoSpec), ("grpo", GrpoSpec)):
        field = TrainingSpec.model_fields[name]
        assert (field.annotation, field.default, field.alias) == (model | None, None, name)


def test_the_accessors_give_the_block_or_its_defaults() -> None:
    written = _training(method="dpo", dpo={"beta": 0.3, "lossType": "ipo"})
    assert written.settings_of(DpoSpec) == DpoSpec(beta=0.3, loss_type="ipo")
    assert written.method_settings == written.settings_of(DpoSpec)
    unset = _training(method="orpo")
    assert unset.orpo is None  # type: ignore[attr-defined]  # a field the registry adds
    assert unset.settings_of(OrpoSpec) == unset.method_settings == OrpoSpec()
    assert _training().method_settings is None
    with pytest.raises(LookupError, match="LateSpec is no training method's settings"):
        unset.settings_of(LateSpec)


@pytest.fixture
def late() -> Iterator[Objective]:
    """An objective with a settings block registered by hand after the spec's first use."""
    crd.spec_schema()
    entry = OBJECTIVES.register(
        Objective(name="late", description="late", dataset_formats={"alpaca": ""}, trainer="x:Y", settings=LateSpec)
    )
    try:
        yield entry
    finally:
        OBJECTIVES.unregister(entry.name)


def test_a_block_registered_after_the_spec_was_built_is_refused_not_left_out(late: Objective) -> None:
    said = "made for dpo, orpo, grpo, the training methods now bring dpo, orpo, grpo, late: "
    with pytest.raises(RuntimeError, match=said):
        crd.spec_schema()


def test_a_block_may_not_take_the_place_of_a_field(late: Objective) -> None:
    class Training(ApiModel):
        method: str = "sft"
        late: int = 0

    with pytest.raises(ValueError, match=r"training\.method late: its settings block would replace the field"):
        add_blocks(Training, after="method")
