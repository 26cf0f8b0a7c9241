"""CheckpointStore on a real filesystem: only whole checkpoints count, everything else is removed."""

import json
import os
import sys
import traceback
from pathlib import Path

import pytest

from finetune_trainer.state.checkpoints import MARKER, CheckpointStore, _is_whole, exchange_folders


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


# --- a same-step save killed between any two filesystem operations -----------------------------

# Commit changes the filesystem through these calls; each is a kill point (Python's audit events
# are raised before the change happens).
CHANGES = frozenset({"os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "ctypes.call_function"})


def _writes(event: str, args: tuple[object, ...]) -> bool:
    if event != "open":
        return False
    mode, flags = args[1], args[2]
    return (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    )


def _commit_killed_at(root: Path, kill_at: int, swap: bool) -> None:
    """In a forked child: stage step 20 again with new bytes, then count every filesystem change
    commit() makes and exit hard before the KILL_AT-th (exit 0: commit finished first). A fork,
    not a new interpreter: the child starts in microseconds with the store already imported, and
    its audit hook (which cannot be removed) dies with it."""
    store = CheckpointStore(root, keep=2, **({} if swap else {"exchange": lambda a, b: False}))
    folder = store.begin(20) / "checkpoint-20"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"new")
    (folder / "optimizer.pt").write_bytes(b"newnew")
    count = 0

    def hook(event: str, args: tuple[object, ...]) -> None:
        nonlocal count
        if event in CHANGES or _writes(event, args):
            count += 1
            if count == kill_at:
                os._exit(86)

    sys.addaudithook(hook)
    store.commit(20)
    os._exit(0)


def _killed_commit(root: Path, kill_at: int, swap: bool) -> int:
    child = os.fork()
    if child == 0:
        try:
            _commit_killed_at(root, kill_at, swap)
        except BaseException:
            traceback.print_exc()
        os._exit(99)  # the child failed: never back into pytest's loop
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("swap", [True, False], ids=["swap", "journal"])
def test_a_same_step_save_killed_anywhere_leaves_a_complete_checkpoint_of_that_step(tmp_path: Path, swap: bool) -> None:
    """Every kill point of commit() (before its 1st, 2nd, ... filesystem change): the folder of
    step 20 is whole at that instant (swap) or its marked copy is (journal), and after the start's
    cleaning the newest complete checkpoint is step 20, old bytes or new, never torn."""
    points = 0
    for kill_at in range(1, 200):
        root = tmp_path / f"kill-{kill_at}"
        store = CheckpointStore(root, keep=2)
        write_checkpoint(store, 10, b"ten")
        write_checkpoint(store, 20, b"old")
        code = _killed_commit(root, kill_at, swap)
        if code == 0:
            break
        assert code == 86, f"the child failed before the kill point {kill_at} (exit {code})"
        points += 1
        final = root / "checkpoint-20"
        staged = root / ".staging-20" / "checkpoint-20"
        assert _whole(final) or (not swap and _whole(staged)), f"kill point {kill_at}: no whole step 20"
        if swap:
            assert _whole(final), f"kill point {kill_at}: checkpoint-20 not whole at that instant"
        store.clean_incomplete()
        latest = store.latest()
        assert latest is not None and latest.step == 20, f"kill point {kill_at}: latest {latest}"
        payload = (latest.path / "adapter_model.safetensors").read_bytes()
        assert payload in (b"old", b"new"), f"kill point {kill_at}"
        assert sorted(p.name for p in root.iterdir()) == ["checkpoint-10", "checkpoint-20"], kill_at
    else:
        pytest.fail("commit never finished")
    # The swap and the journal each pass through several filesystem changes, each a kill point.
    print(f"{points} kill points")
    assert points >= 6, points
    assert (root / "checkpoint-20" / "adapter_model.safetensors").read_bytes() == b"new"


def _whole(folder: Path) -> bool:
    return folder.is_dir() and _is_whole(folder, 20, 0)[0]


def test_the_swap_is_used_where_the_filesystem_has_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("b")
    assert exchange_folders(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a" / "x").read_text() == "b" and (tmp_path / "b" / "x").read_text() == "a"
