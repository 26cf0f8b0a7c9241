"""The training modes' words: the one table the spec, the planner and the CLI translate through.

A mode has the word the spec uses (`training.parallelism`: `dataParallel`, `fsdp`, `deviceMap`,
or `auto` for the planner's choice), the word the planner uses (`data_parallel`, `fsdp`,
`device_map`), the spellings the CLI still accepts (those of earlier releases), whether it runs
one process only, and whether `auto` may pick it. The trainer's side of each mode (how it loads,
wraps and reduces) is `finetune_trainer.modes`, keyed by the spec's word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

# The spec's words, `auto` first; a new mode adds its word here and a row to MODES below.
Parallelism = Literal["auto", "dataParallel", "fsdp", "deviceMap"]
# A mode that runs: the spec's words less `auto`.
RunMode = Literal["dataParallel", "fsdp", "deviceMap"]
AUTO: Final = "auto"


@dataclass(frozen=True)
class ModeWords:
    spec: RunMode  # the spec's word (training.parallelism)
    planner: str  # the planner's word (finetune_plan's Mode)
    one_process: bool = False  # one process drives every device of the pod, whatever it has
    auto_may_pick: bool = True  # `auto` may choose it (deviceMap keeps one GPU busy at a time: no)
    aliases: tuple[str, ...] = ()  # other spellings the CLI accepts (earlier releases')


MODES: Final[tuple[ModeWords, ...]] = (
    ModeWords("dataParallel", "data_parallel", aliases=("data_parallel",)),
    ModeWords("fsdp", "fsdp"),
    ModeWords("deviceMap", "device_map", one_process=True, auto_may_pick=False, aliases=("device_map",)),
)
BY_SPEC: Final[dict[str, ModeWords]] = {m.spec: m for m in MODES}
BY_PLANNER: Final[dict[str, ModeWords]] = {m.planner: m for m in MODES}
# Every word `training.parallelism` takes, in the spec's order.
SPEC_WORDS: Final[tuple[str, ...]] = (AUTO, *(m.spec for m in MODES))
assert get_args(Parallelism) == SPEC_WORDS, "Parallelism and MODES name the same modes"
assert tuple(m.spec for m in MODES) == get_args(RunMode), "RunMode and MODES name the same modes"


def to_planner(word: str) -> str:
    """The planner's word for a spec's word (`auto` stays `auto`)."""
    return AUTO if word == AUTO else BY_SPEC[word].planner


def to_spec(planner_word: str) -> str:
    """The spec's word for a planner's word; one the spec has no word for (`cpu`) stays as it is."""
    found = BY_PLANNER.get(planner_word)
    return found.spec if found else planner_word


def parse(text: str) -> str | None:
    """The spec's word `text` names (itself or an alias), or None."""
    if text in SPEC_WORDS:
        return text
    return next((m.spec for m in MODES if text in m.aliases), None)


def processes(word: str, slots: int) -> int:
    """Processes a pod of `slots` GPUs (or CPU processes) runs in mode `word`."""
    return 1 if BY_SPEC[word].one_process else slots


def auto_choices() -> tuple[str, ...]:
    """The planner's words of the modes `auto` may pick."""
    return tuple(m.planner for m in MODES if m.auto_may_pick)
