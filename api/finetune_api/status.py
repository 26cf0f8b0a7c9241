"""`FineTuneJob.status`: written by the operator (phase, conditions, restarts, times, output)
and by the trainer (progress, lastCheckpoint). Shaped after the Kubernetes API conventions:
conditions keyed by type with one-word reasons; `phase` is only a printer-column convenience.
"""

from dataclasses import dataclass
from typing import Annotated, Final, Literal

from pydantic import Field

from .base import ApiModel

# Queued, Admitted and Preempted are Kueue's part of a job's life (spec.placement.queueName):
# waiting for quota, admitted but the trainer not running yet, evicted and its pod stopping.
Phase = Literal["Pending", "Queued", "Admitted", "Preempted", "Running", "Suspended", "Succeeded", "Failed"]

# Exported: set False (reason ExportFailed) when a job trained but could not write a format of
# spec.output.formats; it still ends Succeeded, with its adapter. Schedulable: set False when no
# node of the job's GPU product can ever hold its pods (the reason says why, the message what would).
ConditionType = Literal[
    "Validated",
    "Schedulable",
    "Admitted",
    "Preempted",
    "Scheduled",
    "Running",
    "Complete",
    "Exported",
    "Failed",
    "Suspended",
]

Message = Annotated[str, Field(max_length=32768)]
Timestamp = Annotated[str, Field(max_length=64, description="RFC 3339 time.")]


class Condition(ApiModel):
    type: Annotated[str, Field(max_length=64)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(max_length=128)] = ""
    message: Message = ""
    last_transition_time: Timestamp | None = None
    observed_generation: int | None = None


class Progress(ApiModel):
    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    percent: float | None = None
    loss: float | None = None
    # Printer columns cannot format numbers: these are what PROGRESS and LOSS show.
    percent_text: Annotated[str, Field(max_length=16)] | None = Field(
        default=None, description="percent as kubectl shows it, e.g. 8.3%."
    )
    loss_text: Annotated[str, Field(max_length=32)] | None = Field(
        default=None, description="loss to 4 significant digits, as kubectl shows it."
    )
    eval_loss: float | None = Field(
        default=None, description="Loss on the held-out split (dataset.evalFraction) at the last evaluation."
    )
    eval_loss_text: Annotated[str, Field(max_length=32)] | None = Field(
        default=None, description="evalLoss to 4 significant digits, as kubectl -o wide shows it."
    )
    eval_step: int | None = Field(default=None, description="The optimizer step evalLoss was measured at.")
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    eta_seconds: float | None = None
    tokens: int | None = Field(default=None, description="Tokens processed so far (what tokensPerSecond counts).")
    trained_tokens: int | None = Field(
        default=None,
        description="Of those, the targets of the loss (dataset.trainOn; answers only for completion). "
        "Methods whose loss is a mean over pairs (dpo, orpo) report pairs instead; grpo reports completions.",
    )
    pairs: int | None = Field(
        default=None, description="dpo, orpo: preference pairs trained so far (what their loss is a mean over)."
    )
    completions: int | None = Field(
        default=None, description="grpo: completions sampled and trained on so far (numGenerations per prompt)."
    )
    metrics: Annotated[dict[Annotated[str, Field(max_length=64)], float], Field(max_length=16)] | None = Field(
        default=None,
        description="The training method's own figures at the last report, means over that step's pairs: dpo "
        "and orpo give rewardAccuracy (the share of pairs whose chosen answer earns the higher reward), "
        "rewardMargin, rewardChosen, rewardRejected (beta x the log-probability ratio to the reference for "
        "dpo, beta x the mean log-probability for orpo) and logpChosen, logpRejected; orpo adds nllLoss, "
        "logOddsRatio and logOddsChosen; grpo gives TRL's figures over that step's completions: reward, "
        "rewards/<name>/mean, reward_std, reward_group_std, frac_reward_zero_std, completions/mean_length, "
        "completions/clipped_ratio, kl (beta above 0) and clip_ratio/* (the first 16).",
    )
    metrics_text: Annotated[str, Field(max_length=64)] | None = Field(
        default=None,
        description="metrics as kubectl -o wide and ftjob status show them, e.g. reward acc 0.93 margin 1.2.",
    )
    updated_at: Timestamp | None = None
    lora_modules: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=64)] | None = Field(
        default=None, description="Modules of each decoder layer with LoRA (fused names and all-linear resolved)."
    )
    lora_layers: int | None = Field(default=None, description="LoRA layers in the model: modules x decoder layers.")


