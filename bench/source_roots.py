"""The layers' folders of a checkout (`api/`, `planner/`, `operator/`, `cli/`, `trainer_image/`),
found from the tree: what a GPU machine, which installs none of them, puts on the path."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS: tuple[Path, ...] = tuple(sorted({init.parent.parent for init in REPO.glob("*/finetune_*/__init__.py")}))


def on_path() -> list[str]:
    """The layers' folders and the checkout itself (for `bench`), as sys.path entries."""
    return [*(str(root) for root in SOURCE_ROOTS), str(REPO)]
