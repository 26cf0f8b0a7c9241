"""What the run does with its memory, in the plan's terms: on `hardware`.

- `budget.py`: what loading needs of the plan: the layer placement and the per-GPU budget.
- `phases.py`: each training micro-batch's GPU memory cut into the plan's parts.
- `activations.py`: where each decoder layer's activations live: kept, recomputed or offloaded
  to pinned host memory.
- `oom_retry.py`: an attempt out of GPU memory: its report, the one retry one notch tighter.

It must not import the modes, the model or anything above them: the modes and the loader read
the budget, not the other way round.
"""
