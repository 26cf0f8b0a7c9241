"""`FineTuneJob.spec`: what a user asks for. The one definition the CRD, `ftjob validate`,
the operator and the trainer all read.

Cross-field rules exist twice on purpose: as pydantic validators (offline `ftjob validate`,
the operator, the trainer) and as CEL rules in `x-kubernetes-validations` (admission). Both
carry the same message text, and tests feed the same wrong specs to both.
"""

import json
import re
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import CoreSchema

from . import method_settings as blocks
from .base import (
    LABEL_VALUE_PATTERN,
    AnyObject,
    ApiModel,
    KueueName,
    LabelMap,
    PositiveQuantity,
    RelativePath,
    ResourceName,
    ShortString,
)
from .formats import ALWAYS as ALWAYS_WRITTEN
from .formats import FORMATS, Described
from .formats import written as written_formats
from .gpus import (
    HALF_PRECISIONS,
    PASCAL_PRODUCT_PATTERN,
    is_pascal,
    pascal_precision_message,
)
from .method_settings import BLOCK_FOR_ITS_METHOD, Settings
from .modes import Parallelism
from .multinode import several_nodes
from .object_storage import MODEL_NEEDS_PREFIX, ObjectCacheSpec, OutputS3, S3Source
from .objectives import DEFAULT as DEFAULT_METHOD
from .objectives import (
    HELD_OUT_FIELDS,
    NO_PACKING,
    NOT_READ,
    OBJECTIVES,
    dataset_format_choice,
    describe_formats,
    describe_methods,
    holds_out,
    known_formats,
    splits_pairs,
    unpacked_why,
)
from .objectives import packs as objective_packs
from .objectives import reads as objective_reads
from .objectives.sft import CONVERSATION_FORMATS as SFT_CONVERSATION_FORMATS
from .objectives.sft import FORMATS as SFT_FORMATS
from .objectives.sft import SftFormat
from .optimizers import DEFAULT as DEFAULT_OPTIMIZER
from .optimizers import OPTIMIZERS


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _cel_text(template: str, **values: str) -> str:
    """A CEL message expression for a Python format `template`: each `{name}` the CEL expression
    `values[name]`, the text between them string literals (so admission says what Python says)."""
    parts = re.split(r"\{(\w+)\}", template)
    return " + ".join(values[part] if index % 2 else json.dumps(part) for index, part in enumerate(parts) if part)


ONE_SOURCE = "exactly one of pvc, hub or s3 must be set"
SOURCES: Final = ("pvc", "hub", "s3")


# --- sources -------------------------------------------------------------------------------


class PvcSource(ApiModel):
    """A folder on an existing PersistentVolumeClaim, mounted read-only."""

    claim_name: ResourceName = Field(description="Name of the PersistentVolumeClaim.")
    path: RelativePath = Field(
        default="", description="Path inside the claim: a folder for a model, a file or folder for data."
    )


class HubSource(ApiModel):
    """A Hugging Face Hub repository, downloaded by the trainer (network access needed)."""

    id: Annotated[
        str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*(/[-A-Za-z0-9_.]+)?$")
    ] = Field(description="Repository id, e.g. meta-llama/Llama-3.3-70B-Instruct.")
    revision: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        default="main", description="Branch, tag or commit."
    )
    token_secret: ResourceName | None = Field(
        default=None,
        description="Secret (same namespace) holding the Hub token under key `token`; "
        "it reaches the trainer only as an environment variable from the Secret.",
    )


class HubDatasetSource(HubSource):
    """A Hugging Face Hub dataset, downloaded by the trainer (network access needed)."""

    split: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default="train", description="Dataset split to train on."
    )


_S3_SOURCE: Final = (
    "Objects of an S3-compatible bucket, fetched into the object cache claim (spec.objectCache) by the CPU "
    "pre-flight before any GPU is asked for."
)
_ONE_SOURCE_RULE: Final = " + ".join(f"(has(self.{name}) ? 1 : 0)" for name in SOURCES) + " == 1"


class _OneSource(ApiModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_cel(_ONE_SOURCE_RULE, ONE_SOURCE)]})

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        # Subclasses declare `pvc` and `hub` with their own types; look them up by name.
        present = [name for name in SOURCES if getattr(self, name, None) is not None]
        if len(present) != 1:
            raise ValueError(ONE_SOURCE)
        return self


