"""The run's state, typed, in the parts the recipe's stages hand on.

`Run` is what the run is given; `Setup` what setup decides before any weight loads; `Loaded`
what loading builds; `Position` what resume and the steps move; `Live` what reports while it
trains; `Finished` what training measured at its end; `Written` what the export wrote. Each stage
takes the parts it reads and returns the part it makes (as torchtune's recipes hold each stage's
state in a typed field): no stage reads a part a later stage makes, and every part but
`Position` is frozen once made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.families import Family
from finetune_plan.parallelism import LaunchPlan

from .. import objectives
from ..data.batches import Row, Schedule
from ..data.checks import DataReport
from ..distributed.topology import Topology
from ..evaluation.stages import Evaluation
from ..hardware.capabilities import Hardware, ResolvedPrecision
from ..hardware.host_memory import HostMemory
from ..memory.budget import MemoryPlan
from ..memory.phases import PhaseProbe
from ..model.attention_choice import Attention
from ..model.loss_head import LossHead
from ..model.precision_guard import GuardReport
from ..modes import Mode
from ..objectives import TrainingObjective
from ..outputs.export import Exported
from ..reporting.progress import Progress
from ..reporting.status_patch import StatusReporter
from ..state.checkpoints import Checkpoint, CheckpointStore
from ..state.stopping import StopRequest
from ..state.train_state import Adapter, Partial
from .launch_plan import Decision
from .loop import Loop

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Run:
    """What the run is given: the config it trains (after an OOM, the retry's tighter one), the
    config as asked (what its checkpoints' fingerprint records, the same before and after the
    retry), this process's place among the ranks, the stop request, what training minimises
    (`training.method`), and the pod's decision when its command handed one down."""

    config: TrainerConfig
    asked: TrainerConfig
    ranks: Topology
    stop: StopRequest
    objective: TrainingObjective
    decision: Decision | None
    started: float
    memory: HostMemory

    @classmethod
    def start(cls, asked: TrainerConfig, ranks: Topology, stop: StopRequest | None, decision: Decision | None) -> Run:
        """The run from now: its clock and the host memory's sampling start here."""
        started = time.time()
        memory = HostMemory().start()
        config = decision.applied(asked) if decision is not None else asked
        objective = objectives.for_spec(config.spec)
        return cls(config, asked, ranks, stop or StopRequest(), objective, decision, started, memory)

    @property
    def spec(self) -> FineTuneJobSpec:
        return self.config.spec

    @property
    def main(self) -> bool:
        """Rank 0 of the job, the one that writes (checkpoints, progress, status, outputs)."""
        return self.ranks.is_main

    @property
    def output(self) -> Path:
        return Path(self.config.paths.output)


@dataclass(frozen=True)
class Setup:
    """What setup decides, before any weight loads."""

    hardware: Hardware
    facts: dict[str, Any]  # the GPU stack's self-check (rank 0 on a GPU), summary.json's `gpuStack`
    precision: ResolvedPrecision
    family: Family
    tokenizer: PreTrainedTokenizerBase
    data: DataReport
    eval_data: DataReport | None  # the held-out source (spec.dataset.eval), checked as `data` is
    fingerprint: dict[str, Any]  # what rank 0's checkpoints depend on (empty on the other ranks)
    decided: Decision
    mode: Mode
    plan: MemoryPlan
    device: torch.device
    probe: PhaseProbe

    @property
    def launch(self) -> LaunchPlan:
        return self.decided.launch

    @property
    def attention(self) -> Attention:
        return self.decided.attention


@dataclass(frozen=True)
class Loaded:
    """What loading builds: the model in its mode with its adapter and loss head, the rows and
    their schedule, the guard's report, the optimizer and the checkpoint store."""

    adapter: Adapter
    lora: dict[str, Any]  # the modules LoRA went on and its layer count (`families.adapted`)
    head: LossHead
    train_samples: Dataset
    eval_samples: Dataset | None
    rows: list[Row]
    eval_rows: list[Row] | None
    schedule: Schedule
    guard: GuardReport | None
    trained: nn.Module  # what the loop trains: the model as its mode wrapped it
    loaded_s: float  # start-up, data checks, loading and wrapping
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    store: CheckpointStore


@dataclass
class Position:
    """Where the run stands: set by resume, moved by every step."""

    step: int = 0
    tokens: int = 0
    trained_tokens: int = 0  # targets of the loss, beside all tokens processed
    partial: Partial | None = None  # the stopped step the resumed checkpoint holds, to finish
    resume_from: Checkpoint | None = None


@dataclass(frozen=True)
class Live:
    """What reports while training: the status reporter (rank 0, in a cluster), the progress and
    the loop that runs the steps."""

    reporter: StatusReporter | None
    progress: Progress
    loop: Loop
    # The base against the tuned model on the held-out split; None without one.
    evaluation: Evaluation | None = None

    def cleanup(self, failed: bool = False) -> None:
        """Stop the status reporter's thread, its last status sent: retried for up to a minute
        after a run that ended well, for less after one that failed or was stopped."""
        if self.reporter is not None:
            self.reporter.close(StatusReporter.AFTER_FAILURE_S if failed else StatusReporter.AFTER_SUCCESS_S)


@dataclass(frozen=True)
class State:
    """Every part, for the stages that read them all: the steps, the checkpoint, the export."""

    run: Run
    setup: Setup
    loaded: Loaded
    position: Position
    live: Live


@dataclass(frozen=True)
class HostPeaks:
    """Peak host memory (GiB) of every rank, and the model bytes all the ranks read."""

    resident: list[float]
    anonymous: list[float]
    pinned: list[float]
    bytes_read: int


@dataclass(frozen=True)
class Finished:
    """What training measured at its end, on every rank alike."""

    in_step: bool  # every rank holds the same adapter
    peaks: list[float]  # GiB per GPU of the pod
    host_peaks: HostPeaks


@dataclass(frozen=True)
class Written:
    """What rank 0's export wrote: the adapter, the sample answers, the output formats."""

    adapter_path: Path
    samples_path: Path | None
    exported: Exported

    @property
    def merged(self) -> Path | None:
        return self.exported.written.get("merged")
