"""Sampling a completion's next token from counter-based noise: the same token for the same
(seed, step, prompt, completion, position), whichever rank samples it and whatever else is in
its batch.

A sampler that draws from one generator (torch.multinomial, `generate(do_sample=True)`) gives a
row a token that depends on the rows drawn before it, so two processes would not sample what one
process with twice the accumulation samples, and a step resumed after a SIGTERM would not
sample what the uninterrupted step did. Here each row has a key, each position a counter, and
each vocabulary entry its own uniform number, hashed from the three with integer arithmetic
(splitmix64's finaliser), which is exact on every device; the token is the Gumbel-max of the
temperature-scaled logits (a draw from their softmax), restricted to the top-p nucleus as
transformers' `TopPLogitsWarper` keeps it.
"""

from __future__ import annotations

import torch

# splitmix64's constants, as signed 64-bit integers (torch has no unsigned 64-bit arithmetic:
# products wrap in two's complement, which is what the hash needs).
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
_BITS = 24  # the uniform's resolution: a float32 holds 24 bits exactly


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift: torch's `>>` on int64 keeps the sign bit."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors."""
    x = (x ^ _shift(x, 30)) * _MIX1
    x = (x ^ _shift(x, 27)) * _MIX2
    return x ^ _shift(x, 31)


def row_keys(seed: int, step: int, prompts: list[int], generations: int) -> torch.Tensor:
    """One key per completion: `generations` for each of `prompts` (global numbers that do not
    depend on the rank), for optimizer step `step`'s rollouts, as int64 (G x len(prompts),)."""
    base = mix(torch.tensor([seed * 1_000_003 + step], dtype=torch.int64) * _GOLDEN)
    prompt = torch.tensor(prompts, dtype=torch.int64).repeat_interleave(generations)
    within = torch.arange(generations, dtype=torch.int64).repeat(len(prompts))
    return mix(mix(base + prompt * _GOLDEN) + (within + 1) * _GOLDEN)


def uniforms(keys: torch.Tensor, position: int, vocab: int, device: torch.device) -> torch.Tensor:
    """(rows, vocab) uniform numbers in (0, 1), float32: row i's for token `position`."""
    counter = torch.tensor(position + 1, dtype=torch.int64, device=device) * _MIX1  # wraps, as the hash needs
    at = mix(keys.to(device) + counter).unsqueeze(1)
    entries = torch.arange(vocab, dtype=torch.int64, device=device).unsqueeze(0)
    bits = _shift(mix(at ^ (entries * _GOLDEN)), 64 - _BITS)
    return (bits.to(torch.float32) + 0.5) / float(1 << _BITS)


def top_p_mask(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """True where a token is outside the nucleus: transformers' TopPLogitsWarper's rule (the
    smallest tokens whose probabilities sum to at most 1 - top_p go; the likeliest always stays)."""
    if top_p >= 1.0:
        return torch.zeros_like(scaled, dtype=torch.bool)
    ordered, order = torch.sort(scaled, descending=False, dim=-1)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)
    drop[..., -1] = False
    return drop.scatter(-1, order, drop)


def sample(logits: torch.Tensor, keys: torch.Tensor, position: int, temperature: float, top_p: float) -> torch.Tensor:
    """(rows,) tokens drawn from softmax(logits / temperature) within the top-p nucleus, each row
    from its own key's noise at `position`. `logits` (rows, vocab) are float32."""
    scaled = logits.float() / temperature
    noise = uniforms(keys, position, scaled.shape[-1], scaled.device)
    gumbel = -torch.log(-torch.log(noise))
    scored = (scaled + gumbel).masked_fill(top_p_mask(scaled, top_p), float("-inf"))
    return scored.argmax(dim=-1)
