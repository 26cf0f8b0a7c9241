"""One CRD upgrade command: the README and the chart's NOTES print the same string, and it is
the one test_install.py runs (server-side, taking over the fields Helm's create owns)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMAND = "kubectl apply --server-side --force-conflicts -f charts/finetune-operator/crds/"
PLACES = (REPO / "docs" / "api.md", REPO / "charts" / "finetune-operator" / "templates" / "NOTES.txt")
# Any kubectl line that applies or replaces CRDs, however it is spelled.
CRD_COMMAND = re.compile(r"kubectl (?:apply|replace|create)\b[^\n`]*crds?\b[^\n`]*")


def test_readme_and_notes_carry_the_same_crd_upgrade_command() -> None:
    for place in PLACES:
        found = {m.group(0).strip() for m in CRD_COMMAND.finditer(place.read_text())}
        assert found == {COMMAND}, f"{place.relative_to(REPO)}: {sorted(found)}"


def test_the_command_applies_the_chart_crds_that_exist() -> None:
    folder = REPO / COMMAND.rsplit(" ", 1)[1]
    crds = ["finetune.dev_finetunejobs.yaml", "finetune.dev_modelservers.yaml"]
    assert sorted(p.name for p in folder.iterdir()) == crds
