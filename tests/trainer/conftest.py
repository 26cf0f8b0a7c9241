"""Fixtures for the trainer tests: a tiny model made here, job folders, and a trainer runner.

The trainer runs as a real subprocess (`python -m finetune_trainer --config`), exactly as in a
pod, so SIGKILL, exit codes and the termination log are the real thing.
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.resource import FineTuneJob
from finetune_api.trainer_config import TrainerConfig
from finetune_cli.run_local import local_paths

REPO = Path(__file__).resolve().parents[2]

# The CPU recipe the tests train: NF4 double quant, fp32, LoRA on every linear layer, paged
# 8-bit AdamW, gradient checkpointing, 30 steps with checkpoints every 10 (keep 2).
BASE_JOB: dict[str, Any] = {
    "apiVersion": "finetune.dev/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "tiny"},
    "spec": {
        "model": {"source": {"pvc": {"claimName": "models", "path": "tiny-llama"}}},
        "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "alpaca.jsonl"}}, "format": "alpaca"},
        "lora": {
            "r": 8,
            "alpha": 16,
            "dropout": 0.05,
            "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        },
        "quantization": {"type": "nf4", "doubleQuant": True},
        "precision": "fp32",
        "training": {
            "maxSteps": 30,
            "learningRate": 1.0e-2,
            "warmupRatio": 0.1,
            "batchSize": 4,
            "gradientAccumulation": 1,
            "maxLength": 128,
            "gradientCheckpointing": True,
            "optimizer": "paged_adamw_8bit",
            "seed": 42,
        },
        "checkpoints": {"everySteps": 10, "keep": 2},
        # Sample answers kept short: a few dozen greedy forwards on the CPU.
        "output": {"pvc": {"claimName": "outputs"}, "samples": {"count": 2, "maxNewTokens": 12}},
        "resources": {"gpus": 0, "cpu": "1"},
    },
}


UNREACHABLE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "gone", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
    "users": [{"name": "nobody", "user": {"token": "none"}}],
    "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "nobody"}}],
    "current-context": "gone",
}


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/tiny-llama and datasets/alpaca.jsonl, made once per session (a few seconds)."""
    root = tmp_path_factory.mktemp("tiny-assets")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "finetune_cli",
            "make-tiny-model",
            str(root / "models" / "tiny-llama"),
            "--dataset",
            str(root / "datasets" / "alpaca.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    stderr: str
    termination: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]

    @property
    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("progress")}


@dataclass
class JobDir:
    """One job's workdir: claims as folders (models/, datasets/, outputs/), like `ftjob run`."""

    root: Path
    spec_changes: dict[str, Any] = field(default_factory=dict)

    @property
    def output(self) -> Path:
        return self.root / "outputs" / "tiny"

    @property
    def checkpoints(self) -> Path:
        return self.output / "checkpoints"

    def config_path(self, namespace: str | None = None, name: str = "tiny") -> Path:
        body = _merge(BASE_JOB, {"spec": self.spec_changes, "metadata": {"name": name}})
        job = FineTuneJob.model_validate(body)
        config = TrainerConfig(
            job_name=name, namespace=namespace, spec=job.spec, paths=local_paths(name, job.spec, self.root)
        )
        path = self.root / "config.json"
        path.write_text(json.dumps(config.model_dump(by_alias=True, exclude_none=True)), encoding="utf-8")
        return path

    def manifest(self) -> Path:
        path = self.root / "job.yaml"
        path.write_text(yaml.safe_dump(_merge(BASE_JOB, {"spec": self.spec_changes})), encoding="utf-8")
        return path

    def run(
        self,
        env: dict[str, str] | None = None,
        kill_when: Callable[[dict[str, Any]], bool] | None = None,
        namespace: str | None = None,
        timeout: float = 900,
    ) -> Run:
        """Run the trainer to its end, or SIGKILL it at the first event `kill_when` accepts."""
        termination = self.root / "termination-log"
        termination.unlink(missing_ok=True)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        command = [sys.executable, "-m", "finetune_trainer", "--config", str(self.config_path(namespace))]
        command += ["--termination-log", str(termination)]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=self.root
        )
        events: list[dict[str, Any]] = []
        assert process.stdout is not None
        try:
            for line in process.stdout:
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                events.append(event)
                if kill_when is not None and kill_when(event):
                    process.send_signal(signal.SIGKILL)
                    break
            _, stderr = process.communicate(timeout=timeout)
        except BaseException:
            process.kill()
            raise
        text = termination.read_text(encoding="utf-8") if termination.exists() else ""
        return Run(process.returncode, events, stderr, text)


def make_job_dir(root: Path, tiny_assets: Path) -> JobDir:
    for claim in ("models", "datasets"):
        (root / claim).symlink_to(tiny_assets / claim)
    (root / "outputs").mkdir()
    return JobDir(root)


@pytest.fixture
def job_dir(tmp_path: Path, tiny_assets: Path) -> JobDir:
    return make_job_dir(tmp_path, tiny_assets)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[JobDir, Run]:
    """One uninterrupted run of the test recipe: the curve every resumed run must reproduce."""
    root = tmp_path_factory.mktemp("reference")
    job = make_job_dir(root, tiny_assets)
    # Status patches go to a port where nothing listens: training must not notice.
    dead = root / "unreachable.kubeconfig"
    dead.write_text(yaml.safe_dump(UNREACHABLE_KUBECONFIG), encoding="utf-8")
    return job, job.run(env={"KUBECONFIG": str(dead)}, namespace="default")
