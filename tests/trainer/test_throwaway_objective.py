"""A new training objective is one module: a throwaway one, written to a temporary folder and
named in FINETUNE_PLUGINS, and nothing else of the project changed.

The module declares `halved` (its entry: it reads alpaca only, puts two sequences per row through
the model in the planner's eyes, and adds `spec.training.method` to the fingerprint) and its
trainer class, SFT with the loss halved and a figure of its own in the progress line. The class is
made on first access (a module `__getattr__`), so the API-only processes that load the plugin (the
operator, the CLI) never import the trainer or torch.

Shown: the spec takes the new method and refuses a dataset format it does not read, naming both
fields; the CRD's enum and the API reference list it; the planner plans twice the tokens per
micro-batch; and the real trainer, as a pod runs it, trains a tiny model with it: its loss at step 1
is half of SFT's on the same rows, its figure is in the progress line, and its checkpoints'
fingerprint names the method.
"""

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from finetune_api import crd, reference
from finetune_api.objectives import OBJECTIVES
from finetune_api.registry import PLUGINS_ENV
from finetune_api.resource import FineTuneJob
from finetune_plan.gpu_products import lookup
from finetune_plan.inputs import recipe_from_spec

from .conftest import BASE_JOB, JobDir, make_job_dir

pytestmark = pytest.mark.trainer

MODULE = "throwaway_objective"
SOURCE = '''"""A throwaway objective: supervised fine-tuning with the loss halved."""

from finetune_api.objectives import Objective, register

register(
    Objective(
        name="halved",
        description="SFT with the loss halved (a test's throwaway)",
        dataset_formats={"alpaca": "instruction/input/output"},
        trainer="throwaway_objective:Halved",
        sequences_per_row=2,
        tracked=("spec.training.method", "spec.dataset.format"),
        order=90,
    )
)


def __getattr__(name):
    if name != "Halved":
        raise AttributeError(name)
    from finetune_trainer.objectives.sft import Sft

    class Halved(Sft):
        def loss_sum(self, model, head, batch, totals):
            return super().loss_sum(model, head, batch, totals) * 0.5

        def step_metrics(self, loss, trained, sums=()):
            return {"halvedLoss": loss}

    return Halved
'''
STEPS = 2


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(PLUGINS_ENV, MODULE)
    # What the registry does with FINETUNE_PLUGINS in a fresh process (it has read it here already).
    __import__(MODULE)
    try:
        yield folder
    finally:
        OBJECTIVES.unregister("halved")
        sys.modules.pop(MODULE, None)


def _job(**training: object) -> FineTuneJob:
    body = json.loads(json.dumps(BASE_JOB))
    body["spec"]["training"].update(training)
    return FineTuneJob.model_validate(body)


def test_without_the_module_the_method_is_refused() -> None:
    with pytest.raises(ValidationError, match="Input should be 'sft'"):
        _job(method="halved")


def test_the_spec_the_crd_and_the_reference_follow_the_registry(plugin: Path) -> None:
    assert _job(method="halved").spec.training.method == "halved"
    body = json.loads(json.dumps(BASE_JOB))
    body["spec"]["training"]["method"] = "halved"
    body["spec"]["dataset"]["format"] = "text"
    refusal = r"dataset\.format text is not one training\.method halved reads \(alpaca\)"
    with pytest.raises(ValidationError, match=refusal):
        FineTuneJob.model_validate(body)
    version = crd.crd()["spec"]["versions"][0]
    training = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["training"]
    assert training["properties"]["method"]["enum"] == ["sft", "dpo", "orpo", "halved"]
    assert "halved = SFT with the loss halved" in training["properties"]["method"]["description"]
    assert "`halved`" in reference.render()


def test_the_planner_plans_two_sequences_per_row(plugin: Path) -> None:
    product = lookup("Tesla P40")
    assert product is not None
    sft = recipe_from_spec(_job().spec, product)
    halved = recipe_from_spec(_job(method="halved").spec, product)
    assert halved.batch_size == 2 * sft.batch_size
    assert halved.tokens == 2 * sft.tokens


def _job_dir(root: Path, tiny_assets: Path) -> JobDir:
    root.mkdir()
    return make_job_dir(root, tiny_assets)


def _first_losses(job: JobDir, env: dict[str, str]) -> tuple[float, dict[str, object]]:
    run = job.run(env=env)
    assert run.code == 0, run.stderr[-3000:]
    progress = run.of("progress")
    assert [p["step"] for p in progress] == list(range(1, STEPS + 1))
    return progress[0]["loss"], progress[0]


def test_the_trainer_trains_with_the_new_objective(plugin: Path, tmp_path: Path, tiny_assets: Path) -> None:
    env = {PLUGINS_ENV: MODULE, "PYTHONPATH": f"{plugin}:{':'.join(sys.path)}"}
    schedule = {"maxSteps": STEPS, "gradientCheckpointing": True}
    sft = _job_dir(tmp_path / "sft", tiny_assets)
    sft.spec_changes = {"training": schedule, "output": {"samples": {"count": 0}}}
    sft_loss, _ = _first_losses(sft, env)

    halved = _job_dir(tmp_path / "halved", tiny_assets)
    halved.spec_changes = {"training": {**schedule, "method": "halved"}, "output": {"samples": {"count": 0}}}
    loss, progress = _first_losses(halved, env)
    # Step 1's loss comes before any update: the same rows, the same model, the loss halved.
    assert loss == pytest.approx(sft_loss / 2, rel=1e-5)
    assert progress["halvedLoss"] == loss
    checkpoint = max(halved.checkpoints.glob("checkpoint-*"))
    fingerprint = json.loads((checkpoint / "fingerprint.json").read_text())["fingerprint"]
    assert fingerprint["spec.training.method"] == "halved"
    assert (
        "spec.training.method"
        not in json.loads((max(sft.checkpoints.glob("checkpoint-*")) / "fingerprint.json").read_text())["fingerprint"]
    )
