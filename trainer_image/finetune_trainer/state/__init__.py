"""What survives a process: checkpoints and what they hold, on `distributed`.

- `checkpoints.py`: atomic checkpoints and their store; `train_state.py`: what a checkpoint
  holds (adapter, optimizer, scheduler, progress, a stopped step's partial sums).
- `fingerprint.py`: what a checkpoint's state depends on, recorded beside it; `existing.py`:
  `spec.output.onExisting` against the checkpoints a start finds.
- `resume.py`: the checkpoint to resume from, sent to ranks in pods that cannot see it.
- `stopping.py`: SIGTERM as a stop at the next micro-batch, and the checkpoint clock.

It reads and writes files and tensors it is given: it must not import the model, the modes or
the training loop.
"""
