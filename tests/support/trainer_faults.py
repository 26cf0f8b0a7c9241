"""The trainer's faults for the reliability tests: the module `FINETUNE_FAULTS` names in a trainer
process the tests start (finetune_trainer/faults.py installs its `faults()`), acting where a
`FINETUNE_TEST_*` variable of that process says.

Imported only inside the trainer process, through the variable (tests/support/faults.py sets it
and the path to this checkout): the product never imports the tests. Each variable is read once,
as the process starts; the hooks the training loop calls compare integers.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from finetune_trainer.faults import Faults

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
# "STEP": as the tuned model's evaluation at that step begins, rank 0 sends SIGTERM to the pod's
# main process (the evaluation after training, or at that checkpoint)
SIGTERM_IN_EVALUATION = "FINETUNE_TEST_SIGTERM_IN_EVALUATION"
STEP_DELAY = "FINETUNE_TEST_STEP_DELAY"  # seconds to sleep per step, to widen kill windows
# seconds to sleep after each micro-batch: a SIGTERM at a random moment then lands inside a step
# far more often than on its boundary, and a tiny run outlasts a suspend's way through the API
MICRO_DELAY = "FINETUNE_TEST_MICRO_DELAY"
# "STEP": rank 0 runs out of GPU memory as that step (1-based) begins, on the spec's own plan;
# OOM_AGAIN_AT: the same on the tighter plan of the retry after an OOM (memory/oom_retry.py)
OOM_AT = "FINETUNE_TEST_OOM_AT"
OOM_AGAIN_AT = "FINETUNE_TEST_OOM_AGAIN_AT"
# "FORMAT": that output format's exporter fails after training, as a converter that refuses would
EXPORT_FAIL = "FINETUNE_TEST_EXPORT_FAIL"
# The fetch of S3 objects (objects/transfer.py): bytes per ranged GET, and seconds to sleep after
# each, so a test can kill the fetch half-way through one object of a tiny store.
FETCH_CHUNK = "FINETUNE_TEST_FETCH_CHUNK"
FETCH_DELAY = "FINETUNE_TEST_FETCH_DELAY"

# "HOST=ADDRESS": an http reward's URL naming Service HOST is called at ADDRESS (host:port)
# instead, where the test's own server listens: a run outside the cluster has no Service DNS.
REWARD_HOST = "FINETUNE_TEST_REWARD_HOST"
SWITCHES = (
    REWARD_HOST,
    KILL_IN_SAVE,
    NONFINITE_AT,
    KILL_RANK_AT,
    EXIT_RANK_AT,
    PLANT_HALF,
    SIGTERM_AT,
    SIGTERM_IN_SAVE,
    SIGTERM_IN_EVALUATION,
    STEP_DELAY,
    MICRO_DELAY,
    OOM_AT,
    OOM_AGAIN_AT,
    EXPORT_FAIL,
    FETCH_CHUNK,
    FETCH_DELAY,
)


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _seconds(value: str | None) -> float:
    try:
        return float(value or "0")
    except ValueError:
        return 0.0


def _pair(value: str, sep: str) -> tuple[int, int] | None:
    first, _, second = value.partition(sep)
    return (int(first), int(second)) if first.isdigit() and second.isdigit() else None


class TestFaults(Faults):
    """The hooks as this process's `FINETUNE_TEST_*` variables ask, read once here."""

    __test__ = False  # not a pytest class

    def __init__(self, env: Mapping[str, str]) -> None:
        self.rank = int(env.get("RANK", "0"))
        host, _, address = env.get(REWARD_HOST, "").partition("=")
        self.reward_host = (host, address) if host and address else None
        self.under_launcher = bool(env.get("FINETUNE_REASON_DIR"))
        self.kill_in_save = _int(env.get(KILL_IN_SAVE))
        self.sigterm_in_save = _int(env.get(SIGTERM_IN_SAVE))
        self.sigterm_in_evaluation = _int(env.get(SIGTERM_IN_EVALUATION))
        at, _, rank = env.get(NONFINITE_AT, "").partition("@")
        self.nonfinite = int(at) if at.isdigit() and (not rank or int(rank) == self.rank) else None
        self.kill_rank_at = _pair(env.get(KILL_RANK_AT, ""), "@")
        self.exit_rank_at = _pair(env.get(EXIT_RANK_AT, ""), "@")
        self.planted = env.get(PLANT_HALF) or None
        self.sigterm_at = _pair(env.get(SIGTERM_AT, ""), ".")
        self.step_delay = _seconds(env.get(STEP_DELAY))
        self.micro_delay = _seconds(env.get(MICRO_DELAY))
        self.oom_at = _int(env.get(OOM_AT))
        self.oom_again_at = _int(env.get(OOM_AGAIN_AT))
        self.export_fail = env.get(EXPORT_FAIL) or None
        self.chunk = _int(env.get(FETCH_CHUNK))
        self.fetch_delay = _seconds(env.get(FETCH_DELAY))

    def out_of_memory_at(self, step: int, *, tightened: bool) -> None:
        """Raise the error PyTorch's allocator raises when a GPU is full (the CPU has none to fill)."""
        if (self.oom_again_at if tightened else self.oom_at) == step and self.rank == 0:
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 1.00 GiB (injected at step {step})")

    def nonfinite_at(self, step: int) -> bool:
        return self.nonfinite == step

    def after_micro(self, step: int, micro: int) -> None:
        if self.sigterm_at == (step, micro) and self.rank == 0:
            os.kill(os.getppid() if self.under_launcher else os.getpid(), signal.SIGTERM)
            if self.under_launcher:
                time.sleep(1.0)  # the launcher passes it on to every rank before they next agree
        if self.micro_delay:
            time.sleep(self.micro_delay)

    def after_step(self, step: int) -> None:
        """End this process after `step` when it is the rank KILL_RANK_AT (SIGKILL) or EXIT_RANK_AT
        (exit 0) names (one rank of N); then the step's delay."""
        if self.kill_rank_at == (self.rank, step):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.exit_rank_at == (self.rank, step):
            os._exit(0)
        if self.step_delay:
            time.sleep(self.step_delay)

    def before_evaluation(self, model: str, step: int) -> None:
        if model == "tuned" and self.sigterm_in_evaluation == step and self.rank == 0:
            os.kill(os.getppid() if self.under_launcher else os.getpid(), signal.SIGTERM)
            if self.under_launcher:
                time.sleep(1.0)  # the launcher passes it on to every rank before they next agree

    def in_save(self, step: int) -> None:
        if self.kill_in_save == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.sigterm_in_save == step:
            for _ in range(2):
                os.kill(os.getppid() if self.under_launcher else os.getpid(), signal.SIGTERM)
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)  # and once more straight to this rank

    def before_guard(self, model: object) -> None:
        """Put one bf16 tensor where the fp32 guard must find it."""
        if self.planted is not None:
            _PLANTERS[self.planted](model)

    def before_export(self, name: str) -> None:
        if name and self.export_fail == name:
            from finetune_api.formats import FormatError

            raise FormatError(f"injected export failure ({EXPORT_FAIL})")

    def fetch_chunk(self, chunk: int) -> int:
        return self.chunk or chunk

    def reward_url(self, url: str) -> str:
        if not self.reward_host:
            return url
        parts = urllib.parse.urlsplit(url)
        if parts.hostname != self.reward_host[0]:
            return url
        return urllib.parse.urlunsplit(parts._replace(netloc=self.reward_host[1]))

    def after_fetch_range(self) -> None:
        if self.fetch_delay:
            time.sleep(self.fetch_delay)


def _plant_parameter(model: Any) -> None:
    import torch

    param = next(p for p in model.named_parameters() if p[1].requires_grad)[1]
    param.data = param.data.to(torch.bfloat16)


def _plant_buffer(model: Any) -> None:
    import torch

    target = next(m for n, m in model.named_modules() if n.endswith("input_layernorm"))
    target.register_buffer("planted", torch.zeros(2, dtype=torch.bfloat16))


def _plant_activation(model: Any) -> None:
    import torch

    target = next(m for n, m in model.named_modules() if n.endswith("self_attn.o_proj"))
    target.register_forward_hook(lambda _m, _i, out: out.to(torch.bfloat16))


_PLANTERS: dict[str, Callable[[Any], None]] = {
    "parameter": _plant_parameter,
    "buffer": _plant_buffer,
    "activation": _plant_activation,
}


def faults() -> Faults:
    """What finetune_trainer.faults.install takes from this module."""
    return TestFaults(os.environ)
