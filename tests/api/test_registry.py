"""The registries' finding of their entries: whole before anyone reads them.

The operator validates specs on several worker threads at once; the first to ask finds the
entries (imports the package's modules) while the others wait. A registry read half found would
refuse a valid spec: it did, once, in the API-server restart test (two jobs ended Failed)."""

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from finetune_api.registry import Registry

PACKAGE = "slow_entries"
ENTRIES = 4


@dataclass(frozen=True)
class Thing:
    name: str
    order: int = 0


@pytest.fixture
def slow_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry[Thing]]:
    """A package whose modules each take a moment to import, then register one entry."""
    registry: Registry[Thing] = Registry("thing", PACKAGE, "spec.thing")
    folder = tmp_path / PACKAGE
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for number in range(ENTRIES):
        (folder / f"entry_{number}.py").write_text(
            "import time\n"
            "from tests.api.test_registry import REGISTRY, Thing\n"
            "time.sleep(0.05)\n"
            f"REGISTRY[0].register(Thing('thing-{number}', {number}))\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    REGISTRY[:] = [registry]
    try:
        yield registry
    finally:
        REGISTRY.clear()
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


REGISTRY: list[Registry[Thing]] = []


def test_every_thread_reads_every_entry(slow_package: Registry[Thing]) -> None:
    seen: list[tuple[str, ...]] = []
    start = threading.Barrier(8)

    def read() -> None:
        start.wait()
        seen.append(slow_package.names())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [tuple(f"thing-{n}" for n in range(ENTRIES))] * 8


def test_an_unknown_name_is_named_with_the_known_ones(slow_package: Registry[Thing]) -> None:
    with pytest.raises(KeyError, match=r"spec\.thing: unknown thing 'other' \(known: thing-0, thing-1"):
        slow_package.get("other")
