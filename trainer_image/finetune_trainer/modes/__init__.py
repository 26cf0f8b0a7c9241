"""The training modes, one module each, and the one registry from the spec's words to them.

- `base.py`: `Mode`, what every mode decides (process count check, model-load arguments, the
  wrapping, the gradient reduction, where peaks are measured, which device the loop feeds).
- `single.py`: one process, whatever the spec's mode (the world-size-1 case).
- `data_parallel.py`: a whole copy per process, gradients summed over the ranks.
- `fsdp.py`: the frozen base sharded over the processes with FSDP1, the adapter whole on each.
- `device_map.py`: one process, the layers spread over the pod's GPUs.

The words (`finetune_api.modes`) say what the spec, the planner and the CLI call a mode; this
package says what the trainer does in it. Adding a mode: a module here, a line in REGISTRY, and
its words in `finetune_api.modes`.
"""

from __future__ import annotations

from typing import Final

from finetune_api import modes as words

from .base import Mode
from .data_parallel import DataParallel
from .device_map import DeviceMap
from .fsdp import Fsdp
from .single import SingleProcess

# The spec's word (training.parallelism, as the plan resolved it) -> the mode that runs it.
REGISTRY: Final[dict[str, type[Mode]]] = {
    "dataParallel": DataParallel,
    "fsdp": Fsdp,
    "deviceMap": DeviceMap,
}


def for_run(word: str, world_size: int) -> Mode:
    """The mode this process trains in: the spec's word's, or the single process on a world of
    one (FSDP over one process would shard nothing) for a mode that spreads over processes."""
    if world_size == 1 and not words.BY_SPEC[word].one_process:
        return SingleProcess()
    return REGISTRY[word]()


__all__ = ["REGISTRY", "DataParallel", "DeviceMap", "Fsdp", "Mode", "SingleProcess", "for_run"]
