"""docs/trainer.md's map of the trainer is its folder tree: one row per folder, naming every module
in it and nothing that is not there, on the floor that tests/architecture/test_imports.py holds it
to. A module added, moved or removed without the map fails here."""

import re
from pathlib import Path

from tests.architecture.test_imports import TRAINER_FLOORS, floor_of

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "trainer_image" / "finetune_trainer"
HEADER = "| floor | folder (`trainer_image/finetune_trainer/`) | what it owns | its modules |"


def _map_rows() -> list[tuple[int, str, set[str]]]:
    """(floor, folder, modules) of each row; the package's top folder is `./`."""
    text = (REPO / "docs" / "trainer.md").read_text()
    rows = []
    for line in text[text.index(HEADER) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        floor, folder, _, modules = (cell.strip() for cell in line.split("|")[1:5])
        name = re.findall(r"`([^`]+)`", folder)[0].rstrip("/")
        rows.append((int(floor), name, set(re.findall(r"`([^`]+\.py)`", modules))))
    return rows


def _tree() -> dict[str, set[str]]:
    """Each folder of the package and its modules (a package's `__init__.py` is the folder's)."""
    tree = {".": {p.name for p in TRAINER.glob("*.py") if p.name != "__init__.py"}}
    for folder in TRAINER.iterdir():
        if (folder / "__init__.py").exists():
            tree[folder.name] = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    return tree


def test_the_trainer_map_names_every_folder_and_module_and_only_those() -> None:
    named: dict[str, set[str]] = {}
    for _, folder, modules in _map_rows():
        named.setdefault(folder, set()).update(modules)
    assert named == _tree()


def test_the_map_puts_each_folder_on_its_floor() -> None:
    """The map's floors are the import check's: a top module's floor is its own, a folder's the
    floor of its room."""
    for floor, folder, modules in _map_rows():
        rooms = {name.removesuffix(".py") for name in modules} if folder == "." else {folder}
        assert {floor_of(room) for room in rooms} == {floor}, f"{folder} {sorted(rooms)}: map floor {floor}"
    assert len(TRAINER_FLOORS) == 1 + max(floor for floor, _, _ in _map_rows())