class ModelSource(_OneSource):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(_ONE_SOURCE_RULE, ONE_SOURCE),
                _cel("!has(self.s3) || self.s3.key.endsWith('/')", MODEL_NEEDS_PREFIX, ".s3.key"),
            ]
        }
    )

    pvc: PvcSource | None = None
    hub: HubSource | None = None
    s3: S3Source | None = Field(default=None, description=_S3_SOURCE)

    @model_validator(mode="after")
    def _model_is_a_folder(self) -> Self:
        if self.s3 is not None and not self.s3.is_prefix:
            raise ValueError(MODEL_NEEDS_PREFIX)
        return self


class DatasetSource(_OneSource):
    pvc: PvcSource | None = None
    hub: HubDatasetSource | None = None
    s3: S3Source | None = Field(default=None, description=_S3_SOURCE)


# --- what to train -------------------------------------------------------------------------


class ModelSpec(ApiModel):
    source: ModelSource = Field(description="Where the base model (a Hugging Face folder) comes from.")
    name: (
        Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*(/[-A-Za-z0-9_.]+)?$")]
        | None
    ) = Field(
        default=None,
        description="The model's public name, e.g. meta-llama/Llama-3.3-70B-Instruct: what the adapter's "
        "adapter_config.json names as its base (base_model_name_or_path), so a server that serves the model "
        "under that name (vLLM) takes the adapter as it is. Unset: the hub id for a hub model; for a PVC model "
        "the _name_or_path its config.json carries, else the folder.",
    )


# Supervised fine-tuning's dataset formats (its objective's table, finetune_api.objectives.sft):
# what `ftjob check-data --format` and the trainer's parsers read. `dataset.format` takes every
# objective's formats (finetune_api.objectives.dataset_formats).
DatasetFormat = SftFormat
DATASET_FORMATS: Final[dict[DatasetFormat, str]] = SFT_FORMATS
CONVERSATION_FORMATS: Final = SFT_CONVERSATION_FORMATS
TrainOn = Literal["assistant", "lastAssistant", "all"]
DEFAULT_TRAIN_ON: Final[TrainOn] = "assistant"
TRAIN_ON_NEEDS_CONVERSATIONS = "trainOn is for the conversation formats (messages, sharegpt)"
EVAL_ONE_SPLIT = (
    "dataset.evalFraction and dataset.eval are exclusive: hold out a share of dataset.source, or read a separate "
    "held-out source"
)


class DatasetSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.trainOn) || self.format in " + str(list(CONVERSATION_FORMATS)),
                    TRAIN_ON_NEEDS_CONVERSATIONS,
                    ".trainOn",
                ),
                _cel("!(has(self.evalFraction) && has(self.eval))", EVAL_ONE_SPLIT, ".eval"),
            ]
        }
    )

    source: DatasetSource = Field(description="Where the training data comes from.")
    # The schema's description lists every objective's formats when it is made (the Choice); the
    # field's own, for Python readers, the built-in ones.
    format: Annotated[str, dataset_format_choice()] = Field(description=describe_formats(DATASET_FORMATS))
    train_on: TrainOn | None = Field(
        default=None,
        description="The tokens of a conversation the loss is taken on (messages and sharegpt; assistant when "
        "unset): assistant = every assistant turn with the end-of-turn token that closes it, lastAssistant = "
        "the last assistant turn only, all = every token. The spans come from the model's own chat template. "
        "completion and alpaca always train on the answer only, text on everything.",
    )
    eval_fraction: Annotated[float, Field(gt=0, le=0.5)] | None = Field(
        default=None,
        description="Fraction of samples held out: the eval loss at checkpoints and the base-against-tuned "
        "evaluation (spec.evaluation) are measured on them, and they are never trained on.",
    )
    eval: DatasetSource | None = Field(
        default=None,
        description="A separate held-out source (same kinds and format as source; a hub source reads its split) "
        "in place of evalFraction: the eval loss and the base-against-tuned evaluation are measured on all of it.",
    )

    @property
    def held_out(self) -> bool:
        """A held-out split exists (evalFraction or eval): the evaluation runs only then."""
        return bool(self.eval_fraction) or self.eval is not None

    @model_validator(mode="after")
    def _one_eval_split(self) -> Self:
        if self.eval_fraction is not None and self.eval is not None:
            raise ValueError(EVAL_ONE_SPLIT)
        return self

    @field_validator("train_on")
    @classmethod
    def _train_on_conversations(cls, value: TrainOn | None, info: ValidationInfo) -> TrainOn | None:
        if value is not None and info.data.get("format", CONVERSATION_FORMATS[0]) not in CONVERSATION_FORMATS:
            raise ValueError(TRAIN_ON_NEEDS_CONVERSATIONS)
        return value


DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


