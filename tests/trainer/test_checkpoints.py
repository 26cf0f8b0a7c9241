"""CheckpointStore on a real filesystem: only whole checkpoints count, everything else is removed."""

import json
from pathlib import Path

from finetune_trainer.checkpoints import MARKER, CheckpointStore


def write_checkpoint(store: CheckpointStore, step: int, payload: bytes = b"weights") -> Path:
    staging = store.begin(step)
    folder = staging / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(payload)
    (folder / "optimizer.pt").write_bytes(payload * 2)
    return store.commit(step).path


def test_commit_marks_and_renames(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    path = write_checkpoint(store, 10)
    assert path == tmp_path / "checkpoint-10"
    marker = json.loads((path / MARKER).read_text())
    assert marker["step"] == 10
    assert marker["files"] == {"adapter_model.safetensors": 7, "optimizer.pt": 14}
    assert [c.step for c in store.complete()] == [10]
    assert not (tmp_path / ".staging-10").exists()


def test_keep_newest_complete_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30):
        write_checkpoint(store, step)
    assert [c.step for c in store.complete()] == [20, 30]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20", "checkpoint-30"]


def test_unfinished_and_torn_checkpoints_are_ignored_then_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    write_checkpoint(store, 10)
    # killed inside the write: staging folder with files, no marker
    staging = store.begin(20) / "checkpoint-20"
    staging.mkdir()
    (staging / "adapter_model.safetensors").write_bytes(b"half")
    # a higher-numbered folder without a marker (what HF's own resume would pick)
    (tmp_path / "checkpoint-30").mkdir()
    (tmp_path / "checkpoint-30" / "adapter_model.safetensors").write_bytes(b"x")
    # a marked folder whose file was truncated afterwards
    torn = write_checkpoint(store, 40)
    (torn / "optimizer.pt").write_bytes(b"short")

    assert store.latest() is not None and store.latest().step == 10  # type: ignore[union-attr]
    removed = store.clean_incomplete()
    assert removed == [
        ".staging-20 (unfinished write)",
        "checkpoint-30 (no completion marker)",
        "checkpoint-40 (optimizer.pt is 5 bytes, marker says 14)",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]


def test_saving_a_step_again_replaces_it_whole(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    write_checkpoint(store, 10, b"old")
    write_checkpoint(store, 10, b"newer")
    assert (tmp_path / "checkpoint-10" / "adapter_model.safetensors").read_bytes() == b"newer"
    assert [c.step for c in store.complete()] == [10]


def test_marker_for_another_step_is_not_trusted(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    path = write_checkpoint(store, 10)
    path.rename(tmp_path / "checkpoint-50")
    assert store.complete() == []
    assert store.clean_incomplete() == ["checkpoint-50 (marker names step 10)"]
