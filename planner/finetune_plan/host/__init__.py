"""Host memory: every figure of it the planner gives, and every limit it holds them to.

One owner, because the figures meet: what a process holds at its load (`process`), what offload
pins (`pinned`), the pod's request with its margin (`need`), the most it may have (`limit`) and
what offload may pin under that (`budget`) are each one another's input, and the operator writes
the pod's memory from the same figure the plan was bounded by. Computed anywhere else, two copies
of one sum drift apart, and a pod the plan said fits is OOM-killed while loading.

The GPU's bytes are `memory`'s; these modules read them (a layer's saved tensors, a recomputing
layer's input) and never the other way round. The sentences that state these figures to a user
are `messages.host`'s.
"""
