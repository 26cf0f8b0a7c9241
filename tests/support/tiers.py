"""Test tiers: the marker each test gets follows from what it needs, not from a hand-kept list.

    fast       none of the below: no control plane, no trainer stack imported, no llama.cpp,
               no binary built from source
    cluster    uses the `cluster` fixture (directly or through another fixture)
    tools      runs a binary built from source into the versioned cache (helm, promtool, MinIO's
               server) without a cluster: it uses that binary's fixture (TOOL_FIXTURES,
               tests/fixtures/tools.py, tests/fixtures/object_store.py)
    trainer    its module imports the trainer's stack (torch, transformers, ...) when it loads,
               directly or through a project module; or it is marked so by hand
    llama_cpp  needs llama.cpp built from the pinned sdist (marked by hand: one module)
    gpu        needs a CUDA GPU (`needs_gpu`); skipped where none is visible
    soak       long chaos, fuzz and load runs (`make soak`)

`make test-fast` is `-m fast`; `make test` everything but `gpu` and `soak`. A fast test promises to
need no build: one that starts a built binary, or a compiler that builds one, errors naming it
(`built_binary`, held by tests/conftest.py), so a new machine's fast tier never waits on a build
of Kubernetes or llama.cpp. A module whose tests
all carry `trainer` can never match `-m fast` or `-m "not trainer"`, so it is not even imported
(`skippable`): importing torch alone costs seconds, and the fast tier promises it never loads.
Which modules a file imports is read from its source (module-level statements only: an import
inside a function runs when the test does, not when pytest collects it).
"""

from __future__ import annotations

import ast
import itertools
import os
import shlex
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from _pytest.mark.expression import Expression

from tests.support.layers import SOURCE_ROOTS as LAYER_ROOTS

REPO = Path(__file__).resolve().parents[2]
# Where the project's modules live: the root (tests, bench, hack) and each layer's folder.
SOURCE_ROOTS = (REPO, *LAYER_ROOTS)
# Third-party packages that make a module a trainer-tier module: each pulls in torch, or is
# llama.cpp's compiled bindings (`safetensors` alone is light; its torch half is not).
HEAVY = frozenset(
    {"torch", "transformers", "peft", "bitsandbytes", "trl", "accelerate", "datasets", "llama_cpp", "safetensors.torch"}
)
TIERS = ("fast", "cluster", "tools", "trainer", "llama_cpp", "gpu", "soak")
# The fixtures that hand a test a binary built from source (tests/fixtures/tools.py; MinIO's
# server from tests/fixtures/object_store.py), and the binary each gives.
TOOL_FIXTURES = {"helm_binary": "helm", "promtool_binary": "promtool", "object_store": "minio"}
# The compilers that build the cached binaries (hack/cluster/binaries.py, hack/llama_cpp.py).
BUILDERS = frozenset({"go", "cmake", "ninja"})
# The checkout's links to the cached binaries (hack/cluster/layout.py's `bin`).
LINKED_BINARIES = Path(".cache") / "cluster" / "bin"


def module_path(name: str) -> Path | None:
    """The project file that `import name` runs, or None for a module outside the project."""
    parts = name.split(".")
    for root in SOURCE_ROOTS:
        package = root.joinpath(*parts) / "__init__.py"
        if package.is_file():
            return package
        module = root.joinpath(*parts[:-1], parts[-1] + ".py")
        if module.is_file():
            return module
    return None


def _module_name(path: Path) -> str:
    for root in sorted(SOURCE_ROOTS, key=lambda r: len(r.parts), reverse=True):
        if path.is_relative_to(root):
            parts = list(path.relative_to(root).with_suffix("").parts)
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return path.stem


def _load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module loads: not those in functions, nor under TYPE_CHECKING."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _load_time_imports(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _load_time_imports(node.body)


