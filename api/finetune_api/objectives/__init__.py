"""The training objectives `training.method` names: one entry per objective, one module each.

An objective is what training minimises and what it reads to do so. Its entry holds what every
part needs of it without the trainer's code:
- the dataset formats it reads (`spec.dataset.format`'s choices are every objective's formats;
  a format another objective reads is refused naming both fields);
- the planner's terms: how many sequences one row of its data puts through the model
  (`sequences_per_row`: a micro-batch of `batchSize` rows is that many times as many sequences,
  in memory and in time), the forwards without gradients beside the trained one
  (`reference_forwards`: time only) and whether a row's sequences may go through one micro-batch
  each when memory needs it (`sequence_names`);
- its part of the checkpoint's fingerprint (`tracked`: the spec fields its state depends on
  beyond the model, adapter, data source and schedule every objective shares);
- its settings block, `training.<name>` (`settings`: a model, optional), and the rules it adds to
  `training` while it is the method (`rules`): the spec's field, the CRD's schema and both sides'
  rules follow from them (finetune_api.method_settings);
- what it refuses of the rest of the spec: a held-out split, where it measures itself otherwise
  (`no_held_out`);
- the in-cluster Services its trainer calls (`services`, from its settings block): the operator
  lets the job's pods reach exactly those, and refuses one outside the job's namespace
  (finetune_api.services);
- the trainer's implementation (`module:Class`, a `finetune_trainer.objectives.TrainingObjective`):
  its rows and batches, its loss and its progress figures.
Every module of this package registers its entry when imported; FINETUNE_PLUGINS adds others
(finetune_api.registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from finetune_api.base import ApiModel
from finetune_api.registry import Choice, Registry
from finetune_api.services import ServiceUrl


@dataclass(frozen=True)
class Rule:
    """A rule an objective adds to `spec.training` while it is the method, said once for both
    sides so that admission and `ftjob validate` refuse alike: `cel` over the training object
    (admission's `self` is spec.training; the test of the method is added), `holds` over the
    TrainingSpec (its `settings_of` gives the block, its defaults when unset), `message` the one
    line both refuse with, `field_path` the field admission names (under training: ".grpo.rewards")."""

    cel: str
    # Takes the TrainingSpec: typed Any because the spec imports this package, not the reverse.
    holds: Callable[[Any], bool]
    message: str
    field_path: str = ""


@dataclass(frozen=True)
class Objective:
    name: str
    description: str
    dataset_formats: dict[str, str]  # format -> what a record holds (empty: the name says it)
    trainer: str  # `module:Class` of the trainer's implementation
    sequences_per_row: int = 1
    # Forwards of each sequence without gradients beside the trained one (DPO's reference: 1):
    # the planner's time, not its memory (no activations are kept).
    reference_forwards: int = 0
    # Whether `training.packing` may put several rows in one sequence (a pair's answers cannot),
    # and why not where it may not (empty: a pair's reason, PAIRS_UNPACKED).
    packs: bool = True
    unpacked: str = ""
    # The names of a row's sequences where the trainer can also run them one micro-batch each,
    # when memory needs it (the planner decides: `finetune_plan.pairs`; a preference pair's
    # chosen and rejected); empty: a row's sequences always go through the model together.
    sequence_names: tuple[str, ...] = ()
    tracked: tuple[str, ...] = ()
    order: int = 100
    # Dataset formats whose conversations `dataset.trainOn` chooses the loss of.
    conversation_formats: tuple[str, ...] = field(default=())
    # The model of its settings block, `training.<name>` (None: it has none); unset in a spec, the
    # block is the model's defaults. Its title (`ConfigDict(title="DPO's settings")`) leads the
    # field's description.
    settings: type[ApiModel] | None = None
    # Rules of `training` it adds while it is the method (`Rule`: both sides from one statement).
    rules: tuple[Rule, ...] = ()
    # Why it takes no held-out split (`dataset.evalFraction`, `dataset.eval`): what measures it
    # instead; empty: it takes one.
    no_held_out: str = ""
    # The Services its trainer pods call, from the TrainingSpec (typed Any, as `Rule.holds`):
    # the operator reads each and lets the job's pods reach its pods (builders/network.py).
    services: Callable[[Any], tuple[ServiceUrl, ...]] | None = None


OBJECTIVES: Final[Registry[Objective]] = Registry("training method", __name__, "spec.training.method")
DEFAULT: Final = "sft"


def register(entry: Objective) -> Objective:
    return OBJECTIVES.register(entry)


def dataset_formats() -> dict[str, str]:
    """Every objective's dataset formats, in the objectives' order: `spec.dataset.format`'s choices."""
    formats: dict[str, str] = {}
    for objective in OBJECTIVES:
        for name, holds in objective.dataset_formats.items():
            formats.setdefault(name, holds)
    return formats


def describe_formats(formats: Mapping[Any, str] | None = None) -> str:
    """`spec.dataset.format`'s description: each format and what a record holds (every
    objective's, when `formats` is not given)."""
    listed = dataset_formats() if formats is None else formats
    return ", ".join(f"{name} ({holds})" if holds else name for name, holds in listed.items()) + "."


def dataset_format_choice() -> Choice:
    """`spec.dataset.format`: every objective's formats, listed in its description."""
    return Choice(lambda: tuple(dataset_formats()), "dataset format", describe_formats)


def describe_methods() -> str:
    """`spec.training.method`'s description: each objective and what it does."""
    listed = "; ".join(f"{o.name} = {o.description}" for o in OBJECTIVES)
    return f"The training objective: {listed}. Each reads its own dataset formats."


# The refusals, as templates: the spec's validators fill them in Python, the CRD's CEL rules
# spell them as message expressions (finetune_api.spec), so both say the same line.
NO_PACKING: Final = "training.packing is not for training.method {method}: {why}"
# Why a method's rows are not packed, unless its entry says (`Objective.unpacked`): DPO's and ORPO's.
PAIRS_UNPACKED: Final = "a pair's answers are scored one sequence each"
NOT_READ: Final = "dataset.format {format} is not one training.method {method} reads ({known})"
NO_PAIR_SPLIT: Final = (
    "training.pairSplit: true is not for training.method {method}: its rows are not pairs of sequences to split"
)


NO_HELD_OUT: Final = "dataset.{field} is not for training.method {method}: {why}"
HELD_OUT_FIELDS: Final = ("evalFraction", "eval")


def holds_out(method: str, field: str) -> str | None:
    """None when objective `method` takes a held-out split in `dataset.<field>`, else the refusal."""
    objective = OBJECTIVES.get(method)
    if not objective.no_held_out:
        return None
    return NO_HELD_OUT.format(field=field, method=method, why=objective.no_held_out)


def services_of(training: Any) -> tuple[ServiceUrl, ...]:
    """The Services the trainer of `training` (a TrainingSpec) calls: its method's, none for most."""
    read = OBJECTIVES.get(training.method).services
    return () if read is None else read(training)


def packs(method: str) -> str | None:
    """None when objective `method` may pack its rows, else the one-line refusal."""
    objective = OBJECTIVES.get(method)
    if objective.packs:
        return None
    return NO_PACKING.format(method=method, why=unpacked_why(objective))


def unpacked_why(objective: Objective) -> str:
    """Why objective's rows are not packed (its entry's words, else a pair's)."""
    return objective.unpacked or PAIRS_UNPACKED


def splits_pairs(method: str) -> str | None:
    """None when objective `method` may run a row's sequences one pass each, else the refusal."""
    if OBJECTIVES.get(method).sequence_names:
        return None
    return NO_PAIR_SPLIT.format(method=method)


def known_formats(objective: Objective) -> str:
    return ", ".join(objective.dataset_formats)


def reads(method: str, dataset_format: str) -> str | None:
    """None when objective `method` reads `dataset_format`, else the one-line refusal."""
    objective = OBJECTIVES.get(method)
    if dataset_format in objective.dataset_formats:
        return None
    return NOT_READ.format(format=dataset_format, method=method, known=known_formats(objective))
