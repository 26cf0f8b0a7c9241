"""The training methods' settings blocks: `spec.training.<method>` for each objective whose entry
brings a settings model (`Objective.settings`), typed as that model, None (its defaults) when
unset, with the rule that a block goes with its method and the rules its entry adds.

The fields are added to the training model when its schema is first built, not when the class is
defined: by then the objectives registry has been found whole (its package's modules and those
FINETUNE_PLUGINS names, under the registry's lock), so a plugin's block is in the schema, the CRD
and the checks as DPO's is, and importing the API imports no objective. API models build on first
use for that reason (finetune_api.base). What this cannot follow is an objective with a settings
block registered, or removed, after that first build in the same process: the fields are made
once. Such a process is told so (`in_step`) instead of being handed a CRD or a block that
disagrees with its registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, TypeVar

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from .base import ApiModel
from .objectives import OBJECTIVES, Objective

BLOCK_FOR_ITS_METHOD: Final = "training.{method} is for training.method {method}"

Settings = TypeVar("Settings", bound=ApiModel)

# Each training model's own fields, kept the first time its blocks are added: a later build
# starts again from them.
_DECLARED: dict[type[BaseModel], dict[str, FieldInfo]] = {}


def with_settings() -> tuple[Objective, ...]:
    """The objectives that bring a settings block, in the registry's order (the fields' order)."""
    return tuple(o for o in OBJECTIVES if o.settings is not None)


def description(objective: Objective) -> str:
    """The block's description: its model's title (`ConfigDict(title="DPO's settings")`: the
    CRD keeps no title of its own), then what it is for."""
    assert objective.settings is not None
    title = objective.settings.model_config.get("title") or f"{objective.name}'s settings"
    return f"{title} (method {objective.name}; the defaults when unset)."


def _field(objective: Objective) -> FieldInfo:
    assert objective.settings is not None
    if not objective.name.isidentifier():
        raise ValueError(f"training.method {objective.name!r}: a settings block needs a name that is a field name")
    annotation: Any = objective.settings | None  # a type made at run time, as a class body would write it
    default = Field(default=None, alias=objective.name, description=description(objective))
    return FieldInfo.from_annotated_attribute(annotation, default)


def add_blocks(model: type[BaseModel], after: str) -> None:
    """Give `model` (the training settings) a field per objective with a settings block, after
    its field `after`, from the registry as it is now (asking it finds it whole)."""
    declared = _DECLARED.setdefault(model, dict(model.__pydantic_fields__))
    blocks = {o.name: _field(o) for o in with_settings()}
    clash = sorted(blocks.keys() & declared.keys())
    if clash:
        raise ValueError(f"training.method {clash[0]}: its settings block would replace the field training.{clash[0]}")
    fields: dict[str, FieldInfo] = {}
    for name, info in declared.items():
        fields[name] = info
        if name == after:
            fields.update(blocks)
    model.__pydantic_fields__ = fields


def blocks_among(model: type[BaseModel], names: Iterable[str]) -> tuple[str, ...]:
    """Those of `names` (fields or schema properties of `model`) that are settings blocks."""
    declared = _DECLARED.get(model, {})
    spelt = {*declared, *(info.alias for info in declared.values() if info.alias)}
    return tuple(name for name in names if name not in spelt)


def in_step(built: tuple[str, ...]) -> None:
    """Refuse to go on when the blocks a schema was built with are not the registry's now."""
    known = tuple(o.name for o in with_settings())
    if built != known:
        raise RuntimeError(
            f"spec.training's settings blocks were made for {', '.join(built) or 'none'}, the training methods "
            f"now bring {', '.join(known) or 'none'}: an objective with settings registers before the spec's "
            "first use (its package's modules or FINETUNE_PLUGINS), not after"
        )


def settings_of(training: BaseModel, model: type[Settings]) -> Settings:
    """The block of the objective whose settings `model` is, in `training`; its defaults when unset."""
    objective = next((o for o in with_settings() if o.settings is model), None)
    if objective is None:
        raise LookupError(f"{model.__name__} is no training method's settings")
    in_step(blocks_among(type(training), type(training).model_fields))
    value = getattr(training, objective.name)
    return value if isinstance(value, model) else model()


def refusal(training: BaseModel, method: str) -> str | None:
    """None when `training`'s blocks and its method's rules agree with `method`, else the line."""
    for objective in with_settings():
        if getattr(training, objective.name, None) is not None and method != objective.name:
            return BLOCK_FOR_ITS_METHOD.format(method=objective.name)
    for rule in OBJECTIVES.get(method).rules:
        if not rule.holds(training):
            return rule.message
    return None
