"""docs/planner.md's map of the planner names every module and sub-package of `finetune_plan`, and
nothing that is not there: a module added, moved or removed without the map fails here."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANNER = REPO / "planner" / "finetune_plan"


def _map_rows() -> list[str]:
    text = (REPO / "docs" / "planner.md").read_text()
    start = text.index("| module (`planner/finetune_plan/`) | what it holds |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _named() -> set[str]:
    """Top-level modules and sub-packages (`search/`) as named in a row's first cell; a
    sub-package's modules as named anywhere in its row, inside the sub-package."""
    named: set[str] = set()
    for row in _map_rows():
        first, rest = row.split("|")[1], "|".join(row.split("|")[2:])
        for name in re.findall(r"`([^`]+)`", first):
            named.add(name)
            if name.endswith("/"):
                named |= {name + module for module in re.findall(r"`([a-z_]+\.py)`", rest)}
    return named


def _present() -> set[str]:
    found = set()
    for path in PLANNER.rglob("*.py"):
        if "__pycache__" in path.parts or path.name == "__init__.py":
            continue
        found.add(path.relative_to(PLANNER).as_posix())
    found |= {f"{p.name}/" for p in PLANNER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return found


def test_the_planner_map_names_every_module_and_only_those() -> None:
    named, present = _named(), _present()
    assert present - named == set(), f"modules missing from docs/planner.md's map: {sorted(present - named)}"
    assert named - present == set(), f"the map names what is not there: {sorted(named - present)}"
