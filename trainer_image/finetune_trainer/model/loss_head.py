"""The loss computed inside the LM head's own forward, in chunks of tokens.

Full-sequence FP32 logits are large (2048 x 128256 floats is 1 GiB, two or three copies in the
backward) and the planner may only fit a job when the loss is taken a chunk at a time. Putting
the cross-entropy inside the head's forward does that without touching the model's code: the
head's weights are gathered once per pass under FSDP (the head is its own FSDP unit), each
chunk's logits are recomputed in the backward instead of kept, and the model's forward returns
the summed loss where it would return logits. Chunk 0 means the whole sequence at once, kept
for the backward as a plain forward would.

A family whose forward transforms the logits (Gemma 2's final soft-cap, Cohere's logit scale)
has that transform applied here, per logit, before the cross-entropy; the model's own copy is
switched off (`families.take_logit_transform`), or it would soft-cap the summed loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..data.tokens import IGNORE
from ..memory.phases import PhaseProbe
from .families import LogitFunction, take_logit_transform


class LossHead(nn.Module):
    """Wraps the LM head; `labels` must be set before each forward (the model passes no labels)."""

    def __init__(self, head: nn.Module, chunk_tokens: int, transform: LogitFunction | None = None) -> None:
        super().__init__()
        self.head: Any = head
        self.chunk_tokens = chunk_tokens
        self.transform = transform
        self.labels: torch.Tensor | None = None
        # Set with `labels` for a per-sequence pass (the preference objectives): masks (K, B,
        # T - 1) over the shifted targets, and the forward returns (K, B, 1): each sequence's
        # cross-entropy summed under each mask, instead of one sum over the micro-batch.
        self.row_masks: torch.Tensor | None = None
        # Set while sample answers are generated (samples.py): the forward returns the last
        # position's logits instead of a loss. A flag, not a module swapped in: under fsdp this
        # module is the FSDP unit's own, and its forward is what gathers the head's weights.
        self.last_logits = False
        # Set by the loop around a training micro-batch: the loss is cut out of the step's
        # memory phases here (its start, and the gradient reaching the head's input).
        self.probe: PhaseProbe | None = None
        # Set with `labels` for GRPO: the forward returns (B, T - 1), each labelled position's
        # log-probability of its label under softmax(logits / temperature), 0 elsewhere (TRL's
        # per-token log-probabilities), a chunk of tokens at a time as the loss is.
        self.token_logps = False
        self.temperature = 1.0

    @property
    def weight(self) -> torch.Tensor:
        weight = self.head.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def _chunk(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.transform is not None:
            logits = self.transform(logits)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")

    def _chunk_rows(
        self, hidden: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, masks: torch.Tensor, count: int
    ) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.transform is not None:
            logits = self.transform(logits)
        each = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="none")
        out = masks.new_zeros((masks.shape[0], count))
        return out.index_add(1, rows, masks * each.unsqueeze(0))

    def _chunk_logps(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.transform is not None:
            logits = self.transform(logits)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return -F.cross_entropy(logits, labels, reduction="none")

    def _per_token(self, states: torch.Tensor, targets: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        # Only the labelled positions go through the head: a prompt costs no vocabulary-wide matmul.
        keep = (targets != IGNORE).nonzero().squeeze(1)
        out = states.new_zeros(shape[0] * shape[1], dtype=torch.float32)
        if keep.shape[0] == 0:  # nothing scored (a padding row): zeros with a graph
            return (out + states.sum() * 0.0).reshape(shape)
        states, targets = states[keep], targets[keep]
        size = self.chunk_tokens or states.shape[0]
        pieces = []
        for start in range(0, states.shape[0], size):
            end = start + size
            if size >= states.shape[0]:
                pieces.append(self._chunk_logps(states, targets))
                break
            piece = checkpoint(self._chunk_logps, states[start:end], targets[start:end], use_reentrant=False)
            pieces.append(piece)
        return out.index_put((keep,), torch.cat(pieces)).reshape(shape)

    def _per_sequence(self, states: torch.Tensor, targets: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        count, width = masks.shape[1], masks.shape[2]
        flat = masks.reshape(masks.shape[0], -1).to(states.device, torch.float32)
        rows = torch.arange(count * width, device=states.device) // width
        # Only the positions a mask counts go through the head (as TRL's fused head does): a
        # prompt's positions, which DPO does not score, cost no vocabulary-wide matmul.
        keep = ((flat != 0).any(dim=0) & (targets != IGNORE)).nonzero().squeeze(1)
        states, targets, rows, flat = states[keep], targets[keep], rows[keep], flat[:, keep]
        if states.shape[0] == 0:  # nothing scored (a padding pair cut to its prompt): zeros with a graph
            return (states.sum() * 0.0 + flat.new_zeros((flat.shape[0], count))).unsqueeze(-1)
        size = self.chunk_tokens or states.shape[0]
        if size >= states.shape[0]:
            return self._chunk_rows(states, targets, rows, flat, count).unsqueeze(-1)
        total = flat.new_zeros((flat.shape[0], count))
        for start in range(0, states.shape[0], size):
            end = start + size
            piece = checkpoint(
                self._chunk_rows,
                states[start:end],
                targets[start:end],
                rows[start:end],
                flat[:, start:end],
                count,
                use_reentrant=False,
            )
            total = total + piece
        return total.unsqueeze(-1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.last_logits:
            logits = self.head(hidden[:, -1:, :]).float()
            return self.transform(logits) if self.transform is not None else logits
        labels = self.labels
        if labels is None:
            raise RuntimeError("LossHead: labels were not set before the forward")
        masks, self.labels, self.row_masks = self.row_masks, None, None
        per_token, self.token_logps = self.token_logps, False
        if self.probe is not None:
            self.probe.loss_starts()
            if hidden.requires_grad:
                probe = self.probe
                # torch 2.7 leaves Tensor.register_hook unannotated.
                hidden.register_hook(lambda _grad: probe.loss_done())  # type: ignore[no-untyped-call]
        # Position t predicts token t + 1.
        states = hidden[:, :-1, :].reshape(-1, hidden.shape[-1])
        targets = labels.to(hidden.device)[:, 1:].reshape(-1)
        if per_token:
            return self._per_token(states, targets, (hidden.shape[0], hidden.shape[1] - 1))
        if masks is not None:
            return self._per_sequence(states, targets, masks)
        size = self.chunk_tokens or states.shape[0]
        if size >= states.shape[0]:
            return self._chunk(states, targets).reshape(1, 1, 1)
        total = states.new_zeros(())
        for start in range(0, states.shape[0], size):
            piece = checkpoint(
                self._chunk, states[start : start + size], targets[start : start + size], use_reentrant=False
            )
            total = total + piece
        return total.reshape(1, 1, 1)


@contextmanager
def logits_head(head: LossHead) -> Iterator[None]:
    head.last_logits = True
    try:
        yield
    finally:
        head.last_logits = False


def install(model: nn.Module, chunk_tokens: int) -> LossHead:
    """Replace the model's output layer with a LossHead around it; returns the LossHead."""
    base: Any = getattr(model, "get_base_model", lambda: model)()
    head: Any = base.get_output_embeddings()
    if head is None:
        raise ValueError("the model has no output embeddings to compute the loss with")
    wrapped = LossHead(head, chunk_tokens, take_logit_transform(base))
    base.set_output_embeddings(wrapped)
    return wrapped
