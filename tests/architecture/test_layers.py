"""The tree names the layers, and each layer is a project of its own.

Top level: `api/` (finetune_api), `planner/` (finetune_plan), `operator/` (finetune_operator, the
controller only), `cli/` (finetune_cli) and `trainer_image/` (finetune_trainer). Each folder's
`pyproject.toml` declares as dependencies exactly the layers its imports may reach
(test_imports.ALLOWED), ships every module and data file of its package (what the images
install), and `make dev` installs every layer. tests/images/test_dockerfiles.py checks that the
images install their layers with pip.
"""

import fnmatch
import re

import pytest
import setuptools

from tests.architecture.test_imports import ALLOWED
from tests.support.layers import PACKAGES, REPO, layers_under, project

FOLDER = {
    "finetune_api": "api",
    "finetune_plan": "planner",
    "finetune_operator": "operator",
    "finetune_cli": "cli",
    "finetune_trainer": "trainer_image",
}


def test_each_package_sits_in_the_folder_named_for_its_layer() -> None:
    assert {name: path.parent.relative_to(REPO).as_posix() for name, path in PACKAGES.items()} == FOLDER


@pytest.mark.parametrize("package", sorted(FOLDER))
def test_the_layer_depends_on_the_floors_its_imports_may_reach(package: str) -> None:
    assert layers_under(package) == ALLOWED[package], (
        f"{FOLDER[package]}/pyproject.toml depends on {sorted(layers_under(package))}, "
        f"its imports may reach {sorted(ALLOWED[package])}"
    )


@pytest.mark.parametrize("package", sorted(FOLDER))
def test_the_layer_ships_every_module_and_data_file(package: str) -> None:
    """What `pip install <folder>` would put in an image: setuptools' own discovery with the
    project's settings, against the files in the tree."""
    settings = project(package)["tool"]["setuptools"]
    root = PACKAGES[package]
    found = set(setuptools.find_packages(where=str(root.parent), include=settings["packages"]["find"]["include"]))
    folders = {
        ".".join(init.parent.relative_to(root.parent).parts)
        for init in root.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert folders <= found, f"not shipped: {sorted(folders - found)}"
    patterns = settings["package-data"]["*"]
    data = [
        path.relative_to(REPO).as_posix()
        for path in root.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    ]
    unshipped = [path for path in data if not any(fnmatch.fnmatch(path.rsplit("/", 1)[-1], p) for p in patterns)]
    assert not unshipped, f"data files no install carries: {unshipped}"


def test_make_dev_installs_every_layer() -> None:
    match = re.search(r"^LAYERS := (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "Makefile: no LAYERS"
    assert set(match.group(1).split()) == set(FOLDER.values())


def test_make_lint_holds_every_layer_to_mypy_strict() -> None:
    """`make lint` type-checks every package of the product, each in its layer's folder."""
    lint = re.search(r"^lint:.*?(?=^\S)", (REPO / "Makefile").read_text(), re.MULTILINE | re.DOTALL)
    assert lint, "Makefile: no lint target"
    commands = [line.split() for line in lint.group(0).splitlines() if line.startswith("\t")]
    mypy = next((words for words in commands if "--strict" in words and words[0].endswith("/mypy")), None)
    assert mypy, "make lint runs no mypy --strict"
    checked = {path for path in mypy if "/" in path and not path.startswith("$(")}
    assert checked == {f"{FOLDER[name]}/{name}" for name in FOLDER}