class LoraSpec(ApiModel):
    r: Annotated[int, Field(ge=1, le=256)] = Field(default=8, description="LoRA rank.")
    alpha: Annotated[int, Field(ge=1, le=4096)] = Field(default=16, description="LoRA scaling numerator.")
    dropout: Annotated[float, Field(ge=0, le=1)] = Field(default=0.05, description="Dropout on the LoRA path.")
    target_modules: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=128)]],
        Field(min_length=1, max_length=64),
        # A list, or one name as PEFT takes it (`targetModules: all-linear`). A structural schema has
        # no list-or-string type and CEL cannot see an untyped node, so the CRD admits any value
        # here; the operator (and `ftjob validate`) refuse a wrong one in one line naming the field,
        # before any child exists.
        WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
    ] = Field(
        default=list(DEFAULT_TARGET_MODULES),
        description="Linear modules of each decoder layer that get adapters: q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj (mapped onto a family's fused projections, e.g. Phi-3's qkv_proj and "
        "gate_up_proj), or all-linear: every linear layer but the head; a list, or one name as a plain "
        "string (targetModules: all-linear).",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name(cls, value: object) -> object:
        """`targetModules: all-linear` as PEFT spells it: a string means a list of that one name."""
        return [value] if isinstance(value, str) else value


class QuantizationSpec(ApiModel):
    type: Literal["nf4", "fp4", "none"] = Field(default="nf4", description="4-bit weight format, or none.")
    double_quant: bool = Field(default=True, description="Quantise the quantisation constants too.")


Precision = Literal["auto", "fp32", "bf16", "fp16"]
LrScheduler = Literal["cosine", "linear", "constant", "constant_with_warmup", "cosine_with_min_lr", "polynomial"]
# One of the optimizer registry's names (finetune_api.optimizers).
OptimizerName = Annotated[str, OPTIMIZERS.choice()]
BOTH_LENGTHS = "set either epochs or maxSteps, not both"
# Samples per optimizer step: the product of these (processes per pod: one per GPU, deviceMap one,
# on the CPU resources.processes). Changing any of them changes the optimisation.
EFFECTIVE_BATCH_FACTORS: Final = ("batchSize", "gradientAccumulation", "processes", "nodes")
EFFECTIVE_BATCH: Final = "the effective batch (samples per optimizer step) is " + " x ".join(EFFECTIVE_BATCH_FACTORS)


# true, false or auto. A structural schema has no boolean-or-string type and CEL cannot see an
# untyped node, so the CRD admits any value here; the operator (and `ftjob validate`) refuse a
# wrong one in one line naming the field, before any child exists (as for lora.targetModules).
def _true_false_or_auto(value: object) -> object:
    """Only the three words: "yes" or 1 are refused, as the CRD's boolean type refused them before."""
    if value is True or value is False or value == "auto":
        return value
    raise ValueError(f"must be true, false or auto, got {value!r}")


BoolOrAuto = Annotated[
    bool | Literal["auto"],
    BeforeValidator(_true_false_or_auto),
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
]


def _offload_choice(value: object) -> object:
    """`training.activationOffload`: true, false, auto or inputs, checked as `BoolOrAuto` is."""
    if value == "inputs":
        return value
    try:
        return _true_false_or_auto(value)
    except ValueError:
        raise ValueError(f"must be true, false, auto or inputs, got {value!r}") from None


OffloadChoice = Annotated[
    bool | Literal["auto", "inputs"],
    BeforeValidator(_offload_choice),
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
]
# The words of the untyped fields whose words are more than true, false and auto, by their
# names in the spec: what the API reference lists for them (finetune_api.reference).
UNTYPED_WORDS: Final = {"activationOffload": ("true", "false", "auto", "inputs")}
KEPT_LAYERS_NEEDS_AUTO: Final = (
    "training.keptLayers is for gradientCheckpointing: auto (true recomputes every layer, false keeps every one)"
)
INPUTS_NEED_RECOMPUTE: Final = (
    "training.activationOffload: inputs moves the recomputing layers' inputs, and gradientCheckpointing: false "
    "recomputes none"
)


def _packing_rules() -> list[JsonDict]:
    """`training.packing` with a method whose rows cannot be packed (the registry's, when the
    schema is made): the CEL side of `objectives.packs`."""
    unpacked = [o.name for o in OBJECTIVES if not o.packs]
    if not unpacked:
        return []
    # The CRD's defaults are checked against these rules before any field of theirs is defaulted.
    whys = {o.name: unpacked_why(o) for o in OBJECTIVES if not o.packs}
    grouped: dict[str, list[str]] = {}
    for name, why in whys.items():
        grouped.setdefault(why, []).append(name)
    rule = _cel(
        f"!has(self.packing) || !self.packing || !has(self.method) || !(self.method in {unpacked})",
        "; ".join(NO_PACKING.format(method=" or ".join(names), why=why) for why, names in grouped.items()),
    )
    # A JSON object is a CEL map: each method's own reason.
    message = _cel_text(NO_PACKING, method="self.method", why=f"{json.dumps(whys)}[self.method]")
    return [{**rule, "messageExpression": message, "fieldPath": ".packing"}]


def _settings_rules(properties: Any) -> list[JsonDict]:
    """Each settings block only with its method, and the rules the objectives add while they are
    the method (the registry's, when the schema is made): the CEL side of `method_settings.refusal`."""
    blocks.in_step(blocks.blocks_among(TrainingSpec, properties))
    own = [
        _cel(f"!has(self.{name}) || self.method == '{name}'", BLOCK_FOR_ITS_METHOD.format(method=name), f".{name}")
        for name in (o.name for o in blocks.with_settings())
    ]
    added = [
        _cel(f"!has(self.method) || self.method != '{o.name}' || ({rule.cel})", rule.message, rule.field_path or None)
        for o in OBJECTIVES
        for rule in o.rules
    ]
    return own + added


def _training_rules(schema: JsonDict, _: Any = None) -> None:
    schema["x-kubernetes-validations"] = [
        _cel("!(has(self.epochs) && has(self.maxSteps))", BOTH_LENGTHS),
        *_settings_rules(schema.get("properties", {})),
        *_packing_rules(),
    ]


class TrainingSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=_training_rules)

    epochs: Annotated[float, Field(gt=0, le=1000)] | None = Field(
        default=None, description="Passes over the data (1 when neither epochs nor maxSteps is set)."
    )
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        default=None, description="Optimizer steps to run; replaces epochs."
    )
    learning_rate: Annotated[float, Field(gt=0, le=1)] = Field(default=2e-4, description="Peak learning rate.")
    lr_scheduler: LrScheduler = Field(default="cosine", description="Learning-rate schedule after warmup.")
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.1, description="Fraction of steps spent warming up."
    )
    batch_size: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=1, description=f"Samples per process per micro-step; {EFFECTIVE_BATCH}."
    )
    gradient_accumulation: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=8,
        description=f"Micro-steps per optimizer step, on each process; {EFFECTIVE_BATCH}, so changing gpus, "
        "processes or nodes changes the optimisation unless this changes with them (`ftjob plan` prints it).",
    )
    max_length: Annotated[int, Field(ge=16, le=131072)] = Field(
        default=2048, description="Tokens per sample; longer samples are truncated and counted."
    )
    packing: bool = Field(default=False, description="Pack short samples into full-length sequences.")
    gradient_checkpointing: BoolOrAuto = Field(
        default="auto",
        description="Recompute activations to save memory: true = every decoder layer, false = none, auto = the "
        "planner keeps as many layers' activations as the GPU memory the plan leaves holds and recomputes the "
        "rest (`ftjob plan` says how many).",
    )
    kept_layers: Annotated[int, Field(ge=0, le=10_000)] | None = Field(
        default=None,
        description="With gradientCheckpointing auto: how many decoder layers (the last ones) keep their "
        "activations on the GPU, the others recomputing (or offloading, with activationOffload); unset = as many "
        "as the GPU memory the plan leaves holds. A number above the model's layers keeps them all; one the GPUs "
        "cannot hold is refused by the plan, which says how many fit.",
    )
    activation_offload: OffloadChoice = Field(
        default="auto",
        description="Move the saved activations of the layers not kept on the GPU to pinned host memory and back "
        "for the backward, instead of recomputing them: true = on, false = off, auto = the planner's choice "
        "(`ftjob plan` says why), inputs = only the recomputing layers' inputs wait in host memory (the layers "
        "still recompute). Unless false, where the GPUs need the room, the recomputing layers' inputs wait in "
        "host memory too. The pod's host memory counts the pinned bytes.",
    )
    pair_split: BoolOrAuto = Field(
        default="auto",
        description="For a method whose rows are pairs (dpo, orpo): true = a micro-batch's chosen and rejected "
        "sequences go through the model one pass each (half the activations, one more forward of each sequence "
        "without gradients), false = both in one pass, auto = split only where one pass fits no way (`ftjob "
        "plan` says which). The result is the same either way.",
    )
    optimizer: OptimizerName = Field(default=DEFAULT_OPTIMIZER, description="Optimizer.")
    method: Annotated[str, OBJECTIVES.choice(describe_methods)] = Field(default=DEFAULT_METHOD)
    # Here follow the methods' settings blocks (`training.<method>`), a field per objective whose
    # entry brings a settings model, added when the schema is built (`__get_pydantic_core_schema__`).
    parallelism: Parallelism = Field(
        default="auto",
        description="How the pod's GPUs share the work: dataParallel = a whole NF4 copy per GPU with LoRA "
        "gradients averaged; fsdp = NF4 weights sharded over the GPUs (float32 storage), one process per GPU; "
        "deviceMap = one process, layers spread over the GPUs (one GPU busy at a time); auto = the planner's "
        "choice (`ftjob plan` shows it).",
    )
    weight_decay: Annotated[float, Field(ge=0, le=1)] = Field(default=0.0, description="AdamW weight decay.")
    max_grad_norm: Annotated[float, Field(gt=0, le=1000)] = Field(default=1.0, description="Gradient clipping norm.")
    logging_steps: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=1, description="Optimizer steps between progress reports."
    )
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = Field(default=42, description="Seed for data order and init.")

    @model_validator(mode="after")
    def _one_length(self) -> Self:
        if self.epochs is not None and self.max_steps is not None:
            raise ValueError(BOTH_LENGTHS)
        return self

    @model_validator(mode="after")
    def _activations_asked(self) -> Self:
        if self.kept_layers is not None and self.gradient_checkpointing != "auto":
            raise ValueError(KEPT_LAYERS_NEEDS_AUTO)
        if self.activation_offload == "inputs" and self.gradient_checkpointing is False:
            raise ValueError(INPUTS_NEED_RECOMPUTE)
        return self

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler, /) -> CoreSchema:
        """A field per objective with a settings block, added when the schema is first built (on
        first use: API models defer it), so the registry is found whole by then, plugins too."""
        blocks.add_blocks(cls, after="method")
        return handler(source)

    @model_validator(mode="after")
    def _blocks_of_the_method(self) -> Self:
        refusal = blocks.refusal(self, self.method)
        if refusal is None and self.packing:
            refusal = objective_packs(self.method)
        if refusal is None and self.pair_split is True:
            refusal = splits_pairs(self.method)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    def settings_of(self, model: type[Settings]) -> Settings:
        """The settings block whose model is `model` (`training.<method>` of the objective that
        brings it), its defaults when unset: what the trainer and the planner read of it."""
        return blocks.settings_of(self, model)

    @property
    def method_settings(self) -> ApiModel | None:
        """The method's settings block, its defaults when unset; None for a method without one."""
        model = OBJECTIVES.get(self.method).settings
        return None if model is None else self.settings_of(model)


