"""GRPO's step (`training.method: grpo`), planned: its memory and its time beside the scored pass.

A micro-batch is `training.batchSize` prompts; each prompt gets G = numGenerations completions of
at most C = maxCompletionLength tokens, so the scored micro-batch is batchSize x G sequences of a
prompt and its completion. The planner knows no prompt's length beyond maxLength: it plans the
longest the data check lets through, P = maxLength - C, so every row is maxLength tokens.

Each optimizer step starts with its micro-batches' rollouts, one prompt at a time as one batch of
G rows, in eval mode without gradients: a prefill of G x P tokens, then a one-token forward per
new token reading the KV cache (k and v of every layer for every token of every row); under fsdp
(the ranks run every forward in lockstep) each new token is a forward of the whole rows so far,
without a cache. Then, per micro-batch: the forward for the old log-probabilities where one batch
of rollouts serves numIterations > 1 optimizer steps, the reference forward (adapter off) where
beta > 0, and the trained forward and backward of batchSize x G sequences.

`spec` reads the spec's words into the recipe (`Recipe.grpo`, `sequences_per_row` = G, the
reference forward where beta > 0), `phases` the bytes of the phases without gradients on a GPU
(the layouts put them in `GpuMemory.rollouts`), `timing` the rollouts' and the old forward's
seconds added to the trained micro-batch's (`timing.estimate`, which the search weighs), and
`step` the figures a plan says of its GRPO step and the job's optimizer steps.
"""
