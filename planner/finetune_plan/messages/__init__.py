"""The planner's sentences: what `ftjob plan` prints and what a job refused as WontFit says.

Every line a person reads of a plan is built here from figures the other modules computed: the
verdict on the GPUs and what would fit instead (`verdict`, `suggestions`), the host memory and its
refusals (`host`), the layers' activations and why offload is on or off (`activations`), and the
whole plan as text (`report`). Kept apart so that the figures have one source and the words one
place to be read and changed: none of these modules computes a figure of its own.
"""
