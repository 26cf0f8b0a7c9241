"""The first lines of `ftjob plan` on a GPU job: the one verdict, the whole job's time, the nodes.

The verdict is `finetune_plan.pod.verdict`, the operator's own: FITS, or DOES NOT FIT with the
first thing that stands in the way (the GPUs, the host memory, the nodes of the product), so the
plan never says both for one job. The time is the planner's for the whole job (`maxSteps`, else
its epochs over the dataset's tokens where they are known).
"""

from __future__ import annotations

from finetune_plan import GIB, Plan
from finetune_plan.duration import JobTime
from finetune_plan.evaluation import EvaluationTime, describe
from finetune_plan.messages.report import duration
from finetune_plan.nodes import Nodes, Room
from finetune_plan.pod import Verdict

# Said where the job's time waits on the dataset's size.
TOKENS_HINT = "pass --tokens N, or --volumes DIR where the dataset is"


def verdict_line(said: Verdict, plan: Plan) -> str:
    if not said.fits:
        return f"DOES NOT FIT: {said.message}"
    hw, fullest = plan.hardware, plan.layout.fullest
    return (
        f"FITS: {hw.gpus} x {hw.product.name} in {plan.parallelism} mode, peak {fullest.total / GIB:.1f} GiB "
        f"of {hw.memory_gib:.1f} GiB on GPU {fullest.index}; {plan.host.quantity} of host memory for the pod"
    )


def time_line(timed: JobTime) -> str:
    if timed.seconds is None:
        return f"time      not known yet: {timed.how}; {TOKENS_HINT}"
    return f"time      about {duration(timed.seconds)} for the whole job: {timed.how}, at the plan's speed"


def with_evaluation(trained: JobTime, evaluated: EvaluationTime | None) -> JobTime:
    """The whole job's time with its evaluation's (the held-out split's passes and answers): the
    training's alone, said so, where the held-out size is not known here."""
    if evaluated is None or trained.seconds is None:
        return trained
    if evaluated.seconds is None:
        return JobTime(trained.seconds, f"{trained.how}, not counting the evaluation")
    return JobTime(trained.seconds + evaluated.seconds, f"{trained.how}, and the evaluation")


def nodes_line(said: Verdict, found: Room | None, nodes: tuple[Nodes, str | None]) -> str | None:
    """The nodes' own word, where they were read from and, when not from the cluster, why."""
    if found is None:
        return None
    judged, why = nodes
    where = "" if why is None else f" (not the cluster's nodes: {why})"
    if said.room is found and not found.fits:  # the verdict above is theirs: said once
        return f"nodes     the verdict above is against {judged.source}{where}"
    return f"nodes     {found.message}{where}"


def head_lines(
    said: Verdict,
    plan: Plan,
    timed: JobTime,
    nodes: tuple[Nodes, str | None],
    found: Room | None,
    *,
    evaluated: EvaluationTime | None = None,
) -> list[str]:
    """The verdict, the time (and the evaluation's, within it) and the nodes, before the plan's table."""
    line = nodes_line(said, found, nodes)
    evaluation = [] if evaluated is None else [f"evaluation {describe(evaluated)}"]
    return [verdict_line(said, plan), time_line(timed), *evaluation, *([line] if line else []), ""]
