"""`make crds`: write the CRD generated from the models to crds/ and the chart's crds/.

`--check` exits 1 when a committed copy differs, so a model change without `make crds`
fails the tests instead of drifting.
"""

import argparse
import sys
from pathlib import Path

from . import server_crd
from .crd import render_yaml
from .reference import replace_block

ROOT = Path(__file__).resolve().parents[2]
TARGETS = (
    ROOT / "crds" / "finetune.dev_finetunejobs.yaml",
    ROOT / "charts" / "finetune-operator" / "crds" / "finetune.dev_finetunejobs.yaml",
)
SERVER_TARGETS = (
    ROOT / "crds" / "finetune.dev_modelservers.yaml",
    ROOT / "charts" / "finetune-operator" / "crds" / "finetune.dev_modelservers.yaml",
)


# The API reference lives in the docs; the README links it.
README = ROOT / "docs" / "api.md"


def stale_targets(text: str, targets: tuple[Path, ...] = TARGETS) -> list[Path]:
    return [t for t in targets if not t.exists() or t.read_text() != text]


def generated() -> list[tuple[str, tuple[Path, ...]]]:
    """Each CRD's text and the files that hold it."""
    return [(render_yaml(), TARGETS), (server_crd.render_yaml(), SERVER_TARGETS)]


def readme_is_stale() -> bool:
    current = README.read_text()
    return replace_block(current) != current


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_api.generate")
    parser.add_argument("--check", action="store_true", help="fail if a committed CRD is out of date")
    args = parser.parse_args()
    crds = generated()
    stale = [(text, target) for text, targets in crds for target in stale_targets(text, targets)]
    if args.check:
        names = [target for _, target in stale] + ([README] if readme_is_stale() else [])
        for target in names:
            print(f"{target.relative_to(ROOT)}: out of date, run `make crds`", file=sys.stderr)
        return 1 if names else 0
    for text, target in stale:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")
    if readme_is_stale():
        README.write_text(replace_block(README.read_text()))
        print("wrote docs/api.md (API reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