class CheckpointRef(ApiModel):
    step: int | None = None
    path: Annotated[str, Field(max_length=4096)] | None = None
    time: Timestamp | None = None


Path = Annotated[str, Field(max_length=4096)]


class OutputFile(ApiModel):
    """One format the job writes (spec.output.formats), where it lands and how to serve it."""

    format: Annotated[str, Field(max_length=16)]
    claim_name: Annotated[str, Field(max_length=253)] | None = None
    path: Path | None = Field(default=None, description="The folder (peft, merged) or file (gguf) in the claim.")
    base_path: Path | None = Field(default=None, description="gguf-lora: the base model as GGUF, beside it.")
    serve: Annotated[str, Field(max_length=8192)] | None = Field(
        default=None, description="A command that serves it, with the claim mounted at /mnt/output."
    )


class OutputPaths(ApiModel):
    adapter_path: Path | None = None
    merged_path: Path | None = None
    claim_name: Annotated[str, Field(max_length=253)] | None = None
    base_model: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="The base model's public name, as adapter_config.json names it."
    )
    rank: int | None = Field(default=None, description="lora.r")
    alpha: int | None = Field(default=None, description="lora.alpha")
    target_modules: Annotated[list[Annotated[str, Field(max_length=128)]], Field(max_length=64)] | None = None
    formats: Annotated[list[OutputFile], Field(max_length=8)] | None = None
    loss_curve_path: Path | None = Field(
        default=None, description="The loss curve (train and eval loss, learning rate) as a PNG, written at the end."
    )
    tensorboard_path: Path | None = Field(
        default=None, description="TensorBoard's event files, written as the job trains (every attempt's)."
    )
    s3: Path | None = Field(
        default=None, description="spec.output.s3: where the outputs are copied after training ends well."
    )
    warning: Message | None = Field(default=None, description="What a server needs told, e.g. --max-lora-rank.")


class InputCopy(ApiModel):
    """An S3 source as the fetch Job left it on the object cache claim: fetched, or reused."""

    source: Literal["model", "dataset", "eval"]
    uri: Path | None = None
    claim_name: Annotated[str, Field(max_length=253)] | None = None
    objects: int | None = None
    bytes: int | None = Field(default=None, description="The objects' bytes.")
    fetched_bytes: int | None = Field(default=None, description="Of those, the bytes fetched (0: the copy was reused).")
    reused: bool | None = Field(
        default=None, description="The copy on the claim had the objects' ETags: nothing fetched."
    )
    message: Message | None = None


class Sample(ApiModel):
    """The first of the sample answers (samples.jsonl beside the adapter has them all)."""

    prompt: Annotated[str, Field(max_length=1024)] | None = None
    answer: Annotated[str, Field(max_length=1024)] | None = Field(default=None, description="With the adapter.")
    base_answer: Annotated[str, Field(max_length=1024)] | None = Field(default=None, description="Without it.")
    path: Path | None = Field(default=None, description="samples.jsonl")


FigureName = Annotated[str, Field(max_length=64)]
Figures = Annotated[dict[FigureName, float], Field(max_length=16)]


class EvaluationStatus(ApiModel):
    """The base against the tuned model on the held-out split (spec.evaluation): the figures only;
    evaluation.json beside the adapter has the examples, the answers and the history."""

    step: int = Field(default=0, description="The step the tuned figures were measured at (0: only the base yet).")
    base: Figures = Field(default_factory=dict, description="Figure name -> the base's value (adapter off).")
    tuned: Figures = Field(default_factory=dict, description="Figure name -> the tuned model's value.")
    summary: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="One short line of the first figure, e.g. loss 2.31 -> 1.05."
    )