def _imported_names(path: Path) -> Iterator[str]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _load_time_imports(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        yield base
        # `from package import submodule` runs the submodule too.
        yield from (f"{base}.{alias.name}" for alias in node.names if module_path(f"{base}.{alias.name}"))


def _with_parents(name: str) -> Iterator[str]:
    """`import a.b.c` runs a, a.b and a.b.c."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])


_CHAINS: dict[Path, tuple[str, ...] | None] = {}


def heavy_chain(path: Path) -> tuple[str, ...] | None:
    """The chain of imports by which loading `path` imports a HEAVY package, or None."""
    path = path.resolve()
    if path in _CHAINS:
        return _CHAINS[path]
    _CHAINS[path] = None  # a module being read: an import cycle back to it adds nothing
    chain = next(_chains(path), None)
    _CHAINS[path] = chain
    return chain


def _chains(path: Path) -> Iterator[tuple[str, ...]]:
    for name in _imported_names(path):
        for step in _with_parents(name):
            if step in HEAVY:
                yield (step,)
            found = module_path(step)
            if found is not None and found.resolve() != path:
                chain = heavy_chain(found)
                if chain is not None:
                    yield (step, *chain)


def tiers_of(item_markers: set[str], fixtures: list[str], module: Path) -> set[str]:
    """Every tier marker a test carries: those set by hand plus those its needs imply."""
    tiers = {name for name in item_markers if name in TIERS}
    if "cluster" in fixtures:
        tiers.add("cluster")
    if TOOL_FIXTURES.keys() & set(fixtures):
        tiers.add("tools")
    if heavy_chain(module) is not None:
        tiers.add("trainer")
    if not tiers:
        tiers.add("fast")
    return tiers


def _can_match(markexpr: str, fixed: dict[str, bool]) -> bool:
    """Whether `markexpr` is true for some test whose markers in `fixed` are as given (every
    other name it mentions free)."""
    expression = Expression.compile(markexpr)
    names: set[str] = set()
    expression.evaluate(lambda name, **_: names.add(name) or False)
    free = sorted(names - fixed.keys())
    for values in itertools.product((False, True), repeat=len(free)):
        marked = dict(zip(free, values, strict=True)) | fixed
        if expression.evaluate(lambda name, marked=marked, **_: marked.get(name, False)):
            return True
    return False


def skippable(markexpr: str, module: Path) -> bool:
    """True when no test of a trainer-tier module can match `markexpr`, whatever else it is
    marked with: the module need not be imported at all."""
    if not markexpr or heavy_chain(module) is None:
        return False
    return not _can_match(markexpr, {"trainer": True, "fast": False})


def excludes_trainer(markexpr: str) -> bool:
    """True when `markexpr` can select no trainer-tier test (`fast`, `not trainer`, ...)."""
    return bool(markexpr) and not _can_match(markexpr, {"trainer": True, "fast": False})


def fast_only(markexpr: str) -> bool:
    """True when `markexpr` selects fast tests only (`make test-fast`'s `-m fast`)."""
    return bool(markexpr) and not _can_match(markexpr, {"fast": False})


# A fuzz test's corpus in a fast-only run: this share of what `make test` checks. The fast tier
# is the minute-long check before a commit; the full suite and `make soak` run the whole corpus.
FAST_FUZZ_SHARE = 4


def fuzz_corpus(markexpr: str, full: int) -> int:
    """How many fuzzed cases a test checks in this run: `full`, or a quarter in a fast-only run."""
    return max(1, full // FAST_FUZZ_SHARE) if fast_only(markexpr) else full


def _built(word: str, program: bool, cache: Path, search_path: str | None) -> str | None:
    """What `word` (the program, looked up on PATH, or an argument that is a path) is of the
    cache's binaries or the compilers, or None."""
    name = Path(word).name
    if program and name in BUILDERS:
        return name
    found = word if os.sep in word else shutil.which(word, path=search_path) if program else None
    if found is None:
        return None
    resolved = Path(found).resolve()
    if resolved.is_relative_to(cache):
        return resolved.relative_to(cache).as_posix()
    return name if LINKED_BINARIES.as_posix() in Path(found).as_posix() else None


def built_binary(program: str | None, args: str | Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """Which binary built from source a process would run, or None: its program or an argument in
    the versioned binary cache (a cached binary, a build writing there, a converter read from
    there) or in the checkout's links to it, or a compiler that builds one. A shell's command is
    read word by word."""
    from hack.cluster.layout import binary_cache_root

    words = [os.fsdecode(args)] if isinstance(args, str | bytes) else [os.fsdecode(a) for a in args]
    if len(words) >= 3 and Path(words[0]).name in ("sh", "bash") and words[1] == "-c":
        words = shlex.split(words[2])
    if program is not None and not words:
        words = [os.fsdecode(program)]
    cache = binary_cache_root().resolve()
    search_path = (env or os.environ).get("PATH")
    for index, word in enumerate(words):
        found = _built(word, index == 0, cache, search_path) if word else None
        if found is not None:
            return found
    return None
