"""The pod's command: the top floor, which only `__main__` and `seam` import.

- `entry.py`: the command line: read the config, decide the launch once, train in place or
  start the launcher; every ending becomes an exit code and a `Reason: message`.
- `environment.py`: the environment the libraries read at import, set before torch loads.
- `launcher.py`: PyTorch's launcher for more than one process, its watchdog, a multi-node
  rendezvous.
- `input_check.py`: `--check-inputs`, the operator's input check, on the CPU without torch.
"""
