"""Every example meant for the demo cluster runs to Succeeded there, applied with `kubectl apply`
as a user would, on the data the demo makes (`ftjob make-tiny-model`, as hack/demo.sh runs it):
the tiny job's sample answer is a non-empty answer from its data's domain and its loss curve lies
beside the adapter; DPO and ORPO train on the demo's pairs; the GGUF example writes its files
with the converters the node agent hands its pods, as the trainer image has them."""

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hack import llama_cpp
from hack.cluster import binaries
from tests.demo.test_demo import demo_examples
from tests.support.cli import REPO
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.install import make_claim, wait_bound

# The pods run the real trainer on the node agent's node.
pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

CLAIMS = ("models", "datasets", "outputs")
RUN_TIMEOUT = 900
PNG = b"\x89PNG\r\n\x1a\n"


def make_demo_data(volumes: dict[str, Path]) -> None:
    """The model and data of hack/demo.sh's step 4, into the claims' folders."""
    ftjob = str(REPO / ".venv" / "bin" / "ftjob")
    models, data = volumes["models"], volumes["datasets"] / "tiny"
    made = [ftjob, "make-tiny-model", str(models / "tiny-llama"), "--dataset", str(data / "alpaca.jsonl")]
    subprocess.run([*made, "--preference", str(data / "preference.jsonl")], check=True, timeout=300)
    shutil.copyfile(REPO / "examples" / "data" / "arithmetic.jsonl", data / "arithmetic.jsonl")
    gguf = [ftjob, "make-tiny-model", str(models / "tiny-llama-gguf"), "--llama-tokenizer"]
    subprocess.run(gguf, check=True, timeout=300)
    llama_cpp.converters()  # the demo unpacks them: the node agent hands their folder to its pods


@pytest.fixture
def demo_volumes(cluster: Any, core: client.CoreV1Api, namespace: str) -> dict[str, Path]:
    for claim in CLAIMS:
        make_claim(core, namespace, claim)
    folders = {}
    for claim in CLAIMS:
        wait_bound(core, namespace, claim)
        folders[claim] = Path(cluster.volume_dir(namespace, claim))
        wait_for(folders[claim].is_dir, 30, f"the folder of PVC {claim}")
    make_demo_data(folders)
    return folders


def in_claim(volumes: dict[str, Path], pod_path: str) -> Path:
    return volumes["outputs"] / Path(pod_path).relative_to("/mnt/output")


def domain(dataset: Path) -> set[str]:
    """Every word the data's answers use: what a tiny model that learned them may say."""
    answers = [json.loads(line)["output"] for line in dataset.read_text().splitlines() if line.strip()]
    return {w.lower() for answer in answers for w in re.findall(r"[A-Za-z]+", answer)}


def test_every_example_meant_for_the_demo_cluster_runs_to_succeeded(
    namespace: str, jobs: Jobs, demo_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    kubectl = binaries.resolve("kubectl")
    assert kubectl is not None, "kubectl is missing: `make cluster-up` builds it"
    examples = demo_examples()
    assert sorted(examples) == ["dpo-tiny", "grpo-tiny", "orpo-tiny", "tiny", "tiny-gguf"]
    for path in examples.values():
        subprocess.run([str(kubectl), "apply", "-n", namespace, "-f", str(path)], check=True, timeout=60)
    names = list(examples)
    done = {name: jobs.wait_phase(name, ("Succeeded", "Failed"), RUN_TIMEOUT) for name in names}
    assert {n: s["phase"] for n, s in done.items()} == dict.fromkeys(names, "Succeeded"), {
        n: s.get("message") for n, s in done.items()
    }
    tiny = done["tiny"]
    answer = tiny["sample"]["answer"]
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", answer)}
    known = domain(demo_volumes["datasets"] / "tiny" / "alpaca.jsonl")
    assert words and words <= known, f"{tiny['sample']['prompt']!r} -> {answer!r}: not from the data's domain"
    curve = in_claim(demo_volumes, tiny["output"]["lossCurvePath"])
    assert curve.read_bytes()[:8] == PNG
    summary = json.loads((curve.parent / "summary.json").read_text())
    assert summary["bestEvalLoss"] is not None and summary["bestEvalStep"] in range(1, 101)
    # GRPO: its figures in status (the mean reward and each reward's, short), every completion
    # counted, and the completions written beside the adapter with their rewards.
    grpo = done["grpo-tiny"]["progress"]
    assert {"reward", "rewards/right-answer/mean", "reward_group_std"} <= set(grpo["metrics"]), grpo
    assert grpo["metricsText"].startswith("reward "), grpo
    assert grpo["completions"] == grpo["step"] * 2 * 4, grpo  # batchSize 2 prompts x numGenerations 4
    lines = in_claim(demo_volumes, done["grpo-tiny"]["output"]["lossCurvePath"]).with_name("completions.jsonl")
    first = json.loads(lines.read_text().splitlines()[0])
    assert first["step"] == 1 and len(first["completions"]) == 4
    assert set(first["completions"][0]["rewards"]) == {"right-answer", "tidy", "short"}
    for entry in done["tiny-gguf"]["output"]["formats"]:
        for key in ("path", "basePath"):
            if entry["format"] == "gguf-lora" and entry.get(key):
                assert in_claim(demo_volumes, entry[key]).stat().st_size > 0, entry
