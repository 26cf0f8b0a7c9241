"""Fault injection for the reliability tests, switched on only by FINETUNE_TEST_* variables.

The tests need to kill the trainer inside a checkpoint write, poison one loss and plant a
half-precision tensor at exact points; doing that from outside would be timing luck. Nothing
here acts unless its variable is set, and the operator never sets them.
"""

import os
import signal
import time

KILL_IN_SAVE = "FINETUNE_TEST_KILL_IN_SAVE"  # step whose checkpoint write is cut short by SIGKILL
NONFINITE_AT = "FINETUNE_TEST_NONFINITE_AT"  # "STEP" or "STEP@RANK": optimizer step whose loss becomes NaN
KILL_RANK_AT = "FINETUNE_TEST_KILL_RANK_AT"  # "RANK@STEP": that rank SIGKILLs itself after that step
# "RANK@STEP": that rank exits 0 after that step, unfinished: what the launcher sees of a rank
# whose exit status was lost
EXIT_RANK_AT = "FINETUNE_TEST_EXIT_RANK_AT"
PLANT_HALF = "FINETUNE_TEST_PLANT_HALF"  # "parameter", "buffer" or "activation": plant a bf16 tensor
# "STEP.MICRO": after that micro-batch (1-based) of that step, rank 0 sends SIGTERM to the pod's
# main process (the launcher, or itself), as the kubelet does on suspend or preemption
SIGTERM_AT = "FINETUNE_TEST_SIGTERM_AT"
# "STEP": while rank 0 writes that step's checkpoint, SIGTERM reaches every rank, twice
SIGTERM_IN_SAVE = "FINETUNE_TEST_SIGTERM_IN_SAVE"
STEP_DELAY = "FINETUNE_TEST_STEP_DELAY"  # seconds to sleep per step, to widen kill windows
# seconds to sleep after each micro-batch: a SIGTERM at a random moment then lands inside a step
# far more often than on its boundary, and a tiny run outlasts a suspend's way through the API
MICRO_DELAY = "FINETUNE_TEST_MICRO_DELAY"
# "STEP": rank 0 runs out of GPU memory as that step (1-based) begins, on the spec's own plan;
# OOM_AGAIN_AT: the same on the tighter plan of the retry after an OOM (oom_retry.py)
OOM_AT = "FINETUNE_TEST_OOM_AT"
OOM_AGAIN_AT = "FINETUNE_TEST_OOM_AGAIN_AT"
# "FORMAT": that output format's exporter fails after training, as a converter that refuses would
EXPORT_FAIL = "FINETUNE_TEST_EXPORT_FAIL"
# "N": on the CPU, which no plan sizes, gradientCheckpointing auto keeps N layers' activations
KEEP_LAYERS = "FINETUNE_TEST_KEEP_LAYERS"
# "1": on the CPU, the recomputing layers' inputs go to host memory as a plan that needs it says
OFFLOAD_INPUTS = "FINETUNE_TEST_OFFLOAD_INPUTS"
# "1": on the CPU, a preference pair's chosen and rejected sequences go through the model one
# forward each, as a plan does where one forward of both does not fit (finetune_plan.pairs)
SPLIT_PAIRS = "FINETUNE_TEST_SPLIT_PAIRS"


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None


def die_in_save(step: int) -> None:
    """Called after the checkpoint's files are written, before they are marked complete."""
    if _int(KILL_IN_SAVE) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    if _int(SIGTERM_IN_SAVE) == step:
        under_launcher = bool(os.environ.get("FINETUNE_REASON_DIR"))
        for _ in range(2):
            os.kill(os.getppid() if under_launcher else os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)  # and once more straight to this rank


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def nonfinite_at(step: int) -> bool:
    value = os.environ.get(NONFINITE_AT, "")
    at, _, rank = value.partition("@")
    return at.isdigit() and int(at) == step and (not rank or int(rank) == _rank())


def _names_this_rank(variable: str, step: int) -> bool:
    rank, _, at = os.environ.get(variable, "").partition("@")
    return rank.isdigit() and at.isdigit() and int(rank) == _rank() and int(at) == step


def die_after_step(step: int) -> None:
    """End this process after `step` when it is the rank KILL_RANK_AT (SIGKILL) or EXIT_RANK_AT
    (exit 0) names (one rank of N)."""
    if _names_this_rank(KILL_RANK_AT, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if _names_this_rank(EXIT_RANK_AT, step):
        os._exit(0)


def fail_export(name: str) -> None:
    if name and os.environ.get(EXPORT_FAIL) == name:
        from finetune_api.formats import FormatError

        raise FormatError(f"injected export failure ({EXPORT_FAIL})")


def keep_layers() -> int | None:
    return _int(KEEP_LAYERS)


def offload_inputs() -> bool:
    return os.environ.get(OFFLOAD_INPUTS) == "1"


def split_pairs() -> bool:
    return os.environ.get(SPLIT_PAIRS) == "1"


def plant_half() -> str | None:
    return os.environ.get(PLANT_HALF) or None


def step_delay() -> float:
    return _seconds(STEP_DELAY)


def micro_delay() -> float:
    return _seconds(MICRO_DELAY)


def _seconds(name: str) -> float:
    try:
        return float(os.environ.get(name, "0"))
    except ValueError:
        return 0.0


def signal_after_micro(step: int, micro: int) -> None:
    at_step, _, at_micro = os.environ.get(SIGTERM_AT, "").partition(".")
    if not (at_step.isdigit() and at_micro.isdigit()) or (int(at_step), int(at_micro)) != (step, micro):
        return
    if _rank() == 0:
        under_launcher = bool(os.environ.get("FINETUNE_REASON_DIR"))
        os.kill(os.getppid() if under_launcher else os.getpid(), signal.SIGTERM)
        if under_launcher:
            time.sleep(1.0)  # the launcher passes it on to every rank before they next agree


def out_of_memory_at(step: int, *, tightened: bool) -> None:
    """Raise the error PyTorch's allocator raises when a GPU is full (the CPU has none to fill)."""
    if _int(OOM_AGAIN_AT if tightened else OOM_AT) == step and _rank() == 0:
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 1.00 GiB (injected at step {step})")


# The fetch of S3 objects (objects/transfer.py): bytes per ranged GET, and seconds to sleep after
# each, so a test can kill the fetch half-way through one object of a tiny store.
FETCH_CHUNK = "FINETUNE_TEST_FETCH_CHUNK"
FETCH_DELAY = "FINETUNE_TEST_FETCH_DELAY"


def fetch_chunk() -> int | None:
    return _int(FETCH_CHUNK)


def fetch_delay() -> float:
    return _seconds(FETCH_DELAY)
