"""A new training objective is one module: a throwaway one, written to a temporary folder and
named in FINETUNE_PLUGINS, and nothing else of the project changed.

The module (tests/support/throwaway_objectives.py) declares `halved`: its entry (it reads alpaca
only, puts two sequences per row through the model in the planner's eyes, and adds the method and
its settings block to the fingerprint), its settings block `training.halved` (`factor`, a half
unless set) and its trainer class, SFT with the loss multiplied by the factor and a figure of its
own in the progress line. The class is made on first access (a module `__getattr__`), so the
API-only processes that load the plugin (the operator, the CLI) never import the trainer or torch.

The plugin is loaded as every part loads one, in a fresh process with FINETUNE_PLUGINS set (the
spec's blocks are made on its first use; tests/architecture/test_throwaway_settings.py shows the
spec, the CRD, `ftjob validate` and admission). Shown here: the spec refuses the method where the
module is not loaded; the planner plans twice the tokens per micro-batch; and the real trainer, as
a pod runs it, trains a tiny model with it: with `halved: {factor: 0.25}` its loss at step 1 is a
quarter of SFT's on the same rows, its figure is in the progress line, and its checkpoints'
fingerprint names the method and the factor.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from finetune_api.resource import FineTuneJob
from tests.support.throwaway_objectives import HALVED, fresh_python, plugin_env

from .conftest import BASE_JOB, JobDir, make_job_dir

pytestmark = pytest.mark.trainer

STEPS = 2


FACTOR = 0.25


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process that loads the throwaway module (FINETUNE_PLUGINS)."""
    return plugin_env(tmp_path / "plugin", HALVED)


def _job(**training: object) -> FineTuneJob:
    body = json.loads(json.dumps(BASE_JOB))
    body["spec"]["training"].update(training)
    return FineTuneJob.model_validate(body)


def test_without_the_module_the_method_is_refused() -> None:
    with pytest.raises(ValidationError, match="Input should be 'sft', 'dpo', 'orpo' or 'grpo'"):
        _job(method="halved")


PLANS = """
from finetune_api.resource import FineTuneJob
from finetune_plan.gpu_products import lookup
from finetune_plan.inputs import recipe_from_spec

product = lookup("Tesla P40")
recipes = [recipe_from_spec(FineTuneJob.model_validate(body).spec, product) for body in BODIES]
print(json.dumps([[recipe.batch_size, recipe.tokens] for recipe in recipes]))
"""


def test_the_planner_plans_two_sequences_per_row(env: dict[str, str]) -> None:
    halved = json.loads(json.dumps(BASE_JOB))
    halved["spec"]["training"].update(method="halved", halved={"factor": FACTOR})
    (sft_batch, sft_tokens), (batch, tokens) = fresh_python(PLANS, env, BODIES=[BASE_JOB, halved])
    assert (batch, tokens) == (2 * sft_batch, 2 * sft_tokens)


@dataclass
class PluginJobDir(JobDir):
    """A job whose training names the plugin's method and block. This process has not loaded the
    plugin (its spec has no `training.halved`), so they are written into the trainer's config as
    the operator would pass them, and the trainer's process, which loads it, validates them."""

    plugin_training: dict[str, Any] = field(default_factory=dict)

    def config_path(self, namespace: str | None = None, name: str = "tiny") -> Path:
        path = super().config_path(namespace, name)
        config = json.loads(path.read_text(encoding="utf-8"))
        config["spec"]["training"].update(self.plugin_training)
        path.write_text(json.dumps(config), encoding="utf-8")
        return path


def _job_dir(root: Path, tiny_assets: Path) -> PluginJobDir:
    root.mkdir()
    job = make_job_dir(root, tiny_assets)
    return PluginJobDir(job.root)


def _first_losses(job: JobDir, env: dict[str, str]) -> tuple[float, dict[str, object]]:
    run = job.run(env=env)
    assert run.code == 0, run.stderr[-3000:]
    progress = run.of("progress")
    assert [p["step"] for p in progress] == list(range(1, STEPS + 1))
    return progress[0]["loss"], progress[0]


def _fingerprint(job: JobDir) -> dict[str, Any]:
    fields: dict[str, Any] = json.loads((max(job.checkpoints.glob("checkpoint-*")) / "fingerprint.json").read_text())
    return fields["fingerprint"]


def test_the_trainer_trains_with_the_new_objective(env: dict[str, str], tmp_path: Path, tiny_assets: Path) -> None:
    schedule = {"maxSteps": STEPS, "gradientCheckpointing": True}
    sft = _job_dir(tmp_path / "sft", tiny_assets)
    sft.spec_changes = {"training": schedule, "output": {"samples": {"count": 0}}}
    sft_loss, _ = _first_losses(sft, env)

    halved = _job_dir(tmp_path / "halved", tiny_assets)
    halved.spec_changes = {"training": schedule, "output": {"samples": {"count": 0}}}
    halved.plugin_training = {"method": "halved", "halved": {"factor": FACTOR}}
    loss, progress = _first_losses(halved, env)
    # Step 1's loss comes before any update: the same rows, the same model, the loss times the factor.
    assert loss == pytest.approx(sft_loss * FACTOR, rel=1e-5)
    assert progress["halvedLoss"] == loss
    fingerprint = _fingerprint(halved)
    assert (fingerprint["spec.training.method"], fingerprint["spec.training.halved.factor"]) == ("halved", FACTOR)
    assert "spec.training.method" not in _fingerprint(sft)