class PreemptionRef(ApiModel):
    """The latest preemption, in Kueue's words (its Workload's Preempted condition)."""

    time: Timestamp | None = None
    reason: Annotated[str, Field(max_length=128)] | None = None
    message: Message | None = None
    by: Annotated[str, Field(max_length=512)] | None = Field(
        default=None, description="The preempting FineTuneJob (namespace/name) when the operator knows it."
    )


class QueueStatus(ApiModel):
    """What Kueue says about the job: its Workload's admission, in Kueue's own reasons and words."""

    name: Annotated[str, Field(max_length=63)] | None = Field(default=None, description="The LocalQueue.")
    workload: Annotated[str, Field(max_length=253)] | None = Field(default=None, description="Kueue's Workload.")
    cluster_queue: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="The ClusterQueue that admitted it."
    )
    admitted: bool | None = None
    reason: Annotated[str, Field(max_length=128)] | None = Field(default=None, description="Kueue's reason.")
    message: Message | None = Field(default=None, description="Kueue's message, e.g. why quota is short.")
    preemptions: int | None = Field(default=None, description="Times Kueue preempted the job.")
    last_preemption: PreemptionRef | None = None


class NodesStatus(ApiModel):
    """The pods of a job of several nodes (`spec.resources.nodes`): how many run of the gang."""

    ready: int | None = Field(default=None, description="Pods of the current attempt whose trainer runs.")
    total: int | None = Field(default=None, description="spec.resources.nodes: the pods of one attempt.")


class OomRetry(ApiModel):
    """The one retry after the GPU ran out of memory: the attempt that ran out, and what it said
    (where, its measured peak against the plan, and the tighter plan the next attempt runs)."""

    pod: Annotated[str, Field(max_length=253)] | None = Field(default=None, description="The pod that ran out.")
    message: Message | None = None


@dataclass(frozen=True)
class WrittenBy:
    """Marks a status field written by someone other than the operator (it leaves the schema alone)."""

    writer: Literal["trainer"]


BY_TRAINER: Final = WrittenBy("trainer")


class FineTuneJobStatus(ApiModel):
    phase: Phase | None = None
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(default_factory=list)
    observed_generation: int | None = None
    progress: Annotated[Progress | None, BY_TRAINER] = None
    last_checkpoint: Annotated[CheckpointRef | None, BY_TRAINER] = None
    sample: Annotated[Sample | None, BY_TRAINER] = None
    evaluation: Annotated[EvaluationStatus | None, BY_TRAINER] = None
    model_fingerprint: Annotated[
        Annotated[str, Field(max_length=64)] | None,
        BY_TRAINER,
        Field(
            description="The base model's identity as the trainer read it (a hash of its config.json, as the "
            "checkpoints' fingerprint records it): a ModelServer serves only adapters of one base."
        ),
    ] = None
    restarts: int | None = None
    start_time: Timestamp | None = None
    completion_time: Timestamp | None = None
    output: OutputPaths | None = None
    inputs: Annotated[list[InputCopy], Field(max_length=3)] | None = Field(
        default=None, description="The S3 sources, as the fetch Job fetched or reused them before the GPU Job."
    )
    queue: QueueStatus | None = None
    nodes: NodesStatus | None = None
    oom_retry: OomRetry | None = Field(
        default=None, description="Set once the GPU ran out of memory and the job was retried with a tighter plan."
    )
    message: Message | None = None


def operator_fields() -> tuple[str, ...]:
    """The status fields the operator writes, as on the wire, in the model's order: every field
    but those marked BY_TRAINER."""
    return tuple(
        field.alias or name
        for name, field in FineTuneJobStatus.model_fields.items()
        if BY_TRAINER not in field.metadata
    )