class CheckpointSpec(ApiModel):
    every_steps: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=100, description="Optimizer steps between checkpoints."
    )
    every_minutes: Annotated[int, Field(ge=1, le=10_080)] = Field(
        default=30,
        description=(
            "Minutes of training between checkpoints, whatever the step count: a long step or a"
            " large everySteps never risks more than this much work. `ftjob plan` says how many steps it is."
        ),
    )
    keep: Annotated[int, Field(ge=2, le=100)] = Field(
        default=3, description="Complete checkpoints kept (at least 2, so one survives a torn write)."
    )


# --- how the result is measured ------------------------------------------------------------


class EvaluationGenerate(ApiModel):
    count: Annotated[int, Field(ge=0, le=64)] = Field(
        default=4,
        description="Held-out examples with a reference answer answered greedily by the base and the tuned model "
        "and scored against the reference (ROUGE-L, chrF, BLEU, exact match); 0: none.",
    )
    max_new_tokens: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=64, description="Greedy tokens generated per answer."
    )


class EvaluationSpec(ApiModel):
    """The base model against the tuned one on the held-out split (dataset.evalFraction or dataset.eval);
    without a held-out split nothing is measured."""

    base: bool = Field(
        default=True,
        description="Measure the base (the adapter switched off) once before training; false: the tuned model only.",
    )
    at_checkpoints: bool = Field(
        default=False, description="Also measure the tuned model at every checkpoint (its history in evaluation.json)."
    )
    generate: EvaluationGenerate = Field(
        default_factory=EvaluationGenerate, description="Greedy answers of both models, scored against the reference."
    )


