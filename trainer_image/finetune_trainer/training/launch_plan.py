"""The launch decision, made once per run by the pod's command and handed down to its processes.

The pod's command (`entry`, in the launcher or, for one process, the trainer itself) calls
`decide_pod`: the planner's `choose()` on the hardware this pod has, with the attention kernel
the trainer will really run (probed as the trainer probes it). The launcher writes that
`Decision` to a file (`hand_down`) whose path its workers find in `DECISION_ENV`; each worker
`receive`s it instead of deciding again, so every process trains the plan the launcher launched.
`ftjob plan` calls the same `choose()`; the operator's grace period is worked out on its own,
before the pod exists (`finetune_plan.grace`). After an attempt ran out of GPU memory, the
decision carries the retry's tighter savers (`oom_retry`), and every process trains with them.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.inputs import as_mapping
from finetune_plan.model_shape import ModelConfigError
from finetune_plan.parallelism import TRAINER_LOSS_CHUNKS, LaunchPlan, choose
from finetune_plan.tighter import Savers, apply, savers_of

from ..failures import TrainerFailure
from ..hardware.capabilities import Hardware, ResolvedPrecision, detect, resolve_precision
from ..memory.oom_retry import recorded
from ..model import families
from ..model.attention_choice import ATTENTION_KERNELS, Attention, choose_attention, planned_attention
from ..model.loading import DTYPES, load_model_config, pod_memory_limit

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)

# Set by the launcher on its workers: the file that holds the pod's Decision.
DECISION_ENV = "FINETUNE_LAUNCH_DECISION"


@dataclass(frozen=True)
class Decision:
    """What the pod's command decided: the launch (mode, processes, plan) and the attention
    kernel it was planned with, which every process then loads the model with."""

    launch: LaunchPlan
    attention: Attention
    # The tighter savers of the one retry after an OOM (`oom_retry`); None: the spec's own.
    retry: Savers | None = None

    @property
    def loss_chunk_tokens(self) -> int:
        if self.retry is not None:
            return self.retry.loss_chunk_tokens
        plan = self.launch.plan
        return plan.recipe.loss_chunk_tokens if plan is not None else 0

    def savers(self, config: TrainerConfig) -> Savers:
        """The memory savers this attempt runs with."""
        return self.retry or savers_of(config.spec, self.loss_chunk_tokens)

    def applied(self, config: TrainerConfig) -> TrainerConfig:
        """`config` with the retry's micro-batch, accumulation and checkpointing in its spec."""
        return config if self.retry is None else config.model_copy(update={"spec": apply(config.spec, self.retry)})


def head_dim(model_config: PretrainedConfig) -> int:
    explicit = getattr(model_config, "head_dim", None)
    if explicit:
        return int(explicit)
    return int(model_config.hidden_size // model_config.num_attention_heads)


def decide(
    config: TrainerConfig,
    hardware: Hardware,
    model_config: PretrainedConfig,
    attention: Attention,
    loss_chunks: tuple[int, ...] = TRAINER_LOSS_CHUNKS,
) -> LaunchPlan:
    """The launch for this pod; raises WontFit (before any weight loads) when the plan says no."""
    gpus = hardware.gpus
    try:
        launch = choose(
            config.spec,
            as_mapping(model_config) if gpus else None,
            len(gpus),
            gpu_memory_bytes=min(g.total_bytes for g in gpus) if gpus else None,
            gpu_name=gpus[0].name if gpus else None,
            # The fused kernels keep no probabilities; eager and fp32 SDPA's math kernel do.
            attention=planned_attention(attention, DTYPES[resolve_precision(config.spec.precision, hardware)]),
            model_name=config.paths.model,
            loss_chunks=loss_chunks,
            # What the operator gave the pod (its plan's figure, at most a node's): the plan pins
            # no more than that (`finetune_plan.host.limit`).
            host_memory=pod_memory_limit(),
        )
    except ModelConfigError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, str(exc)) from None
    if not launch.fits:
        assert launch.plan is not None
        raise TrainerFailure(ExitReason.WontFit, launch.plan.message)
    if launch.plan is not None:
        log.info("plan: %s", launch.plan.summary)
    return launch


def probe_attention(hardware: Hardware, model_config: PretrainedConfig, precision: ResolvedPrecision) -> Attention:
    """The kernel the trainer runs, probed as it probes it (`attention_choice.choose_attention`).

    On GPUs the probe runs in a child process: a CUDA context on every GPU, held by the launcher
    for the whole run, would take memory the plan gave the workers."""
    size = head_dim(model_config)
    if not hardware.on_gpu:
        return choose_attention(hardware, size, DTYPES[precision])
    code = "from finetune_trainer.training.launch_plan import _probe_child; _probe_child()"
    args = json.dumps({"gpus": [g.index for g in hardware.gpus], "head_dim": size, "precision": precision})
    done = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=False)
    answer = done.stdout.strip().splitlines()[-1:] or [""]
    if done.returncode != 0 or answer[0] not in ATTENTION_KERNELS:
        log.warning("attention probe failed (exit %d): %s; using eager attention", done.returncode, done.stderr[-500:])
        return "eager"
    return answer[0]


def _probe_child() -> None:
    """In the probe's child process: print the kernel `choose_attention` picks on these GPUs."""
    from ..hardware.capabilities import Gpu

    asked = json.loads(sys.argv[1])
    gpus = tuple(Gpu(index, "", (0, 0), 0) for index in asked["gpus"])
    print(choose_attention(Hardware(gpus=gpus), asked["head_dim"], DTYPES[asked["precision"]]), flush=True)


def decide_pod(config: TrainerConfig) -> Decision:
    """The pod's decision, made once per run by the pod's command; after an OOM, with the
    retry's savers, planned again (the loss chunk as the retry names it)."""
    hardware = detect(config.spec)
    precision = resolve_precision(config.spec.precision, hardware)
    model_config = load_model_config(config)
    family = families.check(model_config, config.spec)  # a model it cannot train: InvalidConfig, one line
    attention = families.kernel(family, probe_attention(hardware, model_config, precision))
    retry = recorded(config) if config.spec.resources.nodes == 1 else None
    if retry is None:
        return Decision(decide(config, hardware, model_config, attention), attention)
    tightened = config.model_copy(update={"spec": apply(config.spec, retry)})
    log.info("retrying after running out of GPU memory with %s", retry.describe())
    launch = decide(tightened, hardware, model_config, attention, (retry.loss_chunk_tokens,))
    return Decision(launch, attention, retry)


def hand_down(decision: Decision, folder: Path) -> None:
    """Write the decision where the launcher's workers will read it (`receive`)."""
    path = folder / "decision.pickle"
    path.write_bytes(pickle.dumps(decision))
    os.environ[DECISION_ENV] = str(path)


def receive() -> Decision | None:
    """In a worker: the launcher's decision, or None when no launcher handed one down."""
    path = os.environ.get(DECISION_ENV)
    if not path:
        return None
    decision = pickle.loads(Path(path).read_bytes())  # written by this pod's launcher (hand_down)
    assert isinstance(decision, Decision)
    return decision
