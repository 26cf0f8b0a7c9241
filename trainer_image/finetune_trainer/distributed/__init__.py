"""One process per GPU (or per CPU slot), the same trainer in each: the pod's parallel modes.

- `launch.py`: the pod's command when it needs more than one process: PyTorch's own launcher
  (torch.distributed.run's elastic agent) starts the workers and the failing rank's exit
  reason becomes the pod's.
- `topology.py`: rank, world size and device of this process; the process group.
- `gradsync.py`: the LoRA gradients summed over ranks in one collective.
- `fsdp.py`: the frozen NF4 base sharded with FSDP1, LoRA kept whole on every rank.

dataParallel and fsdp differ only in where the frozen base lives (a whole copy per GPU, or a
shard per GPU gathered layer by layer); the adapter, its optimizer and the step are the same.
"""
