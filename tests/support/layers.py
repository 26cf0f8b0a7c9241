"""Where each of the product's packages lives: one folder per layer (`api/`, `planner/`,
`operator/`, `cli/`, `trainer_image/`), each a project of its own (its `pyproject.toml`) holding
one `finetune_*` package. Found from the tree, so a new layer needs no edit here."""

import re
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# package name -> its folder, e.g. "finetune_api" -> REPO / "api" / "finetune_api"
PACKAGES: dict[str, Path] = {init.parent.name: init.parent for init in sorted(REPO.glob("*/finetune_*/__init__.py"))}
# The layers' folders: what goes on PYTHONPATH where nothing is installed.
SOURCE_ROOTS: tuple[Path, ...] = tuple(sorted({package.parent for package in PACKAGES.values()}))


def project(package: str) -> dict[str, Any]:
    """The pyproject.toml of the layer that holds `package`."""
    with (PACKAGES[package].parent / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def distribution(package: str) -> str:
    return str(project(package)["project"]["name"])


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement.strip())
    assert match, requirement
    return match.group(0)


def layers_under(package: str) -> set[str]:
    """The packages whose layers `package`'s project declares it depends on."""
    by_distribution = {distribution(other): other for other in PACKAGES}
    names = {_requirement_name(r) for r in project(package)["project"].get("dependencies", [])}
    return {by_distribution[name] for name in names if name in by_distribution}


def closure(package: str) -> set[str]:
    """`package` and every layer it stands on, directly or not."""
    found = {package}
    todo = [package]
    while todo:
        for under in layers_under(todo.pop()) - found:
            found.add(under)
            todo.append(under)
    return found
