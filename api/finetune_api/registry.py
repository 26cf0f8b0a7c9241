"""Registries: the seams where a training objective, an output format or an optimizer is one entry.

A registry holds entries by name, in the order the spec lists them. Its entries come from the
modules of one package (`finetune_api.objectives`, `.formats`, `.optimizers`: every module there
that calls `register` when imported, found from the folder) and from the modules named in the
environment variable `FINETUNE_PLUGINS` (comma-separated, imported by the operator, the CLI and the
trainer alike), so a new entry needs no line anywhere else. What follows from a registry reads it
when it is asked, never at import: the spec's choices (`choice`: the field's validation and its
JSON-schema enum, hence the CRD and docs/api.md), the planner's terms and the trainer's code.

An entry names the trainer's code for it by `module:function` (`implementation`), so that the API
and the planner never import the trainer (tests/architecture/test_imports.py); the trainer
resolves it with `load`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

PLUGINS_ENV = "FINETUNE_PLUGINS"


class Entry(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def order(self) -> int: ...


E = TypeVar("E", bound=Entry)


def load(implementation: str) -> Any:
    """The object `module:attribute` names (an entry's trainer code)."""
    module, _, attribute = implementation.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_plugins() -> None:
    """Import the modules FINETUNE_PLUGINS names (each registers what it holds)."""
    for name in filter(None, (part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(","))):
        importlib.import_module(name)


@dataclass
class Registry(Generic[E]):
    """Entries of one kind (`kind`, e.g. "output format"), found in `package`'s modules."""

    kind: str
    package: str
    field_path: str  # the spec field that names an entry, for messages
    _entries: dict[str, E] = field(default_factory=dict)
    _found: bool = False  # every module found and imported
    _in_progress: bool = False  # the finding thread is importing them (it may ask again)
    # The operator's workers validate specs on several threads at once: one finds the entries
    # while the others wait, or they would read a registry half found (a valid spec refused).
    # Re-entrant: the modules found register, and may ask the registry, on the finding thread.
    _finding: threading.RLock = field(default_factory=threading.RLock)

    def register(self, entry: E) -> E:
        known = self._entries.get(entry.name)
        if known is not None and known != entry:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def _discover(self) -> None:
        if self._found:
            return
        with self._finding:  # another thread waits here until every entry is in
            if self._found or self._in_progress:
                return
            self._in_progress = True
            try:
                package = importlib.import_module(self.package)
                for module in pkgutil.iter_modules(package.__path__):
                    importlib.import_module(f"{self.package}.{module.name}")
                load_plugins()
                self._found = True
            finally:
                self._in_progress = False

    def entries(self) -> tuple[E, ...]:
        self._discover()
        return tuple(sorted(self._entries.values(), key=lambda e: (e.order, e.name)))

    def __iter__(self) -> Iterator[E]:
        return iter(self.entries())

    def names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self.entries())

    def get(self, name: str) -> E:
        self._discover()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names())
            raise KeyError(f"{self.field_path}: unknown {self.kind} {name!r} (known: {known})") from None

    def choice(self, describe: Callable[[], str] | None = None) -> Choice:
        """Annotation metadata for a `str` field that names an entry of this registry."""
        return Choice(self.names, self.kind, describe)


def _expected(names: tuple[str, ...]) -> str:
    quoted = [f"'{name}'" for name in names]
    if not quoted:
        return "a registered name (none is registered)"
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@dataclass(frozen=True)
class Choice:
    """A string field whose values are a registry's names, read when validating and when the
    JSON schema is made: a value outside it gets pydantic's own literal message."""

    names: Callable[[], tuple[str, ...]]
    kind: str
    # The field's description, made when the schema is (the entries it lists may have grown).
    describe: Callable[[], str] | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], core_schema.CoreSchema]) -> Any:
        def check(value: str) -> str:
            names = self.names()
            if value not in names:
                raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": _expected(names)})
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        value = handler(schema)
        value["enum"] = list(self.names())
        if self.describe is not None:
            value["description"] = self.describe()
        return value
