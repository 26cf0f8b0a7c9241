"""The checkpoint fingerprint and `spec.output.onExisting`, on real folders: what differs is named
field by field, a job's own checkpoints always resume, another run's meet the policy."""

import copy
import datetime
from pathlib import Path
from typing import Any

import pytest

from finetune_api.reasons import NON_RETRYABLE, ExitReason
from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import RuntimePaths, TrainerConfig
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.state import existing, fingerprint
from finetune_trainer.state.checkpoints import CheckpointStore

from .conftest import BASE_JOB


def config(tmp_path: Path, uid: str | None = "uid-a", **changes: Any) -> TrainerConfig:
    """The tests' job with `changes` ({"lora.r": 16}) in its spec; model and data under tmp_path."""
    spec = copy.deepcopy(BASE_JOB["spec"])
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    model, data = tmp_path / "model", tmp_path / "data.jsonl"
    model.mkdir(parents=True, exist_ok=True)
    if not (model / "config.json").exists():
        (model / "config.json").write_text('{"hidden_size": 64}')
    if not data.exists():
        data.write_text('{"instruction": "a", "output": "b"}\n')
    return TrainerConfig(
        job_name="tiny",
        job_uid=uid,
        spec=FineTuneJobSpec.model_validate(spec),
        paths=RuntimePaths(model=str(model), dataset=str(data), output=str(tmp_path / "out")),
    )


def checkpoint(cfg: TrainerConfig, step: int) -> None:
    """A complete checkpoint carrying `cfg`'s fingerprint record, as the recipe writes it."""
    store = CheckpointStore(Path(cfg.paths.output) / "checkpoints", keep=5)
    folder = store.begin(step) / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    fingerprint.write(folder, fingerprint.record(cfg, fingerprint.fingerprint(cfg, 1)))
    store.commit(step)


def decide(cfg: TrainerConfig) -> existing.Action:
    store = CheckpointStore(Path(cfg.paths.output) / "checkpoints", keep=5)
    found = existing.found(store.complete())
    return existing.decide(cfg.spec.output.on_existing, found, fingerprint.fingerprint(cfg, 1), cfg.job_uid)


def test_the_same_config_gives_the_same_fingerprint(tmp_path: Path) -> None:
    assert fingerprint.fingerprint(config(tmp_path), 1) == fingerprint.fingerprint(config(tmp_path), 1)


def test_a_differing_field_is_named_with_both_values(tmp_path: Path) -> None:
    old = fingerprint.fingerprint(config(tmp_path, **{"lora.r": 16}), 1)
    new = fingerprint.fingerprint(config(tmp_path, **{"lora.r": 8, "training.seed": 7}), 1)
    assert fingerprint.differences(old, new) == [
        "spec.lora.r: checkpoint 16, job 8",
        "spec.training.seed: checkpoint 42, job 7",
    ]


def test_settings_that_do_not_shape_the_state_are_left_out(tmp_path: Path) -> None:
    # Cadence, retention, logging and the GPU count may change between attempts (a resume on
    # another process count is by design).
    base = fingerprint.fingerprint(config(tmp_path), 1)
    other = fingerprint.fingerprint(
        config(tmp_path, **{"checkpoints.everySteps": 5, "training.loggingSteps": 3, "resources.cpu": "2"}), 1
    )
    assert fingerprint.differences(base, other) == []


def test_the_global_batch_counts_not_how_it_is_split(tmp_path: Path) -> None:
    # batchSize 4 on 1 process = batchSize 2, accumulation 2 = batchSize 1, accumulation 2, 2 processes:
    # the same samples per step in the same order (data.batches.Schedule).
    one = fingerprint.fingerprint(config(tmp_path), 1)
    split = fingerprint.fingerprint(
        config(tmp_path, **{"training.batchSize": 1, "training.gradientAccumulation": 2}), 2
    )
    assert fingerprint.differences(one, split) == []
    doubled = fingerprint.fingerprint(config(tmp_path), 2)
    assert fingerprint.differences(one, doubled) == [f"{fingerprint.GLOBAL_BATCH}: checkpoint 4, job 8"]


