"""The pair split (`finetune_plan.pairs`): where one forward of a micro-batch's chosen and rejected
sequences does not fit, the trainer runs the chosen ones, then the rejected ones
(`objectives.preference.Preference.split_loss_sum`). The math must not change: on the tiny model,
the split gives the unsplit micro-batch's loss, figures and LoRA gradients (DPO sigmoid and IPO,
ORPO), each side's forward with gradients draws the dropout masks of its forward without, and a
whole run with the split asked (`training.pairSplit: true`; no plan sizes the CPU) trains the
unsplit run's adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from finetune_api.resource import FineTuneJob
from finetune_api.trainer_config import TrainerConfig
from finetune_cli.run_local import local_paths
from finetune_trainer import objectives
from finetune_trainer.hardware.capabilities import Hardware
from finetune_trainer.memory.budget import MemoryPlan
from finetune_trainer.model.loading import load_model, load_tokenizer
from finetune_trainer.model.loss_head import install
from finetune_trainer.model.tiny_model import preference_records, write_preference
from finetune_trainer.modes import for_run
from finetune_trainer.objectives import preference
from tests.support.pair_split import policy_passes, record_sums
from tests.support.training import ADAPTER_TOLERANCE, MOVED_AT_LEAST, max_difference, movement

from .conftest import BASE_JOB, JobDir, _merge

pytestmark = pytest.mark.trainer

RELATIVE = 1e-5
PAIRS = 4
STEPS = 6


def _training(method: str) -> dict[str, Any]:
    extra: dict[str, Any] = {"dpo": {"lossType": "ipo"}} if method == "ipo" else {}
    return {"method": "dpo" if method == "ipo" else method, **extra}


def _spec(method: str, dropout: float, **training: Any) -> dict[str, Any]:
    return {
        "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "pairs.jsonl"}}, "format": "preference"},
        "lora": {"dropout": dropout},
        "training": {**_training(method), **training},
    }


def _config(root: Path, method: str, dropout: float) -> TrainerConfig:
    job = FineTuneJob.model_validate(_merge(BASE_JOB, {"spec": _spec(method, dropout)}))
    return TrainerConfig(job_name="tiny", namespace=None, spec=job.spec, paths=local_paths("tiny", job.spec, root))


@pytest.fixture(scope="module")
def pair_root(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> Path:
    """models/ as the tiny assets hold them, datasets/pairs.jsonl of the learnable rule."""
    root = tmp_path_factory.mktemp("pairs")
    (root / "models").symlink_to(tiny_assets / "models")
    write_preference(root / "datasets" / "pairs.jsonl", count=64)
    return root


def _model(config: TrainerConfig) -> tuple[Any, Any, Any]:
    model = load_model(
        config,
        Hardware(()),
        "fp32",
        "eager",
        MemoryPlan(None, "cpu", {}),
        mode=for_run("dataParallel", 1),
        device=torch.device("cpu"),
        seed=0,
    )
    model.train()
    # LoRA's B starts at zero (the policy then is the reference, and A has no gradient): a
    # trained-looking adapter instead.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    head = install(model, 0)
    return model, head, load_tokenizer(config)


def _step(
    objective: Any, model: Any, head: Any, batch: dict[str, torch.Tensor], totals: list[float]
) -> tuple[float, list[float], dict[str, torch.Tensor]]:
    """One micro-batch as the loop runs it: loss_sum, then the backward of its value scaled."""
    model.zero_grad(set_to_none=True)
    objective.start_step()
    torch.manual_seed(7)
    total = objective.loss_sum(model, head, batch, totals)
    (total * (1.0 / max(totals[0], 1.0))).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return float(total), list(objective.sums), grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("method", ["dpo", "ipo", "orpo"])
def test_the_split_gives_the_unsplit_loss_figures_and_lora_gradients(pair_root: Path, method: str) -> None:
    config = _config(pair_root, method, dropout=0.0)
    model, head, tokenizer = _model(config)
    objective = objectives.for_spec(config.spec)
    rows = objective.rows(preference_records(PAIRS, seed=3), tokenizer, config.spec)
    # Answers of different lengths: each side is padded to its own longest, not the batch's.
    assert len({len(r.chosen.input_ids) for r in rows} | {len(r.rejected.input_ids) for r in rows}) > 1
    batch = objective.collate(rows, int(tokenizer.pad_token_id), torch.device("cpu"), False)
    totals = objective.counts(rows)

    whole_loss, whole_sums, whole = _step(objective, model, head, batch, totals)
    objective.split = True
    split_loss, split_sums, split = _step(objective, model, head, batch, totals)

    assert abs(split_loss - whole_loss) <= RELATIVE * abs(whole_loss), (split_loss, whole_loss)
    assert split_sums == pytest.approx(whole_sums, rel=RELATIVE, abs=1e-6)
    assert split.keys() == whole.keys() and whole
    worst = max((_relative(split[n], whole[n]), n) for n in whole)
    assert worst[0] <= RELATIVE, worst
    assert min(float(g.norm()) for g in whole.values()) > 0  # every LoRA tensor has a gradient


@pytest.mark.parametrize("method", ["dpo", "orpo"])
def test_each_side_trains_with_the_dropout_masks_its_sums_were_taken_with(
    pair_root: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With dropout on, the forward with gradients of each side gives the sums of its forward
    without (the loss's gradient was taken at those): the generators are restored between."""
    config = _config(pair_root, method, dropout=0.5)
    model, head, tokenizer = _model(config)
    objective = objectives.for_spec(config.spec)
    objective.split = True
    rows = objective.rows(preference_records(PAIRS, seed=3), tokenizer, config.spec)
    batch = objective.collate(rows, int(tokenizer.pad_token_id), torch.device("cpu"), False)
    original = preference.sequence_sums
    seen = record_sums(monkeypatch)
    _step(objective, model, head, batch, objective.counts(rows))
    policy, with_grad = policy_passes(seen)
    # DPO: the reference's two sides, then the policy's; ORPO: the policy's alone.
    assert sum(1 for grad, _ in seen if not grad) == (4 if method == "dpo" else 2)
    for before, after in zip(policy, with_grad, strict=True):
        assert torch.allclose(before, after, rtol=1e-6, atol=1e-6), (before, after)
    # And the masks matter: another draw gives other sums.
    torch.manual_seed(8)
    with torch.no_grad():
        again = original(
            model, head, preference.side(batch, 0, PAIRS), objective.masks(preference.side(batch, 0, PAIRS))
        )
    assert not torch.allclose(again, policy[0], rtol=1e-6, atol=1e-6)


