"""One process per GPU (or per CPU slot), the same trainer in each: what the modes stand on.

- `topology.py`: rank, world size and device of this process; the process group.
- `gradsync.py`: the LoRA gradients summed over ranks in one collective.
- `resume.py`: the checkpoint to resume from, sent to ranks in pods that cannot see it.

The training modes built on these (dataParallel, fsdp, deviceMap, one process) are `modes/`;
the launcher that starts the processes (`launcher.py`) stands above both.
"""
