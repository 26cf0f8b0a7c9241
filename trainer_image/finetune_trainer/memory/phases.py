"""A training step's GPU memory, phase by phase, on this rank's GPU: the measured side of the plan's
parts (`finetune_plan.memory.GpuMemory`), so the planner can be fitted and judged part by part.

Each training micro-batch is cut at three points: its forward starts (what is resident: weights,
adapter and its gradients, optimizer state), the loss head starts (plus every layer's saved
activations), and the gradient reaches the loss head's input (the loss is done). The allocator's
peak is read and reset at each cut, so the forward's, the loss's and the backward's peaks come
apart. The parts kept are the largest over the run's training micro-batches, each on its own:
  resident     allocated when a forward starts
  activations  allocated when the loss starts, less resident
  forward      the forward's peak above resident + activations (a layer's transients, and with
               offload the copies still in flight)
  loss         the loss's peak above resident + activations (the logits, or one chunk of them)
  backward     the backward's peak above resident + activations (the last layer's backward, its
               recompute or its activations fetched back)
Evaluation is not cut: it runs the same path with a zero backward.

Reading and resetting the allocator's peak is host-side bookkeeping (no device sync), so the cuts
cost nothing measurable. Because the peak is reset, the run's overall peak is `peak_bytes()`: the
largest of every phase's and of what came before the first cut (the load).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GIB = 2**30


@dataclass
class PhaseProbe:
    device: torch.device
    parts: dict[str, int] = field(default_factory=dict)
    _earlier_peak: int = 0
    _resident: int = 0
    _after_forward: int = 0

    @property
    def enabled(self) -> bool:
        return self.device.type == "cuda"

    def _take_peak(self) -> int:
        """The allocator's peak since the last cut, which then starts again from what is allocated."""
        peak = torch.cuda.max_memory_allocated(self.device)
        self._earlier_peak = max(self._earlier_peak, peak)
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def _keep(self, name: str, value: int) -> None:
        self.parts[name] = max(self.parts.get(name, 0), value)

    def forward_starts(self) -> None:
        if not self.enabled:
            return
        self._take_peak()
        self._resident = torch.cuda.memory_allocated(self.device)
        self._keep("resident", self._resident)

    def loss_starts(self) -> None:
        if not self.enabled:
            return
        peak = self._take_peak()
        self._after_forward = torch.cuda.memory_allocated(self.device)
        self._keep("activations", self._after_forward - self._resident)
        self._keep("forward", peak - self._after_forward)

    def loss_done(self) -> None:
        if not self.enabled:
            return
        self._keep("loss", self._take_peak() - self._after_forward)

    def backward_done(self) -> None:
        if not self.enabled:
            return
        self._keep("backward", self._take_peak() - self._after_forward)

    def peak_bytes(self) -> int:
        """The run's peak allocated bytes on this GPU, across every cut."""
        return max(self._earlier_peak, torch.cuda.max_memory_allocated(self.device))

    def summary(self) -> dict[str, float] | None:
        """The parts in GiB (None off the GPU, or before a training micro-batch ran)."""
        if not self.enabled or "backward" not in self.parts:
            return None
        return {name: round(value / GIB, 3) for name, value in self.parts.items()}
