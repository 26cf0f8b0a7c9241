"""The README's results table, rendered from the committed bench/results/*.json comparison files.

python -m bench.table            # prints the Markdown table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HEADER = (
    "| date | GPU | layers | GPUs | ours' mode | reference run | reference tok/s | ours tok/s | ours / reference "
    "| MFU per GPU (ref / ours) | peak GiB per GPU (ref / ours) | loss after N steps (ref / ours) |\n"
    "| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | --- | --- | --- |"
)


def _fmt_peaks(values: list[float] | None) -> str:
    return "-" if not values else "+".join(f"{v:.1f}" for v in values)


def row(record: dict[str, Any]) -> str | None:
    ref, ours = record.get("reference") or {}, record.get("ours") or {}
    if "tok_s" not in ref or "tok_s" not in ours:
        return None
    mfu_ref, mfu_ours = record.get("reference_mfu_per_gpu"), record.get("ours_mfu_per_gpu")
    mfu_text = "-" if mfu_ref is None or mfu_ours is None else f"{mfu_ref:.0%} / {mfu_ours:.0%}"
    steps = record.get("steps", 0) + record.get("warm_steps", 0)
    mode = ours.get("parallelism") or record.get("mode") or "-"
    if "nop2p" in str(record.get("mode", "")):
        mode += " (NCCL_P2P_DISABLE=1)"
    nodes = record.get("nodes")
    if nodes:
        # A job of several pods: one launcher per pod, rendezvous and NCCL over TCP.
        mode = f"{nodes} nodes x {record['gpus'] // nodes} GPU, {mode}, NCCL over TCP"
    ref_gpus = ref.get("gpus", 1)
    against = (
        f"{ref_gpus} GPU" + (", layers split" if ref.get("split") else "")
        if ref_gpus == 1
        else (f"{ref_gpus} GPUs, layers split")
    )
    layers = (record.get("shape") or {}).get("layers", "-")
    return (
        f"| {record['date']} | {record.get('gpu') or '-'} | {layers} | {record['gpus']} | {mode} | {against} "
        f"| {ref['tok_s']:.0f} | {ours['tok_s']:.0f} "
        f"| {record.get('ratio', ours['tok_s'] / ref['tok_s']):.3f}x | {mfu_text} "
        f"| {_fmt_peaks(ref.get('peak_gib'))} / {_fmt_peaks(ours.get('peak_gib'))} "
        f"| {ref['loss_last']:.3f} / {ours['loss_last']:.3f} (N={steps}) |"
    )


def render(folder: Path = RESULTS) -> str:
    rows = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: not a results file ({exc})") from None
        line = row(record) if isinstance(record, dict) and "gpus" in record and "ours" in record else None
        if line:
            rows.append(line)
    return "\n".join([HEADER, *rows]) if rows else HEADER + "\n| (no results committed yet) |"


if __name__ == "__main__":
    sys.stdout.write(render() + "\n")
