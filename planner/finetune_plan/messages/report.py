"""The plan as text for people, as `ftjob plan` prints it: one column per GPU, then the verdict,
the pod's host memory and the speed."""

from __future__ import annotations

from collections.abc import Callable

from .. import calibration as cal
from .. import pairs
from ..families import describe
from ..memory import GIB, GpuMemory
from ..results.plan import Plan
from .host import need_line

ROWS: tuple[tuple[str, Callable[[GpuMemory], float]], ...] = (
    ("quantised weights", lambda g: g.quantised_weights),
    ("embeddings + head", lambda g: g.embeddings_head),
    ("norms", lambda g: g.norms),
    ("LoRA + optimizer", lambda g: g.lora_optimizer),
    ("activations", lambda g: g.activations),
    ("temporaries (layer pass)", lambda g: g.temporaries),
    ("logits (loss pass)", lambda g: g.logits),
    ("CUDA context + slack", lambda g: g.overhead),
    ("total", lambda g: g.total),
    ("headroom", lambda g: g.headroom),
)


def duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {mins}m"
    return f"{mins}m {int(seconds % 60)}s"


def _params(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def render(plan: Plan, processes: int | None = None) -> str:
    """The plan's text; `processes`, the launch's count, is named on the `gpus` line when given."""
    shape, recipe, hw = plan.shape, plan.recipe, plan.hardware
    quant = recipe.quantization + (" + double quant" if recipe.double_quant and recipe.quantization != "none" else "")
    compute = "fp32" if recipe.compute_bytes == 4 else "16-bit"
    activations = (
        plan.activations.checkpointing
        if plan.activations is not None
        else ("checkpointed layer inputs" if recipe.gradient_checkpointing else "full, no checkpointing")
    )
    lines = [
        f"model     {shape.name or 'model'}: {_params(shape.total_params)} parameters, {shape.layers} layers, "
        f"hidden {shape.hidden}, vocab {shape.vocab}",
        *([f"family    {describe(shape.family, recipe.lora_targets)}"] if shape.family is not None else []),
        f"recipe    {quant} weights, {compute} compute, LoRA r={recipe.lora_r} on {','.join(recipe.lora_targets)}, "
        f"{recipe.optimizer}",
        f"          maxLength {recipe.max_length} x batch {recipe.rows}, activations: {activations}, "
        f"attention {recipe.attention}"
        + ", loss "
        + (
            f"in chunks of {recipe.loss_chunk_tokens} tokens" if recipe.loss_chunk_tokens else "over the whole sequence"
        ),
        f"gpus      {hw.gpus} x {hw.product.name}, {hw.memory_gib:.1f} GiB each; parallelism {plan.parallelism}"
        + ("" if processes is None else f", {processes} process{'' if processes == 1 else 'es'}"),
        "",
    ]
    width = 26
    header = "GiB per GPU".ljust(width) + "".join(f"{'GPU' + str(g.index):>9}" for g in plan.per_gpu)
    lines.append(header)
    lines.append("layers".ljust(width) + "".join(f"{g.layers:>9}" for g in plan.per_gpu))
    rows = ROWS
    if any(g.rollouts for g in plan.per_gpu):  # GRPO's phases without gradients, before the total
        rows = (*ROWS[:-3], ("rollouts (no-grad phase)", lambda g: g.rollouts), *ROWS[-3:])
    for label, value in rows:
        lines.append(label.ljust(width) + "".join(f"{value(g) / GIB:>9.2f}" for g in plan.per_gpu))
    lines.append("  (total = resident + the larger of the layer pass and the loss pass + context)")
    if rows is not ROWS:
        lines.append("  (or, where larger, the weights, adapter and optimizer + the rollouts + context)")
    lines.append("")
    # The GPUs' and the host's word on the plan; `ftjob plan` says the job's one verdict above it.
    lines.append(f"memory    {plan.message}")
    need = plan.host
    lines.append(f"host      {need_line(need)}")
    if plan.host_limit is not None:
        limit = plan.host_limit
        detail = f" ({limit.detail})" if limit.detail else ""
        lines.append(f"          pod {need.quantity} of {limit.describe()}{detail}")
    if plan.speed is not None:
        speed = plan.speed
        lines.append(
            f"speed     {speed.tokens_per_second:,.0f} tokens/s ({speed.flops_per_token / 1e9:.1f} GFLOP per token, "
            f"{hw.product.fp32_tflops:g} TFLOP/s FP32 peak x {cal.COMPUTE_UTILISATION:g} utilisation, "
            f"{speed.bound}-bound)"
        )
        if plan.activations is not None:
            act = plan.activations
            against = act.all_recompute_tokens_per_second
            compared = against is None or "against" in act.checkpointing
            lines.append(
                f"layers    {act.checkpointing}" + ("" if compared else f"; all-recompute {against:,.0f} tok/s")
            )
            lines.append(f"offload   {act.offload}")
        lines.extend(pair_lines(plan))
        lines.extend(grpo_lines(plan))
        if speed.seconds_per_epoch is not None and speed.epoch_tokens is not None:
            lines.append(f"epoch     {speed.epoch_tokens:,} tokens: {duration(speed.seconds_per_epoch)}")
    return "\n".join(lines)


def pair_lines(plan: Plan) -> list[str]:
    """How a row's sequences go through the model (`pairs`), and the forwards without gradients
    each micro-batch runs beside the trained ones, with their share of its time."""
    recipe, speed = plan.recipe, plan.speed
    if speed is None:
        return []
    step = f"of {speed.step_seconds:.2f} s per micro-batch"
    lines = []
    described = pairs.describe(recipe)
    if described is not None:
        if recipe.pair_split:
            described += " (memory"
            unsplit = plan.unsplit
            if unsplit is not None:
                fullest = unsplit.fullest
                described += (
                    f": one of {recipe.sequences_per_row} x {recipe.rows} sequences needs {fullest.total / GIB:.1f} "
                    f"GiB on GPU {fullest.index}, {unsplit.shortfall / GIB:.1f} GiB more than its "
                    f"{plan.hardware.memory_gib:.1f} GiB"
                )
            described += f"); each side first once without gradients: {speed.split_seconds:.2f} s {step}"
        lines.append(f"pairs     {described}")
    if recipe.reference_forwards:
        count = recipe.reference_forwards
        lines.append(
            f"reference {count} no-grad forward{'' if count == 1 else 's'} per sequence (the model without its "
            f"adapter): {speed.reference_seconds:.2f} s {step}"
        )
    return lines


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 100 else duration(value)


def grpo_lines(plan: Plan) -> list[str]:
    """GRPO's step (`grpo`): its rollouts and their KV cache, and an optimizer step's seconds,
    the rollouts' share apart from the scoring (the forwards without gradients, the trained
    passes, the optimizer)."""
    step = plan.grpo
    if step is None:
        return []
    cache = (
        f"KV cache {step.kv_cache_bytes / GIB:.2f} GiB"
        if step.cached
        else "no KV cache (fsdp: each new token a forward of the whole rows)"
    )
    shared = f" (a batch of rollouts serves {step.iterations} steps)" if step.iterations > 1 else ""
    prompts = f"{step.prompts} prompt{'' if step.prompts == 1 else 's'} of up to {step.prompt_tokens:,} tokens"
    return [
        f"grpo      step: rollouts {step.generations} x {step.completion_tokens} tokens per prompt ({prompts} a "
        f"micro-batch), {cache}; generation {_seconds(step.generation_seconds)}{shared}, scoring "
        f"{_seconds(step.scoring_seconds)}, per step {_seconds(step.step_seconds)}"
    ]
