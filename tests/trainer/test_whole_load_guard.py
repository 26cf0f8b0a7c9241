"""fsdp on a checkpoint it cannot stream: the pod was sized for streaming, so a whole load per
process that the pod's memory cannot hold is refused at once, in one line (no kernel OOM kill).

The pod's limit is read from the cgroup file the container sees; the test points the reader at a
file of its own with the same format (a number of bytes, or `max`)."""

from pathlib import Path

import pytest

from finetune_api.reasons import ExitReason
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.memory.budget import MemoryPlan
from finetune_trainer.model import loading as model_loading

GIB = 2**30
PLAN = MemoryPlan(None, "planner", {}, whole_load_host_gib_per_process=10.0)


@pytest.fixture
def limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "memory.max"
    monkeypatch.setattr(model_loading, "CGROUP_MEMORY_MAX", path)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    return path


def test_a_pod_below_two_whole_loads_is_refused_naming_the_field(limit: Path) -> None:
    limit.write_text(f"{15 * GIB}\n")
    with pytest.raises(TrainerFailure) as failure:
        model_loading._whole_load_fits(PLAN, "no safetensors files")
    assert failure.value.reason == ExitReason.WontFit
    message = str(failure.value.message)
    assert message.startswith("spec.resources.memory:") and "\n" not in message
    assert "no safetensors files" in message and "20.0 GiB" in message and "15.0 GiB" in message


@pytest.mark.parametrize("text", [f"{25 * GIB}", "max"])
def test_a_pod_that_holds_them_or_has_no_limit_loads_whole(limit: Path, text: str) -> None:
    limit.write_text(text + "\n")
    model_loading._whole_load_fits(PLAN, "no safetensors files")


def test_without_the_figure_or_the_file_it_loads_whole(limit: Path) -> None:
    model_loading._whole_load_fits(PLAN, "no safetensors files")  # no cgroup file
    limit.write_text(f"{GIB}\n")
    model_loading._whole_load_fits(MemoryPlan(None, "planner", {}), "no safetensors files")
