"""What this process runs on, found out once at start and logged: the floor over `failures`.

- `capabilities.py`: the GPUs and their capability, the memory cap, the precision the spec may
  have on them, the compiler and Triton switches (off below sm_70), the CPU threads.
- `host_memory.py`: the process's peak host memory.
- `self_check.py`: the image's GPU self-check (`--self-check`).

It imports nothing of the trainer but `failures`: which attention kernel runs on these GPUs is
the model's question (`model/attention_choice.py`), since its probe runs the model's kernel.
"""
