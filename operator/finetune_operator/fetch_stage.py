"""What to do for a job with S3 sources once its pre-flight passed: the object cache claim, the
fetch Job, its verdict (decide.py calls it; pure, like decide).

The pre-flight listed the objects and said their bytes; the claim is read (once per pass that
needs it), made for the namespace at a size from those bytes where the job names none and there
is none yet, and refused in one line where it cannot hold them; then the fetch Job, and the GPU
Job once it passed.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from finetune_api.contract import (
    FETCHED_PREFIX,
    LISTED_PREFIX,
    S3_INPUT_ROLES,
    TERMINAL_PHASES,
    cache_claim_name,
    fetch_job_name,
    s3_sources,
    said_after,
)
from finetune_api.quantities import describe_bytes, to_bytes
from finetune_api.spec import FineTuneJobSpec

from . import preflight
from .builders import objects as objects_builder
from .children import Owner, owned_by
from .settings import Settings

Body = dict[str, Any]


def listed_bytes(message: str) -> int:
    """The bytes the pre-flight listed (0 when it said none)."""
    listed = said_after(LISTED_PREFIX, message)
    return int(listed.get("bytes") or 0) if isinstance(listed, dict) else 0


def claim_capacity(claim: Body) -> str | None:
    """The claim's size: what it was given, else what it asked for."""
    status = (claim.get("status") or {}).get("capacity") or {}
    asked = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    found = status.get("storage") or asked.get("storage")
    return str(found) if found else None


def fetching_message(job: str, spec: FineTuneJobSpec) -> str:
    sources = [s.uri for role, s in s3_sources(spec).items() if role in S3_INPUT_ROLES and s is not None]
    return (
        f"fetching inputs: Job {fetch_job_name(job)} fetches {', '.join(sources)} into claim {cache_claim_name(spec)!r}"
    )


def _room(spec: FineTuneJobSpec, claim: Body | None, listed: int) -> tuple[str | None, str | None]:
    """(the claim's size, a refusal): the job's own claim must exist, and hold the objects."""
    name = cache_claim_name(spec)
    own = spec.object_cache is not None and spec.object_cache.claim_name is not None
    if claim is None:
        return None, (f"spec.objectCache.claimName: no claim {name!r} in the namespace" if own else None)
    capacity = claim_capacity(claim)
    if capacity is not None and listed > to_bytes(capacity):
        where = "spec.objectCache.claimName" if own else "spec.objectCache"
        return capacity, (
            f"{where}: the objects to fetch ({describe_bytes(listed)}) do not fit in the object cache claim "
            f"{name!r} ({capacity}): name a larger claim in spec.objectCache.claimName"
        )
    return capacity, None


class Seen(Protocol):
    """What the fetch stage reads of a reconcile's observation (decide.Observed)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def fetch(self) -> Body | None: ...
    @property
    def claim_read(self) -> bool: ...
    @property
    def cache_claim(self) -> Body | None: ...
    @property
    def pods(self) -> Sequence[Body]: ...


@dataclass(frozen=True)
class Step:
    """What the fetch stage asks of the reconcile: wait, read the claim, create (the claim and)
    the fetch Job, or nothing but the fetch's verdict (`verdict`; None before there is one)."""

    wait: bool = False
    read_claim: str | None = None
    create: tuple[Body, ...] = ()
    verdict: preflight.Verdict | None = None


def fetch(seen: Seen, owner: Owner, spec: FineTuneJobSpec, phase: Any, listed_message: str) -> Step:
    mine = seen.fetch if seen.fetch is not None and owned_by(seen.fetch, owner.uid) else None
    if mine is None and phase in TERMINAL_PHASES:
        return Step()
    if mine is None and seen.fetch is not None:
        return Step(wait=True)  # a deleted job's of the same name, still being collected
    if mine is None:
        if not seen.claim_read:
            return Step(read_claim=cache_claim_name(spec))
        listed = listed_bytes(listed_message)
        capacity, refused = _room(spec, seen.cache_claim, listed)
        if refused is not None:
            return Step(verdict=preflight.Verdict("failed", "InvalidConfig", refused))
        made: tuple[Body, ...] = ()
        if seen.cache_claim is None:
            capacity = objects_builder.claim_size(listed, seen.settings.object_cache_least)
            made = (objects_builder.cache_claim(seen.namespace, capacity, seen.settings),)
        job = objects_builder.fetch_job(owner, spec, seen.settings, capacity)
        return Step(create=(*made, job))
    uid = (mine.get("metadata") or {}).get("uid")
    pods = [p for p in seen.pods if owned_by(p, uid)]
    return Step(verdict=preflight.verdict(seen.name, spec, mine, pods, fetching_message(seen.name, spec)))


def inputs_of(pods: Sequence[Body]) -> list[Body] | None:
    """status.inputs: what the job's fetch pod said it fetched or reused, when its pod is seen."""
    for pod in pods:
        message = preflight.passed_message([pod])
        copies = said_after(FETCHED_PREFIX, message) if message else None
        if isinstance(copies, list):
            return [c for c in copies if isinstance(c, dict)]
    return None
