"""`ftjob make-tiny-model` writes files the trainer's uid can read, whoever runs it: a claim
filled by another user (or by root, as the local control plane's pods are) must not hide the
weights from uid 1000."""

import stat
from pathlib import Path

import pytest

# The tiny_assets fixture runs `ftjob make-tiny-model`, whose process loads torch.
pytestmark = pytest.mark.trainer


def test_every_file_and_folder_is_readable_by_others(tiny_assets: Path) -> None:
    model = tiny_assets / "models" / "tiny-llama"
    paths = [model, *model.rglob("*"), tiny_assets / "datasets" / "alpaca.jsonl"]
    assert (model / "model.safetensors") in paths
    closed = [
        f"{path.name} {stat.filemode(path.stat().st_mode)}"
        for path in paths
        if not path.stat().st_mode & stat.S_IROTH or (path.is_dir() and not path.stat().st_mode & stat.S_IXOTH)
    ]
    assert not closed, closed
