"""Turn validation failures into one line each: `spec.path: message`.

Users read these in a terminal and in `kubectl describe`; they never see a traceback.
"""

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _dotted(loc: Sequence[int | str], prefix: str) -> str:
    parts: list[str] = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            if parts:
                parts[-1] = f"{parts[-1]}[{item}]"
            else:
                parts.append(f"[{item}]")
        else:
            # A key with a newline or other unprintable character is quoted, so the problem stays one line.
            parts.append(item if item.isprintable() else repr(item))
    return ".".join(parts)


def _known_fields(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The camelCase fields of the model that holds `loc[-1]`, for did-you-mean hints."""
    current: type[BaseModel] | None = model
    for item in loc[:-1]:
        if current is None or isinstance(item, int):
            continue
        field = next((f for n, f in current.model_fields.items() if item in (f.alias or n, n)), None)
        if field is None:
            return []
        current = _model_in(field.annotation)
    if current is None:
        return []
    return [f.alias or n for n, f in current.model_fields.items()]


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# Names users bring from other tools (PEFT, HF TrainingArguments) that difflib can't guess.
SYNONYMS = {
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "lr": "learningRate",
    "num_train_epochs": "epochs",
    "per_device_train_batch_size": "batchSize",
    "gradient_accumulation_steps": "gradientAccumulation",
    "max_seq_length": "maxLength",
    "gpu": "gpus",
}


def suggest(name: str, known: Sequence[str]) -> str | None:
    candidates = [SYNONYMS.get(name), to_camel(name)]
    for candidate in candidates:
        if candidate in known:
            return candidate
    close = difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


def _message(error: ErrorDetails, model: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        close = suggest(str(error["loc"][-1]), _known_fields(model, error["loc"]))
        hint = f" (did you mean '{close}'?)" if close else ""
        return f"unknown field{hint}"
    if kind == "missing":
        return "required field is missing"
    message = error["msg"]
    # pydantic prefixes errors raised in our own validators; the rest reads fine as is.
    return message.removeprefix("Value error, ")


def problems_from(error: ValidationError, model: type[BaseModel], prefix: str = "") -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out: list[Problem] = []
    for detail in error.errors(include_url=False):
        loc = [p for p in detail["loc"] if not _is_union_tag(p)]
        item = (_dotted(loc, prefix), _message(detail, model))
        if item not in seen:
            seen.add(item)
            out.append(Problem(*item))
    return out


def _is_union_tag(part: int | str) -> bool:
    # pydantic names union members in locations ("function-after[...]", "int", ...);
    # users think in field paths only.
    return isinstance(part, str) and ("[" in part or part in {"int", "float", "str", "bool", "none"})


def format_problems(problems: Iterable[Problem], source: str) -> list[str]:
    return [f"{source}: {p}" for p in problems]
