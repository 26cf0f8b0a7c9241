"""The demo's own parts that run without a cluster: the script parses, and it makes the data of
every example meant for the demo cluster (tests/demo/test_examples_on_cluster.py runs them)."""

import re
import subprocess
from pathlib import Path

import yaml

from tests.support.helm import REPO

DEMO = REPO / "hack" / "demo.sh"


def demo_examples() -> dict[str, Path]:
    """The examples the demo cluster runs, by job name: those on the CPU (gpus: 0), whose claims
    the demo fills; its GPU nodes are KWOK's, which run no trainer."""
    found = {}
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "FineTuneJob" and doc["spec"]["resources"].get("gpus", 4) == 0:
                found[doc["metadata"]["name"]] = path
    return found


def test_demo_script_parses() -> None:
    subprocess.run(["bash", "-n", str(DEMO)], check=True)


def test_the_demo_makes_the_model_and_data_of_every_example_meant_for_its_cluster() -> None:
    script = DEMO.read_text()
    written = set(re.findall(r'"\$VOLUMES/(\w+/[\w./-]+)"', script))
    examples = demo_examples()
    assert set(examples) >= {"tiny", "dpo-tiny", "orpo-tiny", "tiny-gguf"}
    for name, path in examples.items():
        spec = yaml.safe_load(path.read_text())["spec"]
        for role in ("model", "dataset"):
            pvc = spec[role]["source"]["pvc"]
            assert f"{pvc['claimName']}/{pvc['path']}" in written, (name, role, written)