def test_the_dataset_bytes_and_model_config_count(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    before = fingerprint.fingerprint(cfg, 1)
    Path(cfg.paths.dataset).write_text('{"instruction": "a", "output": "c"}\n')
    (Path(cfg.paths.model) / "config.json").write_text('{"hidden_size": 128}')
    changed = [line.split(":")[0] for line in fingerprint.differences(before, fingerprint.fingerprint(cfg, 1))]
    assert changed == [fingerprint.MODEL_CONFIG, fingerprint.DATASET_BYTES]


def test_a_hub_model_and_dataset_have_no_file_identity(tmp_path: Path) -> None:
    assert fingerprint.model_identity("org/model") is None
    assert fingerprint.dataset_identity("org/data") is None
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.jsonl").write_text("1\n")
    first = fingerprint.dataset_identity(str(folder))
    (folder / "b.jsonl").write_text("2\n")
    assert fingerprint.dataset_identity(str(folder)) != first


def test_nothing_there_starts(tmp_path: Path) -> None:
    assert decide(config(tmp_path)) == "start"


def test_a_job_resumes_its_own_checkpoints_whatever_on_existing(tmp_path: Path) -> None:
    for policy in ("resume", "fresh", "fail"):
        cfg = config(tmp_path / policy, **{"output.onExisting": policy})
        checkpoint(cfg, 10)
        assert decide(cfg) == "resume"


def test_another_runs_matching_checkpoint_resumes(tmp_path: Path) -> None:
    checkpoint(config(tmp_path, uid="uid-old"), 10)
    assert decide(config(tmp_path, uid="uid-new")) == "resume"


def test_another_runs_mismatch_fails_at_once_naming_fields_and_ways_out(tmp_path: Path) -> None:
    checkpoint(config(tmp_path, uid="uid-old", **{"lora.r": 16}), 10)
    checkpoint(config(tmp_path, uid="uid-old", **{"lora.r": 16}), 20)
    with pytest.raises(TrainerFailure) as caught:
        decide(config(tmp_path, uid="uid-new", **{"lora.r": 8}))
    failure = caught.value
    assert failure.reason == ExitReason.CheckpointMismatch
    assert failure.reason in NON_RETRYABLE
    assert "\n" not in failure.message
    assert failure.message.startswith("checkpoint-20 in the output folder was made by another run")
    assert "spec.lora.r: checkpoint 16, job 8." in failure.message
    assert "spec.output.onExisting: fresh" in failure.message
    assert "another output folder (spec.output.pvc.path), or delete the old checkpoints" in failure.message


def test_fresh_moves_another_runs_folder_aside(tmp_path: Path) -> None:
    checkpoint(config(tmp_path, uid="uid-old", **{"lora.r": 16}), 10)
    cfg = config(tmp_path, uid="uid-new", **{"lora.r": 8, "output.onExisting": "fresh"})
    output = Path(cfg.paths.output)
    (output / "summary.json").write_text("{}")
    assert decide(cfg) == "moveAside"
    moved = existing.move_aside(output, datetime.datetime(2026, 12, 1, 19, 40, tzinfo=datetime.UTC))
    assert moved == output / "previous-20261201T194000Z"
    assert sorted(p.name for p in output.iterdir()) == ["previous-20261201T194000Z"]
    assert (moved / "checkpoints" / "checkpoint-10" / fingerprint.FILE).is_file()
    assert (moved / "summary.json").is_file()
    assert decide(cfg) == "start"
    # A second fresh start keeps the first move and adds its own.
    checkpoint(config(tmp_path, uid="uid-old"), 10)
    again = existing.move_aside(output, datetime.datetime(2026, 12, 1, 19, 40, tzinfo=datetime.UTC))
    assert again.name == "previous-20261201T194000Z-2"
    assert (moved / "summary.json").is_file()


def test_fail_refuses_another_runs_checkpoints(tmp_path: Path) -> None:
    checkpoint(config(tmp_path, uid="uid-old"), 10)
    with pytest.raises(TrainerFailure) as caught:
        decide(config(tmp_path, uid="uid-new", **{"output.onExisting": "fail"}))
    assert caught.value.reason == ExitReason.CheckpointMismatch
    assert "checkpoint-10" in caught.value.message and "onExisting is fail" in caught.value.message


def test_a_checkpoint_without_fingerprint_resumes_as_before(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(tmp_path, uid="uid-new", **{"lora.r": 8})
    store = CheckpointStore(Path(cfg.paths.output) / "checkpoints", keep=5)
    folder = store.begin(10) / "checkpoint-10"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    store.commit(10)
    with caplog.at_level("WARNING"):
        assert decide(cfg) == "resume"
    assert "checkpoint-10 carries no fingerprint" in caplog.text


def test_a_local_run_owns_no_checkpoint(tmp_path: Path) -> None:
    # `ftjob run` has no job uid: what it finds is an earlier run's, so fresh moves it aside.
    checkpoint(config(tmp_path, uid=None), 10)
    assert decide(config(tmp_path, uid=None, **{"output.onExisting": "fresh"})) == "moveAside"
    assert decide(config(tmp_path, uid=None)) == "resume"


DPO = {"training.method": "dpo", "dataset.format": "preference"}


def test_a_preference_methods_settings_are_in_the_fingerprint(tmp_path: Path) -> None:
    base = fingerprint.fingerprint(config(tmp_path, **DPO), 1)
    assert (base["spec.training.method"], base["spec.training.dpo.beta"], base["spec.training.dpo.lossType"]) == (
        "dpo",
        0.1,
        "sigmoid",
    )
    # Unset, the block trains as its defaults: the same fingerprint as writing them.
    written = fingerprint.fingerprint(config(tmp_path, **DPO, **{"training.dpo": {"beta": 0.1}}), 1)
    assert fingerprint.differences(base, written) == []
    ipo = fingerprint.fingerprint(config(tmp_path, **DPO, **{"training.dpo": {"lossType": "ipo"}}), 1)
    assert fingerprint.differences(base, ipo) == ["spec.training.dpo.lossType: checkpoint sigmoid, job ipo"]
    orpo = fingerprint.fingerprint(config(tmp_path, **{**DPO, "training.method": "orpo"}), 1)
    assert fingerprint.differences(base, orpo) == [
        "spec.training.method: checkpoint dpo, job orpo",
        "spec.training.orpo.beta: checkpoint unset, job 0.1",
        "spec.training.dpo.beta: checkpoint 0.1, job unset",
        "spec.training.dpo.lossType: checkpoint sigmoid, job unset",
    ]


def test_a_resume_with_another_beta_is_refused_naming_it(tmp_path: Path) -> None:
    checkpoint(config(tmp_path, uid="uid-old", **DPO, **{"training.dpo": {"beta": 0.1}}), 10)
    assert decide(config(tmp_path, uid="uid-new", **DPO)) == "resume"  # the same settings, defaulted
    with pytest.raises(TrainerFailure) as caught:
        decide(config(tmp_path, uid="uid-new", **DPO, **{"training.dpo": {"beta": 0.5}}))
    assert caught.value.reason == ExitReason.CheckpointMismatch
    assert "spec.training.dpo.beta: checkpoint 0.1, job 0.5." in caught.value.message
    orpo = {**DPO, "training.method": "orpo", "training.orpo": {"beta": 0.1}}
    with pytest.raises(TrainerFailure) as other:
        decide(config(tmp_path, uid="uid-new", **orpo))
    assert "spec.training.method: checkpoint dpo, job orpo" in other.value.message
