"""`ftjob plan FILE`: will the job fit its GPUs, in which mode, and how long will an epoch take.

The mode and the number of processes come from `finetune_plan.choose`, the call the
trainer makes in the pod, so what this prints is what the trainer will run on that hardware.
The model's config.json comes from `--model-config`, or from the job's model source when it is
on disk here (a PVC folder under `--volumes`, $FTJOB_VOLUMES or the current folder), or from
the planner's table of well-known Hub models (also when a PVC folder is named after one).
Exit status: 0 fits, 3 does not fit (the GPUs, the host memory a node offers, or `resources.memory`
below the pod's host figure), 1 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from finetune_api import FineTuneJob, ManifestError, modes, parse_file
from finetune_api.modes import to_spec
from finetune_api.problems import format_problems
from finetune_api.quantities import to_bytes
from finetune_api.spec import EFFECTIVE_BATCH_FACTORS, FineTuneJobSpec
from finetune_plan import GIB, ActivationAsk, LaunchPlan, ModelConfigError, Plan, choose, known_model, lookup, pairs
from finetune_plan.duration import job_time
from finetune_plan.gpu_products import known_names
from finetune_plan.grace import clock_steps, grace_of
from finetune_plan.inputs import product_for
from finetune_plan.lengths import longest_per_mode
from finetune_plan.messages.report import render
from finetune_plan.nodes import Nodes, room
from finetune_plan.parallelism import TRAINER_LOSS_CHUNKS
from finetune_plan.pod import Verdict, memory_refusal, verdict

from . import cluster_nodes, plan_evaluation
from .claim_paths import path_problems
from .cluster_nodes import nodes_for
from .errors import CliError
from .family import family_line
from .fetch_line import bandwidth, fetch_line
from .plan_head import head_lines, with_evaluation

DOES_NOT_FIT = 3
BYTES_PER_TOKEN = 4  # a rough average for English text with Llama-3's tokenizer


def _bool(flag: str, text: str | None) -> bool | None:
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise CliError(f"{flag}: expected true or false, got {text!r}")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "plan",
        help="check that a job fits its GPUs and estimate its speed",
        description="Per-GPU memory (quantised weights, embeddings/head, LoRA + optimizer, activations, "
        "temporaries, logits), the mode it would use, tokens/s and time per epoch. "
        "The mode is training.parallelism as the trainer will run it, from the same planner call it makes; "
        "the `host` line is the pod's host memory, against what a node of the product offers (or resources.memory); "
        "a CPU job (gpus: 0) gets one line. Exit 0 when it fits, 3 when it does not (the GPUs, the host memory "
        "a node offers, or resources.memory below the host figure), 1 on bad input.",
    )
    parser.add_argument("file", metavar="FILE.yaml")
    parser.add_argument("--model-config", metavar="PATH", help="the model's config.json (or its folder)")
    parser.add_argument(
        "--volumes",
        metavar="DIR",
        help="folder holding PVCs as DIR/<claimName>/ ($FTJOB_VOLUMES); the model and dataset paths must be there",
    )
    parser.add_argument("--gpus", type=int, metavar="N", help="GPUs per pod (default: spec.resources.gpus)")
    parser.add_argument("--gpu-product", metavar="NAME", help=f"GPU product; known: {', '.join(known_names())}")
    parser.add_argument("--gpu-memory-gib", type=float, metavar="X", help="memory per GPU (default: the product's)")
    parser.add_argument("--fp32-tflops", type=float, metavar="X", help="FP32 peak per GPU (default: the product's)")
    parser.add_argument(
        "--host-memory-per-gpu",
        metavar="QUANTITY",
        help="host memory a node offers a pod per GPU, e.g. 48Gi, as the chart's trainer.gpu.hostMemoryPerGpu "
        "sets it for the product (default: the product's; spec.resources.memory, when set, is the pod's)",
    )
    parser.add_argument("--max-length", type=int, metavar="L", help="tokens per sample (default: the spec's)")
    parser.add_argument("--batch-size", type=int, metavar="B", help="micro-batch per process (default: the spec's)")
    parser.add_argument("--lora-r", type=int, metavar="R", help="LoRA rank (default: the spec's)")
    parser.add_argument(
        "--gradient-checkpointing", metavar="true|false|auto", help="layers to recompute (default: the spec's)"
    )
    parser.add_argument(
        "--activation-offload", metavar="true|false|auto", help="activations to host memory (default: the spec's)"
    )
    parser.add_argument(
        "--mode",
        metavar="|".join(modes.SPEC_WORDS),
        help="training.parallelism to plan with (default: the spec's)",
    )
    parser.add_argument(
        "--attention",
        choices=("memory_efficient", "materialised"),
        default="memory_efficient",
        help="memory_efficient: the trainer's fused kernel, its usual one (fp32: k and v expanded to every head, "
        "SDPA's memory-efficient kernel) (default); materialised: eager attention, or SDPA's math kernel where "
        "the trainer's self-check finds no fused kernel, which keep the heads x seq x seq probabilities; a family "
        "without SDPA (Gemma 2) is always planned materialised",
    )
    parser.add_argument("--tokens", type=int, metavar="N", help="tokens in one epoch of the dataset")
    plan_evaluation.add_options(parser)
    parser.add_argument(
        "--fetch-bandwidth",
        metavar="RATE",
        help="the link to the S3 store, e.g. 1Gbit/s or 500MB/s: the fetch line then says how long the "
        "pre-flight's fetch of an s3 model takes",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    cluster_nodes.add_options(parser)
    parser.set_defaults(handler=run)


def read_json(path: Path, label: str) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"{label} {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{label} {path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{label} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise CliError(f"{label} {path}: expected a JSON object")
    return data


def _volume_roots(args: argparse.Namespace) -> list[Path]:
    roots = [args.volumes, os.environ.get("FTJOB_VOLUMES"), "."]
    return [Path(r) for r in roots if r]


def model_config(job: FineTuneJob, args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.model_config:
        return read_json(Path(args.model_config), "--model-config"), args.model_config
    source = job.spec.model.source
    if source.pvc is not None:
        candidates = [root / source.pvc.claim_name / source.pvc.path / "config.json" for root in _volume_roots(args)]
        for candidate in candidates:
            if candidate.is_file():
                return read_json(candidate, "model config"), str(candidate)
        named = _known_by_path(source.pvc.path)
        if named is not None:
            return named
        looked = ", ".join(str(c) for c in candidates)
        raise CliError(
            f"spec.model.source.pvc: the model's config.json is not here (looked at {looked}); "
            "pass --model-config PATH or --volumes DIR"
        )
    if source.s3 is not None:
        named = _known_by_path(source.s3.key)
        if named is not None:
            return named
        raise CliError(
            f"spec.model.source.s3: no offline config for {source.s3.uri}; pass --model-config PATH "
            "(the model's config.json)"
        )
    assert source.hub is not None
    known = known_model(source.hub.id)
    if known is None:
        raise CliError(
            f"spec.model.source.hub: no offline config for {source.hub.id}; pass --model-config PATH "
            "(the repository's config.json)"
        )
    return known, source.hub.id


def _config_or_none(job: FineTuneJob, args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        return model_config(job, args)[0]
    except CliError:
        return None


def _known_by_path(path: str) -> tuple[dict[str, Any], str] | None:
    """A PVC folder named like a Hub model (`.../meta-llama/Llama-3.3-70B-Instruct`) in the table."""
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2:
        return None
    hub_id = "/".join(parts[-2:])
    known = known_model(hub_id)
    return None if known is None else (known, f"{hub_id} (the planner's table)")


def epoch_tokens(job: FineTuneJob, args: argparse.Namespace) -> tuple[int | None, str]:
    if args.tokens is not None:
        if args.tokens < 1:
            raise CliError("--tokens: must be at least 1")
        return args.tokens, "given"
    source = job.spec.dataset.source
    if source.pvc is None:
        return None, ""
    for root in _volume_roots(args):
        path = root / source.pvc.claim_name / source.pvc.path
        if path.is_file():
            size = path.stat().st_size
        elif path.is_dir() and source.pvc.path:
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        else:
            continue
        return max(1, size // BYTES_PER_TOKEN), f"estimated from {size:,} bytes of {path}"
    return None, ""


def _check_positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise CliError(f"{name}: must be positive, got {value}")


def _bool_or_auto(flag: str, text: str | None) -> bool | Literal["auto"] | None:
    if text is not None and text.strip().lower() == "auto":
        return "auto"
    try:
        return _bool(flag, text)
    except CliError:
        raise CliError(f"{flag}: expected true, false or auto, got {text!r}") from None


def _mode(text: str | None) -> str | None:
    if text is None:
        return None
    mode = modes.parse(text)  # earlier releases' spellings are still accepted
    if mode is None:
        raise CliError(f"--mode: expected one of {', '.join(modes.SPEC_WORDS)}, got {text!r}")
    return mode


def planned_spec(spec: FineTuneJobSpec, args: argparse.Namespace) -> FineTuneJobSpec:
    """The spec with the command line's what-if overrides applied."""
    training = {
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "gradient_checkpointing": _bool_or_auto("--gradient-checkpointing", args.gradient_checkpointing),
        "activation_offload": _bool_or_auto("--activation-offload", args.activation_offload),
        "parallelism": _mode(args.mode),
    }
    changed = {k: v for k, v in training.items() if v is not None}
    update: dict[str, Any] = {}
    if changed:
        update["training"] = spec.training.model_copy(update=changed)
    if args.lora_r is not None:
        update["lora"] = spec.lora.model_copy(update={"r": args.lora_r})
    return spec.model_copy(update=update) if update else spec


