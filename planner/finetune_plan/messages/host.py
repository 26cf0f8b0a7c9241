"""The host memory in words: the pod's figure, and the one-line refusals when it does not fit.

`need_line` is the `host` line of `ftjob plan` and the body of the refusal of a
`resources.memory` set too low (`shortfall`: the operator's WontFit before any pod); `refusal` is a
plan's verdict when its pod is above what a node offers; `inputs_refusal` says why the recomputing
layers' inputs could not wait in host memory. The figures are `host`'s.
"""

from __future__ import annotations

from ..host.limit import SPEC_FIELD, HostLimit
from ..host.need import MARGIN_BYTES, MARGIN_FRACTION, HostNeed
from ..memory import GIB
from .figures import gib


def _margin() -> str:
    return f"{MARGIN_FRACTION:.0%} + {MARGIN_BYTES / GIB:.0f} GiB"


def need_line(need: HostNeed) -> str:
    """`48Gi of host memory for the pod: 4 processes x 10.3 GiB (...) + 10% + 2 GiB`."""
    per = need.per_process / GIB
    return (
        f"{need.quantity} of host memory for the pod: {need.processes} process"
        f"{'' if need.processes == 1 else 'es'} x {per:.1f} GiB ({need.mode}"
        f"{' streams the checkpoint' if need.mode == 'fsdp' and need.processes > 1 else ''}: at most the"
        " largest tensor in fp32 on the host"
        + (f", plus {need.pinned / GIB:.1f} GiB of offloaded activations, pinned" if need.pinned else "")
        + ")"
        f" + {_margin()}"
    )


def shortfall(need: HostNeed, asked_bytes: int) -> str | None:
    """The one-line refusal when `asked_bytes` (spec.resources.memory) is below the need, else None."""
    if asked_bytes >= need.pod_bytes:
        return None
    return (
        f"{SPEC_FIELD} {asked_bytes / GIB:.1f} GiB is below the {need_line(need)}; "
        f"raise it to at least {need.quantity} or leave it unset for the operator to size the pod"
    )


def refusal(need: HostNeed, limit: HostLimit, *, offloads: bool) -> str:
    """The one-line verdict when the plan's pod needs more host memory than a node offers,
    naming the fields that would change it (`offloads`: `activationOffload: true` was asked)."""
    pinned = need.pinned
    fixes = [limit.raise_it]
    if pinned and offloads:
        fixes.insert(0, "set training.activationOffload: auto (it offloads what fits)")
    elif pinned:
        fixes.append("lower training.maxLength (fewer bytes pinned per layer)")
    return (
        f"does not fit the host memory: the pod needs {need.pod_bytes / GIB:.1f} GiB ({need.processes}"
        f" x {need.per_process / GIB:.1f} GiB"
        + (f", {pinned / GIB:.1f} GiB of it pinned activations" if pinned else "")
        + f", + {_margin()}), above "
        f"{limit.describe()}: " + ", or ".join(fixes)
    )


def inputs_refusal(pod_bytes: float, limit: HostLimit) -> str:
    """Why the recomputing layers' inputs stay on the GPUs, which they would fit in host memory:
    the pod would be above `limit`."""
    return (
        f"the recomputing layers' inputs in host memory would fit the GPUs, but take the pod to "
        f"{gib(pod_bytes)}, above {limit.describe()}: {limit.raise_it}, or lower training.maxLength"
    )
