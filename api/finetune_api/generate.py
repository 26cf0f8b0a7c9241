"""`make crds`: write the CRD generated from the models to crds/ and the chart's crds/.

`--check` exits 1 when a committed copy differs, so a model change without `make crds`
fails the tests instead of drifting.
"""

import argparse
import sys
from pathlib import Path

from .crd import render_yaml
from .reference import replace_block

ROOT = Path(__file__).resolve().parents[2]
TARGETS = (
    ROOT / "crds" / "finetune.dev_finetunejobs.yaml",
    ROOT / "charts" / "finetune-operator" / "crds" / "finetune.dev_finetunejobs.yaml",
)


# The API reference lives in the docs; the README links it.
README = ROOT / "docs" / "api.md"


def stale_targets(text: str) -> list[Path]:
    return [t for t in TARGETS if not t.exists() or t.read_text() != text]


def readme_is_stale() -> bool:
    current = README.read_text()
    return replace_block(current) != current


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_api.generate")
    parser.add_argument("--check", action="store_true", help="fail if a committed CRD is out of date")
    args = parser.parse_args()
    text = render_yaml()
    stale = stale_targets(text)
    if args.check:
        if readme_is_stale():
            stale.append(README)
        for target in stale:
            print(f"{target.relative_to(ROOT)}: out of date, run `make crds`", file=sys.stderr)
        return 1 if stale else 0
    for target in stale:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")
    if readme_is_stale():
        README.write_text(replace_block(README.read_text()))
        print("wrote docs/api.md (API reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
