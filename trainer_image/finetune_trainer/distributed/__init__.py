"""One process per GPU (or per CPU slot), the same trainer in each: the pod's parallel modes.

- `launch.py`: the pod's command when it needs more than one process: PyTorch's own launcher
  (torch.distributed.run's elastic agent) starts the workers and the failing rank's exit
  reason becomes the pod's.
- `topology.py`: rank, world size and device of this process; the process group.
- `gradsync.py`: the LoRA gradients summed over ranks in one collective.
- `resume.py`: the checkpoint to resume from, sent to ranks in pods that cannot see it.

The training modes built on these (dataParallel, fsdp, deviceMap, one process) are `modes/`.
"""