def plan_job(job: FineTuneJob, args: argparse.Namespace) -> tuple[LaunchPlan, str]:
    for flag in ("gpu_memory_gib", "fp32_tflops", "max_length", "batch_size", "lora_r"):
        _check_positive("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.gpus is not None and args.gpus < 0:
        raise CliError(f"--gpus: must be 0 or more, got {args.gpus}")
    spec = planned_spec(job.spec, args)
    gpus = spec.resources.gpus if args.gpus is None else args.gpus
    if gpus == 0:
        _cpu_family_check(job, spec, args)
        return choose(spec, None, 0), ""
    if args.gpu_product and lookup(args.gpu_product) is None:
        raise CliError(f"--gpu-product {args.gpu_product}: unknown product; known: {', '.join(known_names())}")
    product = product_for(args.gpu_product, spec.resources.gpu_product)
    if args.fp32_tflops:
        product = replace(product, fp32_tflops=args.fp32_tflops)
    config, origin = model_config(job, args)
    tokens, token_origin = epoch_tokens(job, args)
    memory = int(args.gpu_memory_gib * GIB) if args.gpu_memory_gib else None
    host_per_gpu = _host_memory_per_gpu(args.host_memory_per_gpu)
    try:
        launch = choose(
            spec,
            config,
            gpus,
            memory,
            attention=args.attention,
            epoch_tokens=tokens,
            model_name=origin,
            product=product,
            host_memory_per_gpu=host_per_gpu,
        )
    except ModelConfigError as exc:
        raise CliError(f"{origin}: {exc}") from None
    return launch, token_origin


def _host_memory_per_gpu(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = to_bytes(text)
    except ValueError:
        raise CliError(f"--host-memory-per-gpu: {text!r} is not a quantity (e.g. 48Gi)") from None
    if value <= 0:
        raise CliError(f"--host-memory-per-gpu: must be positive, got {text!r}")
    return value


def _cpu_family_check(job: FineTuneJob, spec: FineTuneJobSpec, args: argparse.Namespace) -> None:
    """A CPU job plans no memory, but a model the trainer would refuse is refused here too
    (when its config.json can be found; the table of Hub models holds only supported ones)."""
    try:
        config, origin = model_config(job, args)
    except CliError:
        if args.model_config:
            raise
        return
    family_line(config, spec.lora.target_modules, origin)


def checkpoint_lines(plan: Plan, spec: FineTuneJobSpec) -> str:
    """What a preemption can cost: the clock's checkpoint in steps, and the SIGTERM grace period."""
    every = spec.checkpoints
    steps = clock_steps(plan, every.every_minutes, spec.training.gradient_accumulation)
    clock = f"everyMinutes {every.every_minutes}" + (f" = about {steps:,} steps" if steps else "")
    return f"checkpoints everySteps {every.every_steps}, {clock}; {grace_of(plan).describe()}"


def effective_batch_line(spec: FineTuneJobSpec, processes: int) -> str:
    """Samples per optimizer step and its factors, e.g. `effective batch 32 = 1 x 8 x 4 processes`;
    `processes` is the plan's count in each pod."""
    factors = [
        str(spec.training.batch_size),
        str(spec.training.gradient_accumulation),
        f"{processes} process" + ("" if processes == 1 else "es"),
    ]
    names: tuple[str, ...] = EFFECTIVE_BATCH_FACTORS[:3]
    if spec.resources.multinode:
        factors.append(f"{spec.resources.nodes} nodes")
        names = EFFECTIVE_BATCH_FACTORS
    return f"effective batch {spec.effective_batch(processes):,} = {' x '.join(factors)} ({' x '.join(names)})"


def _cpu_line(launch: LaunchPlan) -> str:
    count = f"{launch.processes} process" + ("" if launch.processes == 1 else "es")
    return f"CPU (spec.resources.gpus is 0): {launch.parallelism}, {count}, no GPU memory to plan (try --gpus N)"


def longest_line(plan: Plan, spec: FineTuneJobSpec) -> str:
    """The longest maxLength each mode fits at the job's batch, the kernel's attention included,
    and with the recomputing layers' inputs in host memory where the plan would put them there
    (`training.activationOffload` not false, some layers recomputing)."""
    inputs = ActivationAsk.of(spec.training).may_offload and plan.recipe.gradient_checkpointing
    recipe = replace(plan.recipe, loss_chunk_tokens=0, offload=False, offload_inputs=inputs)
    # A pair's sequences one micro-batch each where the plan would split them: the longest it fits.
    split = pairs.splittable(recipe)
    recipe = pairs.split(recipe) if split else recipe
    found = longest_per_mode(plan.shape, recipe, plan.hardware, TRAINER_LOSS_CHUNKS)
    shown = ", ".join(f"{to_spec(mode)} {length if length else 'none'}" for mode, length in found.items())
    where = "; the recomputing layers' inputs in host memory where needed" if inputs else ""
    where += "; pairs split where needed" if split or plan.recipe.pair_split else ""
    return f"longest   maxLength that fits, per mode (batch {plan.recipe.rows}{where}): {shown}"


def judged_spec(spec: FineTuneJobSpec, args: argparse.Namespace) -> FineTuneJobSpec:
    """The spec as the nodes are asked for it: `--gpus` and `--gpu-product` in its resources."""
    update: dict[str, Any] = {}
    if args.gpus is not None:
        update["gpus"] = args.gpus
    if args.gpu_product:
        update["gpu_product"] = args.gpu_product
    return spec.model_copy(update={"resources": spec.resources.model_copy(update=update)}) if update else spec


def _gpu_report(
    spec: FineTuneJobSpec,
    launch: LaunchPlan,
    plan: Plan,
    nodes: tuple[Nodes, str | None],
    token_origin: str,
    *,
    args: argparse.Namespace,
) -> tuple[Verdict, dict[str, Any], str]:
    """A GPU job's verdict, its JSON and its text: the verdict and the job's time first."""
    host = plan.host
    memory = spec.resources.memory or host.quantity
    said = verdict(spec, plan, nodes[0], to_bytes(memory))
    records = plan_evaluation.training_records(spec, args, _volume_roots(args))
    epoch = plan.speed.epoch_tokens if plan.speed else None
    trained = job_time(plan, spec, epoch, records=records, processes=launch.processes)
    evaluated = plan_evaluation.timed(plan, spec, args, _volume_roots(args), launch.processes)
    timed = with_evaluation(trained, evaluated)
    pod = {"memory": memory, "plannedMemory": host.quantity, "memoryShort": memory_refusal(spec, host)}
    result = {
        **plan.to_dict(),
        "fits": said.fits,
        "verdict": {"fits": said.fits, "reason": said.reason, "message": said.message},
        "nodes": {"source": nodes[0].source, "notTheClusters": nodes[1]},
        "jobSeconds": round(timed.seconds, 1) if timed.seconds is not None else None,
        "trainingSeconds": round(trained.seconds, 1) if trained.seconds is not None else None,
        "evaluation": evaluated.to_dict() if evaluated is not None else None,
        "pod": pod,
        "tokens_source": token_origin or None,
    }
    found = said.room if said.room is not None else room(spec, nodes[0], to_bytes(memory))
    head = head_lines(said, plan, timed, nodes, found, evaluated=evaluated)
    text = "\n".join([*head, render(plan, launch.processes)])
    return said, result, text


def run(args: argparse.Namespace) -> int:
    try:
        documents = parse_file(args.file)
    except ManifestError as exc:
        raise CliError(f"{args.file}: {exc}") from None
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    all_fit = True
    read: dict[str, tuple[Nodes, str | None]] = {}
    bandwidth(args.fetch_bandwidth)  # a wrong rate is refused before any plan
    rate = args.fetch_bandwidth
    for doc in documents:
        source = args.file if len(documents) == 1 else f"{args.file}[{doc.index}]"
        if doc.job is None:
            raise CliError("; ".join(format_problems(doc.problems, source)))
        explicit = args.volumes or os.environ.get("FTJOB_VOLUMES")
        if explicit and (missing := path_problems(doc.job.spec, Path(explicit))):
            # What the operator's input check would refuse, before a plan built on a guess.
            raise CliError(f"{source}: " + "; ".join(missing))
        launch, token_origin = plan_job(doc.job, args)
        spec = planned_spec(doc.job.spec, args)
        name = doc.job.metadata.name or doc.job.metadata.generate_name or ""
        launched = {
            "parallelism": launch.parallelism,
            "processes": launch.processes,
            "effective_batch": spec.effective_batch(launch.processes),
        }
        batch = effective_batch_line(spec, launch.processes)
        plan = launch.plan
        if plan is None:
            line = _cpu_line(launch)
            results.append({"name": name, "fits": True, **launched, "gpus": 0, "per_gpu": [], "message": line})
            texts.append(f"{source}: {name}: {line}\n{batch}")
            continue
        judged = judged_spec(spec, args)
        product = judged.resources.gpu_product
        nodes = read[product] if product in read else read.setdefault(product, nodes_for(args, product))
        said, result, text = _gpu_report(judged, launch, plan, nodes, token_origin, args=args)
        all_fit = all_fit and said.fits
        results.append({"name": name, **result, **launched})
        text += "\n" + longest_line(plan, spec) + "\n" + batch + "\n" + checkpoint_lines(plan, spec)
        fetched = fetch_line(spec, _config_or_none(doc.job, args), plan.shape.total_params, rate)
        if fetched is not None:
            text += "\n" + fetched
            results[-1]["fetch"] = fetched.removeprefix("fetch").strip()
        if token_origin and token_origin != "given" and plan.recipe.grpo is None:  # GRPO counts prompts
            text += f"\n          (epoch tokens {token_origin}, ~{BYTES_PER_TOKEN} bytes per token)"
        texts.append(f"{source}: {name}\n{text}")
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        print("\n\n".join(texts))
    return 0 if all_fit else DOES_NOT_FIT