# --- where results go ----------------------------------------------------------------------


class OutputPvc(ApiModel):
    claim_name: ResourceName = Field(description="An existing PersistentVolumeClaim, mounted read-write.")
    path: RelativePath = Field(default="", description="Folder inside the claim; defaults to the job's name.")


class OutputStorage(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "quantity(string(self.size)).isGreaterThan(quantity('0'))",
                    "size must be greater than zero",
                    ".size",
                )
            ]
        }
    )

    size: PositiveQuantity = Field(description="Size of the PVC the operator creates, e.g. 50Gi.")
    storage_class_name: ResourceName | None = Field(
        default=None, description="StorageClass; the default class if unset."
    )
    delete_with_job: bool = Field(
        default=False, description="Delete the created PVC with the FineTuneJob (outputs survive by default)."
    )


ONE_OUTPUT = "exactly one of pvc or storage must be set"
OnExisting = Literal["resume", "fresh", "fail"]
# One of the output-format registry's names (finetune_api.formats): what the job writes beside
# the checkpoints.
FormatName = Annotated[str, FORMATS.choice()]
# f16 and q8_0 are written by llama.cpp's converter; q4_k_m by its llama-quantize from the f16 file.
GgufType = Literal["f16", "q8_0", "q4_k_m"]


def _peft_only() -> list[str]:
    return [ALWAYS_WRITTEN]