def _job(root: Path, pair_root: Path, name: str, **training: Any) -> JobDir:
    folder = root / name
    folder.mkdir()
    for claim in ("models", "datasets"):
        (folder / claim).symlink_to(pair_root / claim)
    (folder / "outputs").mkdir()
    job = JobDir(folder)
    job.spec_changes = _merge(
        _spec("dpo", 0.0, maxSteps=STEPS, batchSize=2, gradientAccumulation=2, **training),
        {
            "dataset": {"evalFraction": 0.125},
            "checkpoints": {"everySteps": STEPS},
            "output": {"samples": {"count": 0}},
            "evaluation": {"generate": {"count": 0}},
        },
    )
    return job


def _adapter(job: JobDir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(job.output / "adapter" / "adapter_model.safetensors"))


def test_a_run_with_the_pairs_split_trains_the_unsplit_runs_adapter(tmp_path: Path, pair_root: Path) -> None:
    whole = _job(tmp_path, pair_root, "whole")
    done = whole.run()
    assert done.code == 0, done.stderr[-3000:]
    split = _job(tmp_path, pair_root, "split", pairSplit=True)
    split_done = split.run()
    assert split_done.code == 0, split_done.stderr[-3000:]
    assert "one forward each" in split_done.stderr and "one forward each" not in done.stderr

    losses, split_losses = done.losses, split_done.losses
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in losses.items():
        assert split_losses[step] == pytest.approx(loss, rel=RELATIVE), step
    (evaluated,), (split_evaluated,) = done.of("eval"), split_done.of("eval")
    assert split_evaluated["evalLoss"] == pytest.approx(evaluated["evalLoss"], rel=RELATIVE)
    adapter = _adapter(whole)
    assert movement(adapter) >= MOVED_AT_LEAST
    assert max_difference(_adapter(split), adapter) <= ADAPTER_TOLERANCE
