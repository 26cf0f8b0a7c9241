"""One process per GPU (or per CPU slot), the same trainer in each: what the modes stand on.

- `topology.py`: rank, world size and device of this process; the process group.
- `gradsync.py`: the LoRA gradients summed over ranks in one collective.

It imports nothing of the trainer. The training modes built on these (dataParallel, fsdp,
deviceMap, one process) are `modes/`; the checkpoint to resume from, sent to every rank, is
`state/resume.py`; the launcher that starts the processes (`launch/launcher.py`) stands above all.
"""