class SamplesSpec(ApiModel):
    count: Annotated[int, Field(ge=0, le=32)] = Field(
        default=3,
        description="Prompts answered after training (0: none): the first ones of the eval split (of the training "
        "data without one), or samplePrompts.",
    )
    sample_prompts: Annotated[list[Annotated[str, Field(min_length=1, max_length=4096)]], Field(max_length=32)] = Field(
        default_factory=list, description="Prompts to answer instead of the data's."
    )
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=128, description="Greedy tokens generated per answer."
    )


class OutputSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_cel("has(self.pvc) != has(self.storage)", ONE_OUTPUT)]}
    )

    pvc: OutputPvc | None = None
    storage: OutputStorage | None = None
    merge: bool = Field(
        default=False, description="Also write the adapter merged into the base model (formats: merged)."
    )
    formats: Annotated[list[FormatName], Field(max_length=4), Described("What to write:")] = Field(
        default_factory=_peft_only
    )
    gguf_type: GgufType = Field(
        default="f16",
        description="Tensor type of the GGUF model files (the GGUF LoRA is f16): f16 or q8_0, as llama.cpp's "
        "converter writes them, or q4_k_m, made from the converter's f16 file by llama.cpp's llama-quantize.",
    )
    s3: OutputS3 | None = Field(
        default=None,
        description="Also copy what the job wrote (the adapter, the formats, the report and summary; not the "
        "checkpoints) to this prefix of an S3-compatible bucket after training ends well; status.output.s3 says "
        "where. The claim keeps its copy.",
    )
    samples: SamplesSpec = Field(
        default_factory=SamplesSpec,
        description="Greedy answers after training, with the adapter and with the base, to samples.jsonl beside "
        "the adapter; the first answer goes to status.output.sample.",
    )
    on_existing: OnExisting = Field(
        default="resume",
        description="What a new job does with checkpoints it finds in its output folder that another job wrote "
        "(one deleted and re-created under the same name): resume = resume them when they were made by the same "
        "model, LoRA, data and schedule, and fail at once naming what differs otherwise; fresh = move them, with "
        "everything else in the folder, aside to previous-<time>/ in it and train from step 0; fail = refuse to "
        "start. A job's own retries always resume its own checkpoints.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.pvc is None) == (self.storage is None):
            raise ValueError(ONE_OUTPUT)
        return self

    @property
    def written(self) -> tuple[str, ...]:
        """The formats written, in the registry's order: peft always, merged also for merge: true."""
        return written_formats([*self.formats, *(("merged",) if self.merge else ())])


# --- where it runs -------------------------------------------------------------------------


PROCESSES_NEED_CPU = "processes is for CPU pods (gpus: 0); on GPUs there is one process per GPU"
DEVICE_MAP_ONE_PROCESS = (
    "resources.processes must be 1 with training.parallelism deviceMap (one process drives every device)"
)
DEVICE_MAP_ONE_NODE = (
    "resources.nodes must be 1 with training.parallelism deviceMap (one process drives the devices of one pod)"
)
MAX_NODES = 64


class ResourcesSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.processes) || self.processes <= 1 || (has(self.gpus) && self.gpus == 0)",
                    PROCESSES_NEED_CPU,
                    ".processes",
                )
            ]
        }
    )

    gpus: Annotated[int, Field(ge=0, le=64)] = Field(
        default=4,
        description=f"GPUs for the pod (0 = CPU): one training process per GPU (deviceMap: one); {EFFECTIVE_BATCH}.",
    )
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = Field(
        default=1,
        description="Pods (nodes) the job trains on together, each with `gpus` GPUs (or `processes` on the "
        f"CPU): the world size is nodes x processes per pod, and {EFFECTIVE_BATCH}, so more nodes train with "
        "a larger batch. More than 1 runs an Indexed Job and a headless Service; every claim the job mounts "
        "must then be mountable from every node (ReadWriteMany or ReadOnlyMany).",
    )
    gpu_product: Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)] = Field(
        default="Tesla-P40", description="Value of the node label nvidia.com/gpu.product."
    )
    cpu: PositiveQuantity | None = Field(default=None, description="CPU request and limit.")
    memory: PositiveQuantity | None = Field(
        default=None,
        description="Memory request and limit. Unset: the planner's host figure for the pod (processes x what each "
        "holds while loading, + 10% + 2 GiB) when the operator knows the model's shape, else the chart's default. "
        "Set below that figure, the job fails WontFit before any pod (`ftjob plan` prints the figure).",
    )
    processes: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None,
        description="Training processes of a CPU pod (gpus: 0; default 1). On GPUs there is one process per "
        f"GPU (deviceMap: one process). {EFFECTIVE_BATCH[0].upper()}{EFFECTIVE_BATCH[1:]}.",
    )

    @property
    def multinode(self) -> bool:
        """More than one node: see `finetune_api.multinode`."""
        return several_nodes(self.nodes)

    @field_validator("processes")
    @classmethod
    def _processes_on_cpu(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value > 1 and info.data.get("gpus", 0) != 0:
            raise ValueError(PROCESSES_NEED_CPU)
        return value


class Toleration(ApiModel):
    key: Annotated[str, Field(max_length=317)] | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: Annotated[str, Field(max_length=63)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


PRIORITY_NEEDS_QUEUE = "workloadPriorityClassName needs queueName (Kueue orders only the jobs it queues)"


class PlacementSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.workloadPriorityClassName) || has(self.queueName)",
                    PRIORITY_NEEDS_QUEUE,
                    ".workloadPriorityClassName",
                )
            ]
        }
    )

    node_selector: LabelMap = Field(default_factory=dict, description="Extra node labels the pod requires.")
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list, description="Extra tolerations (the GPU taint is tolerated already)."
    )
    affinity: AnyObject | None = Field(default=None, description="A core/v1 Affinity, passed through.")
    priority_class_name: ResourceName | None = Field(default=None, description="PriorityClass of the pod.")
    queue_name: KueueName | None = Field(
        default=None, description="Kueue LocalQueue; the Job is created suspended for Kueue to admit."
    )
    workload_priority_class_name: KueueName | None = Field(
        default=None,
        description="Kueue WorkloadPriorityClass: orders the queue and decides preemption (needs queueName).",
    )

    @model_validator(mode="after")
    def _priority_needs_queue(self) -> "PlacementSpec":
        if self.workload_priority_class_name is not None and self.queue_name is None:
            raise ValueError(PRIORITY_NEEDS_QUEUE)
        return self


