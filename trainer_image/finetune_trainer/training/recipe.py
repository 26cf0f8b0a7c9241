"""One training run in one process of the job, as a recipe of named stages.

`Recipe.run` goes setup -> resume -> train (the base's evaluation before the first step,
checkpoint and evaluate along the way, the tuned model's evaluation after the last checkpoint:
evaluation/) -> export -> summary, then cleanup. Each stage is a function (or, for the steps, a small class) of the
parts of the run's state it reads, and returns the part it makes (`run_state`; the anchor is
torchtune's recipe interface: `setup`, `train`, `save_checkpoint`, `cleanup`).

The order is the point: everything that can fail cheaply (config, hardware, data, memory plan)
fails before a single weight is loaded, and nothing is trained before the precision guard has
passed. Every rank runs the checks; rank 0 alone (global rank 0, in the pod of index 0 of a job
of several nodes) writes checkpoints, progress, status, TensorBoard, the adapter and the summary.

The batch: every optimizer step sees

    effective batch = batchSize x gradientAccumulation x processes x nodes

samples (`processes` per pod, as the plan launched them; `nodes` pods): each rank runs
gradientAccumulation micro-batches of batchSize samples, and the mode's reduction sums the
adapter's gradients over every rank of every node (`data.batches.Schedule` numbers them).
"""

from __future__ import annotations

import logging
from typing import Any

from finetune_api.trainer_config import TrainerConfig

from ..distributed import topology
from ..distributed.topology import Topology
from ..state.stopping import StopRequest
from .launch_plan import Decision
from .recipe_outputs import export, sample_rows, summary
from .resume import resume, start
from .run_state import Run, State
from .setup import decide, load
from .steps import Steps

log = logging.getLogger(__name__)


class Recipe:
    """This process's run: the order of its stages, each handed the parts of the state it reads."""

    def __init__(
        self,
        config: TrainerConfig,
        ranks: Topology = topology.SINGLE,
        stop: StopRequest | None = None,
        decision: Decision | None = None,
    ) -> None:
        self.given = Run.start(config, ranks, stop, decision)

    def run(self) -> dict[str, Any] | None:
        """Every stage in order; the summary on rank 0, None on the others."""
        run = self.given
        setup = decide(run)  # checks, hardware, data and the launch: before any weight loads
        loaded = load(run, setup)  # the model in its mode, rows, schedule, guard, optimizer, store
        position = resume(run, loaded)  # the latest complete checkpoint, if any
        state = State(run, setup, loaded, position, start(run, setup, loaded, position))
        try:
            finished = Steps(state).train()  # checkpoints, evaluations and a stop along the way
        finally:
            state.live.progress.close()
            run.memory.stop()
        if not finished.in_step:
            log.error("the adapter differs between ranks after training")
        # The process group is left for the process's end to free (a worker ends in os._exit,
        # see entry.main): gloo's destructor joins its worker thread holding the GIL, while that
        # thread may need the GIL to free the last collective's tensors, and the rank then hangs.
        # Under fsdp every rank answers the samples with rank 0, in lockstep (samples.py).
        rows = sample_rows(run, setup, loaded) if setup.mode.sharded else None
        if not run.main:
            return None
        return summary(state, finished, export(state, rows))  # export ends with the cleanup


def train(
    config: TrainerConfig,
    ranks: Topology = topology.SINGLE,
    stop: StopRequest | None = None,
    decision: Decision | None = None,
) -> dict[str, Any] | None:
    """Train this process's part; returns the summary on rank 0, None on the others. With a
    `stop` request installed, SIGTERM ends the run with a checkpoint of the point reached."""
    return Recipe(config, ranks, stop, decision).run()
