"""The trainer's side of the model families (`finetune_plan.families` holds the table).

- `check`: the family of the model's config, or InvalidConfig in one line (not retried) for a
  family the trainer does not train or a target it cannot find, before any weight loads;
- `kernel`: the family's attention kernel where it has no SDPA path (Gemma 2: eager);
- `targets`: `lora.targetModules` as module names of the loaded model, checked against the
  linear modules of every decoder layer (mapped onto fused projections, `all-linear` expanded);
- `adapted`: what LoRA was put on, for the log, the status and `summary.json`;
- `take_logit_transform`: the family's soft-cap or logit scale as a per-logit function for the
  loss head, and the model's own transform of the head's output switched off (the head returns
  the summed loss, which the model's forward must not soft-cap or scale again).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from finetune_api.reasons import ExitReason
from finetune_api.spec import FineTuneJobSpec
from finetune_plan.families import FAMILIES, Family, ModelConfigError, check_model, resolve_targets
from finetune_plan.inputs import as_mapping

from ..failures import TrainerFailure
from .attention_choice import Attention

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)$")
LogitFunction = Callable[[torch.Tensor], torch.Tensor]


def check(model_config: PretrainedConfig, spec: FineTuneJobSpec) -> Family:
    """The model's family; InvalidConfig (one line) when the trainer cannot train it as asked."""
    try:
        family, targets = check_model(as_mapping(model_config), spec.lora.target_modules)
    except ModelConfigError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, str(exc)) from None
    log.info("model family %s, LoRA on %s", family.describe(), ", ".join(targets))
    return family


def kernel(family: Family, chosen: Attention) -> Attention:
    if family.kernel == "eager" and chosen != "eager":
        log.info("attention: eager, not %s: %s has no SDPA path (%s)", chosen, family.label, family.why_eager)
        return "eager"
    return chosen


def _family(model: nn.Module) -> Family | None:
    config = getattr(model, "config", None)
    return FAMILIES.get(str(getattr(config, "model_type", "")))


def layer_linears(model: nn.Module) -> list[list[str]]:
    """The linear modules of each decoder layer, by their last name, in the layer's order."""
    layers: list[list[str]] = []
    for name, module in model.named_modules():
        if LAYER.search(name) is None:
            continue
        names: list[str] = []
        for inner, child in module.named_modules():
            leaf = inner.rsplit(".", 1)[-1]
            if inner and isinstance(child, nn.Linear) and leaf not in names:
                names.append(leaf)
        layers.append(names)
    return layers


def targets(model: nn.Module, requested: Sequence[str]) -> list[str]:
    """The module names to give PEFT: every one in every decoder layer, else InvalidConfig."""
    layers = layer_linears(model)
    if not layers:
        raise TrainerFailure(
            ExitReason.InvalidConfig, f"{type(model).__name__}: no decoder layers (modules named layers.N) to adapt"
        )
    common = [name for name in layers[0] if all(name in layer for layer in layers)]
    family = _family(model) or Family(str(getattr(model.config, "model_type", "")), type(model).__name__, "model")
    try:
        return list(resolve_targets(family, requested, common, where=f" ({len(layers)} layers)"))
    except ModelConfigError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, str(exc)) from None


def adapted(model: nn.Module) -> dict[str, Any]:
    """The modules LoRA went on (by last name) and how many LoRA layers there are."""
    from peft.tuners.lora import LoraLayer

    names: list[str] = []
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            count += 1
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in names:
                names.append(leaf)
    return {"modules": names, "layers": count}


def _softcap(cap: float) -> LogitFunction:
    return lambda logits: torch.tanh(logits / cap) * cap


def _scale(factor: float) -> LogitFunction:
    return lambda logits: logits * factor


def take_logit_transform(model: nn.Module) -> LogitFunction | None:
    """The family's logit transform as a per-logit function, removed from the model's forward.

    Called once, when the loss head goes in: afterwards the model's forward returns the head's
    output untouched, and the head applies the transform to each logit before the loss."""
    family = _family(model)
    if family is None:
        return None
    config: Any = model.config
    steps: list[LogitFunction] = []
    for kind, key in family.logits:
        value = getattr(config, key, None)
        if value is None:
            continue
        if kind == "softcap":
            steps.append(_softcap(float(value)))
            setattr(config, key, None)
        elif kind == "scale":
            steps.append(_scale(float(value)))
            if hasattr(model, key):  # Cohere keeps its own copy of the config's value
                setattr(model, key, 1.0)
            setattr(config, key, 1.0)
        else:
            steps.append(_scale(1.0 / float(value)))
            setattr(config, key, 1.0)
        log.info("loss head: %s by %s = %s per logit (%s)", kind, key, value, family.label)
    if not steps:
        return None

    def transform(logits: torch.Tensor) -> torch.Tensor:
        for step in steps:
            logits = step(logits)
        return logits

    return transform