# --- the whole spec ------------------------------------------------------------------------

_DEVICE_MAP_RULE = (
    "!(has(self.training) && has(self.training.parallelism) && self.training.parallelism == 'deviceMap' "
    "&& has(self.resources) && has(self.resources.processes) && self.resources.processes > 1)"
)
_DEVICE_MAP_NODES_RULE = (
    "!(has(self.training) && has(self.training.parallelism) && self.training.parallelism == 'deviceMap' "
    "&& has(self.resources) && has(self.resources.nodes) && self.resources.nodes > 1)"
)
_PASCAL_RULE = (
    f"!(self.precision in ['bf16', 'fp16']) || !self.resources.gpuProduct.matches('{PASCAL_PRODUCT_PATTERN}')"
)


def _format_rule() -> JsonDict:
    """`dataset.format` is one `training.method` reads (the registry's, when the schema is made):
    the CEL side of `objectives.reads`."""
    reads = {o.name: list(o.dataset_formats) for o in OBJECTIVES}
    known = {o.name: known_formats(o) for o in OBJECTIVES}
    listed = "; ".join(f"{name} reads {text}" for name, text in known.items())
    method = f"(has(self.training) && has(self.training.method) ? self.training.method : '{DEFAULT_METHOD}')"
    rule = _cel(
        f"self.dataset.format in {reads}[{method}]",
        f"dataset.format must be one training.method reads: {listed}",
        ".dataset.format",
    )
    message = _cel_text(NOT_READ, format="self.dataset.format", method=method, known=f"{known}[{method}]")
    return {**rule, "messageExpression": message}


