"""The steps of a job that reach outside its claims, each in the pod that owns it:

- the pre-flight (`--check-inputs`) lists each S3 source (credentials, bucket, key, endpoint: a
  mistake fails here, in one line naming the field, before anything is fetched) and says the bytes
  to fetch in its termination message, from which the operator sizes the object cache claim; and
  it asks a Hub source's endpoint for an answer within seconds;
- the fetch Job (`--fetch-inputs`) fetches them into the claim, or reuses the copy there;
- the trainer, after training ended well, copies the outputs to `output.s3`.
"""

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Final

from finetune_api import contract
from finetune_api.contract import FETCHED_PREFIX, LISTED_PREFIX
from finetune_api.quantities import to_bytes
from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig

from ..failures import TrainerFailure

log = logging.getLogger(__name__)

HUB_ENDPOINT: Final = "https://huggingface.co"
HUB_TIMEOUT_S: Final = 5


def list_inputs(config: TrainerConfig) -> dict[str, Any] | None:
    """{bytes, sources: {role: {uri, objects, bytes}}} of the job's S3 sources; None without any."""
    from ..objects.listing import list_source
    from ..objects.store import INPUT_ROLES, client, wheres

    found = wheres(config.spec, INPUT_ROLES)
    if not found:
        return None
    sources: dict[str, Any] = {}
    for role, where in found:
        listing = list_source(client(where), where)
        sources[role] = {"uri": listing.uri, "objects": len(listing.objects), "bytes": listing.size}
        log.info("%s: %s holds %d objects, %d bytes", role, listing.uri, len(listing.objects), listing.size)
    return {"bytes": sum(s["bytes"] for s in sources.values()), "sources": sources}


def listed_message(listed: dict[str, Any]) -> str:
    return LISTED_PREFIX + json.dumps(listed, separators=(",", ":"), sort_keys=True)


def _capacity() -> int | None:
    value = os.environ.get(contract.OBJECT_CACHE_SIZE_ENV)
    try:
        return to_bytes(value) if value else None
    except ValueError:
        return None


def fetch_inputs(config: TrainerConfig) -> list[dict[str, Any]]:
    """Fetch (or reuse) every S3 source into the object cache; what was done, per source."""
    from ..objects.fetch import fetch_source
    from ..objects.listing import list_source
    from ..objects.store import INPUT_ROLES, client, wheres

    root = config.paths.objects
    if root is None:
        return []
    claim = contract.cache_claim_name(config.spec)
    Path(root).mkdir(parents=True, exist_ok=True)
    # Every source listed before any is fetched: a missing dataset is refused before the model's
    # bytes come over (`ftjob run` has no pre-flight of its own to list them first).
    listed = [(role, where, list_source(client(where), where)) for role, where in wheres(config.spec, INPUT_ROLES)]
    done = []
    for role, where, listing in listed:
        fetched = fetch_source(role, where, listing, Path(root), capacity=_capacity(), claim=claim)
        done.append(fetched.to_dict(claim))
    return done


def fetched_message(done: list[dict[str, Any]]) -> str:
    return FETCHED_PREFIX + json.dumps(done, separators=(",", ":"), sort_keys=True)


def check_hub(config: TrainerConfig) -> None:
    """A Hub source's endpoint answers (any answer: without the token a private repository's is
    401) within seconds; else one line naming the field, not the Hub library's retries."""
    import requests

    spec = config.spec
    held_out = spec.dataset.eval.hub if spec.dataset.eval is not None else None
    hubs = (
        ("spec.model.source.hub", spec.model.source.hub),
        ("spec.dataset.source.hub", spec.dataset.source.hub),
        ("spec.dataset.eval.hub", held_out),
    )
    for field, hub in hubs:
        if hub is None:
            continue
        endpoint = os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT
        kind = "datasets" if field.startswith("spec.dataset") else "models"
        url = f"{endpoint.rstrip('/')}/api/{kind}/{hub.id}/revision/{hub.revision}"
        try:
            requests.head(url, timeout=HUB_TIMEOUT_S, allow_redirects=False)
        except requests.RequestException as exc:
            errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
            why = errno.group(1).strip() if errno else type(exc).__name__
            raise TrainerFailure(
                ExitReason.InvalidConfig, f"{field}: cannot reach the Hub at {endpoint}: {why}"
            ) from None


def upload(config: TrainerConfig) -> dict[str, Any] | None:
    """Copy the outputs to output.s3 (pod 0 of a job, after training ended well); None without it."""
    from ..objects.store import OUTPUT_ROLES, wheres
    from ..objects.upload import upload_outputs

    found = wheres(config.spec, OUTPUT_ROLES)
    if not found or os.environ.get("JOB_COMPLETION_INDEX", "0") != "0":
        return None
    _, where = found[0]
    done = upload_outputs(where, Path(config.paths.output))
    return {"uri": done.uri, "files": done.files, "bytes": done.size}
