"""The README's map of the trainer names every module and sub-package of `finetune_trainer`, and
nothing that is not there: a module added or removed without the map fails here."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "trainer_image" / "finetune_trainer"


def _map_rows() -> list[str]:
    text = (REPO / "docs" / "trainer.md").read_text()
    start = text.index("| module (`trainer_image/finetune_trainer/`) | what it holds |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return rows


def test_the_trainer_map_names_every_module_and_only_those() -> None:
    named = {name.rstrip("/") for row in _map_rows() for name in re.findall(r"`([^`]+)`", row)}
    present = {p.name for p in TRAINER.glob("*.py") if p.name != "__init__.py"}
    present |= {p.name for p in TRAINER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert present - named == set(), f"modules missing from the README's trainer map: {sorted(present - named)}"
    assert named - present == set(), f"the map names what is not there: {sorted(named - present)}"