def _held_out_rules() -> list[JsonDict]:
    """A held-out split with a method that takes none (the registry's, when the schema is made):
    the CEL side of `objectives.holds_out`."""
    method = f"(has(self.training) && has(self.training.method) ? self.training.method : '{DEFAULT_METHOD}')"
    out: list[JsonDict] = []
    for objective in OBJECTIVES:
        for field in HELD_OUT_FIELDS if objective.no_held_out else ():
            refusal = holds_out(objective.name, field)
            assert refusal is not None
            out.append(
                _cel(f"{method} != '{objective.name}' || !has(self.dataset.{field})", refusal, f".dataset.{field}")
            )
    return out


def _spec_rules(schema: JsonDict, _: Any = None) -> None:
    schema["x-kubernetes-validations"] = [
        _cel(
            _PASCAL_RULE,
            "precision bf16/fp16 is not supported on Pascal GPUs (no bf16; fp16 mixed "
            "precision breaks QLoRA there); use precision: fp32 or auto",
            ".precision",
        ),
        _cel(_DEVICE_MAP_RULE, DEVICE_MAP_ONE_PROCESS, ".resources.processes"),
        _cel(_DEVICE_MAP_NODES_RULE, DEVICE_MAP_ONE_NODE, ".resources.nodes"),
        _format_rule(),
        *_held_out_rules(),
    ]


class FineTuneJobSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=_spec_rules)

    model: ModelSpec = Field(description="The base model.")
    dataset: DatasetSpec = Field(description="The training data.")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapter shape.")
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec, description="Weight quantisation.")
    precision: Precision = Field(default="auto", description="Compute precision; auto = fp32 on GPUs without bf16.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation settings.")
    checkpoints: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoint cadence and retention.")
    evaluation: EvaluationSpec = Field(
        default_factory=EvaluationSpec,
        description="The base against the tuned model on the held-out split, before and after training "
        "(evaluation.json beside the adapter, status.evaluation); its time is in the plan.",
    )
    output: OutputSpec = Field(description="Where the adapter, checkpoints and logs go.")
    object_cache: ObjectCacheSpec | None = Field(
        default=None,
        description="The claim objects fetched from S3 (model.source.s3, dataset.source.s3, dataset.eval.s3) are "
        "kept on.",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="GPUs, CPU and memory.")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="Scheduling constraints.")
    image: ShortString | None = Field(
        default=None,
        description=(
            "Trainer image; the operator's default if unset. It must be in the platform's image"
            " allow-list (the chart's trainer.allowedImages): outside it the job ends Failed with"
            " reason ImageNotAllowed and gets no Job. `ftjob validate --values` checks it first."
        ),
    )
    suspend: bool = Field(
        default=False, description="Suspend the job (pods removed; resume continues from the last checkpoint)."
    )
    backoff_limit: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, description="Retries of retryable failures (each resumes from the last checkpoint)."
    )
    active_deadline_seconds: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Wall-clock limit for the whole job."
    )
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Delete the finished Job (not the FineTuneJob) after this long."
    )

    def effective_batch(self, processes: int) -> int:
        """Samples per optimizer step when each pod runs `processes` training processes (the
        plan's count: one per GPU, deviceMap one, on the CPU resources.processes)."""
        return self.training.batch_size * self.training.gradient_accumulation * processes * self.resources.nodes

    @model_validator(mode="after")
    def _pascal_precision(self) -> Self:
        if self.precision in HALF_PRECISIONS and is_pascal(self.resources.gpu_product):
            raise ValueError(pascal_precision_message(self.resources.gpu_product, self.precision))
        return self

    @model_validator(mode="after")
    def _objective_reads_the_format(self) -> Self:
        refusal = objective_reads(self.training.method, self.dataset.format)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _held_out_for_the_method(self) -> Self:
        taken = {"evalFraction": self.dataset.eval_fraction is not None, "eval": self.dataset.eval is not None}
        for field in HELD_OUT_FIELDS:
            refusal = holds_out(self.training.method, field) if taken[field] else None
            if refusal is not None:
                raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _device_map_one_process(self) -> Self:
        processes = self.resources.processes
        if self.training.parallelism == "deviceMap" and processes is not None and processes > 1:
            raise ValueError(DEVICE_MAP_ONE_PROCESS)
        return self

    @model_validator(mode="after")
    def _device_map_one_node(self) -> Self:
        if self.training.parallelism == "deviceMap" and self.resources.multinode:
            raise ValueError(DEVICE_MAP_ONE_NODE)
        return self


# Fields a running job may still change. Everything else is frozen by a CEL transition rule
# once the operator has recorded `status.startTime`.
MUTABLE_AFTER_START = ("suspend", "activeDeadlineSeconds", "ttlSecondsAfterFinished")
