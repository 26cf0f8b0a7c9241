"""The formats `output.formats` names: one entry per format, one module per format.

An entry holds what each part needs of it: the name (the spec's choice), the files it writes
(`files`: where they land in the output folder, as status.output.formats lists them), a command
that serves them (`serve`), the trainer's exporter (`module:function`, called with the trainer's
`export.Export` after the adapter is saved; None for peft, which training itself writes) and an
optional CPU pre-flight check (`module:function`, called with the trainer config before any GPU
time; it raises `FormatError` naming the cause). Every module of this package registers its entry
when imported; FINETUNE_PLUGINS adds others (finetune_api.registry).

`files` and `serve` are pure: the operator calls them when it writes status.output, long before
the trainer writes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from finetune_api.registry import Registry


class FormatError(RuntimeError):
    """A format cannot be written for this job; the message is one line naming the cause, and
    `field` the spec field to name when it is not the format itself (e.g. spec.output.ggufType)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def said(self, name: str) -> str:
        """The one line a user reads: the field, and the format when the field is the list's."""
        return f"{self.field}: {self}" if self.field else f"{FORMATS.field_path}: {name}: {self}"


@dataclass(frozen=True)
class Where:
    """What a format's files and serve command are made from: the job, its output folder in the
    pod, the base model's public name and the spec's facts a format reads (plain values: the
    formats stand under the spec, which lists them)."""

    job: str
    out: str
    base_model: str
    lora_rank: int  # spec.lora.r
    gguf_type: str  # spec.output.ggufType


@dataclass(frozen=True)
class OutputFormat:
    name: str
    description: str
    files: Callable[[Where], dict[str, str]]  # {"path": ..., and e.g. "basePath": ...} in the output folder
    serve: Callable[[Where, dict[str, str]], str]  # a command that serves those files
    exporter: str | None  # the trainer's `module:function(export) -> Path`; None: written by training
    check: str | None = None  # the trainer's `module:function(config) -> None`, on the CPU before any GPU
    order: int = 100  # where the spec and status list it


FORMATS: Final[Registry[OutputFormat]] = Registry("output format", __name__, "spec.output.formats")
# Always written: the others are made from it.
ALWAYS: Final = "peft"


def register(entry: OutputFormat) -> OutputFormat:
    return FORMATS.register(entry)


def checks(asked: Iterable[str]) -> dict[str, str]:
    """The pre-flight checks of the written formats, each once, with the first format naming it."""
    found: dict[str, str] = {}
    for name in written(asked):
        check = FORMATS.get(name).check
        if check is not None and check not in found:
            found[check] = name
    return found


def written(asked: Iterable[str]) -> tuple[str, ...]:
    """The formats written for `asked`, in the registry's order: peft always."""
    wanted = {ALWAYS, *asked}
    return tuple(name for name in FORMATS.names() if name in wanted)


@dataclass(frozen=True)
class Described:
    """A spec field's description ending with the registry's entries, read when the JSON schema is
    made (the CRD and docs/api.md), so a new format is described where it is chosen."""

    lead: str
    tail: str = ""

    def text(self) -> str:
        listed = [f"{entry.name} ({entry.description})" for entry in FORMATS]
        joined = listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} and {listed[-1]}"
        return f"{self.lead} {joined}.{' ' + self.tail if self.tail else ''}"

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        value: dict[str, Any] = handler(schema)
        value["description"] = self.text()
        return value
