"""What one reconcile of one ModelServer should do, from what it saw: no I/O, no clock.

Refusals first, each ending the server Failed with one line naming the field and no child made
(or, for a server that ran, its Deployment left as it was): a spec the models refuse, a
namespace the operator never writes in, an image outside the serving allow-list, then what its
jobs and claims say (finetune_api.served_files). Then the children: created while the Deployment
is missing, the Deployment applied again when what the spec makes of it changed (a hash of it
rides on the Deployment), and the status from the Deployment and its pods.
"""

import dataclasses
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from finetune_api import images
from finetune_api.problems import problems_from
from finetune_api.served_files import Resolution, resolve
from finetune_api.server_spec import ModelServerSpec

from ..builders import model_server as builder
from ..settings import Settings
from . import status as server_status

Body = dict[str, Any]
# The hash of the Deployment the spec makes, on the Deployment: a change applies it again.
TEMPLATE_HASH: Final = "finetune.dev/server-template"
INVALID: Final = "Invalid"
IMAGE_NOT_ALLOWED: Final = "ImageNotAllowed"
NAMESPACE_NOT_ALLOWED: Final = "NamespaceNotAllowed"


@dataclass(frozen=True)
class ServerObserved:
    namespace: str
    name: str
    settings: Settings
    now: str
    body: Body | None
    jobs: Mapping[str, Body | None] = field(default_factory=dict)  # the jobs the spec names (None: not found)
    claims: Collection[str] | None = None  # the claims of the namespace it names that exist
    deployment: Body | None = None
    pods: Sequence[Body] = ()
    rejected: str | None = None  # the API server refused a child just now, saying this


@dataclass(frozen=True)
class ServerActions:
    create: tuple[Body, ...] = ()
    apply: Body | None = None  # the Deployment to apply again
    status_patch: Body | None = None
    events: tuple[tuple[str, str], ...] = ()
    phase: str | None = None


def parse(body: Body) -> tuple[ModelServerSpec | None, str | None]:
    try:
        return ModelServerSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        return None, "; ".join(str(p) for p in problems_from(exc, ModelServerSpec, prefix="spec"))


def template_hash(deployment: Body) -> str:
    return hashlib.sha256(json.dumps(deployment["spec"], sort_keys=True).encode()).hexdigest()[:16]


def refusal(seen: ServerObserved, spec: ModelServerSpec | None, invalid: str | None) -> tuple[str, str] | None:
    """(reason, message) of a refusal made from the spec and the settings alone."""
    settings = seen.settings
    if spec is None:
        return INVALID, str(invalid)
    if seen.namespace in settings.excluded_namespaces:
        return NAMESPACE_NOT_ALLOWED, (
            f"namespace {seen.namespace!r} is one the operator never writes in "
            f"({', '.join(settings.excluded_namespaces)}); create the ModelServer in a team namespace"
        )
    image = spec.image or settings.serving_image
    if not images.allowed(image, settings.allowed_serving_images):
        return IMAGE_NOT_ALLOWED, images.refusal(image, settings.allowed_serving_images, kind="serving")
    if seen.rejected is not None:
        return INVALID, seen.rejected
    return None


def served(files: Resolution) -> Body:
    """status.base and status.adapters: what the pods load, each adapter with its id."""
    return {
        "base": files.base.status() if files.base is not None else None,
        "adapters": [a.status() for a in files.adapters],
    }


def owned(child: Body, uid: str) -> bool:
    return any(r.get("uid") == uid for r in (child.get("metadata") or {}).get("ownerReferences") or [])


def _status_actions(seen: ServerObserved, view: server_status.Seen) -> ServerActions:
    current: Body = (seen.body or {}).get("status") or {}
    desired = server_status.compute(view)
    if desired == {k: v for k, v in current.items() if k in desired} and set(current) <= set(desired):
        return ServerActions(phase=str(desired.get("phase")))
    patch = {**{k: None for k in current if k not in desired}, **desired}
    events = tuple(server_status.transitions(current, desired))
    return ServerActions(status_patch=patch, events=events, phase=str(desired.get("phase")))


def decide(seen: ServerObserved) -> ServerActions:
    body = seen.body
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return ServerActions()  # the garbage collector deletes the children (owner references)
    meta = body["metadata"]
    owner = builder.ServerOwner(seen.name, seen.namespace, meta["uid"])
    spec, invalid = parse(body)
    view = server_status.Seen(
        generation=int(meta.get("generation") or 0),
        now=seen.now,
        current=body.get("status") or {},
        replicas=spec.replicas if spec is not None else 1,
        endpoint=owner.endpoint,
    )
    refused = refusal(seen, spec, invalid)
    files = resolve(spec, seen.namespace, seen.jobs, seen.claims) if spec is not None and refused is None else None
    if files is not None and files.problems:
        refused = server_status.REFUSED, "; ".join(str(p) for p in files.problems)
    if refused is not None or spec is None or files is None:
        return _status_actions(seen, _refused(view, refused))
    deployment = builder.deployment(owner, spec, files, seen.settings)
    deployment["metadata"]["annotations"] = {TEMPLATE_HASH: template_hash(deployment)}
    live = seen.deployment
    if live is None:
        return ServerActions(create=(*builder.children(owner, spec, files, seen.settings)[:-1], deployment))
    if not owned(live, owner.uid):
        # A deleted server's of the same name, still being collected: its deletion queues us again.
        return _status_actions(seen, view)
    if ((live.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH) != template_hash(deployment):
        return ServerActions(apply=deployment, phase=str(view.current.get("phase") or "Pending"))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    running = dataclasses.replace(view, served=served(files), deployment=live, pods=seen.pods, args=args)
    return _status_actions(seen, running)


def _refused(view: server_status.Seen, refused: tuple[str, str] | None) -> server_status.Seen:
    assert refused is not None
    return dataclasses.replace(view, refusal=refused)
