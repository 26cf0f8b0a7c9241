"""The in-cluster Services a job's trainer calls (GRPO's `http` rewards), read off their URLs.

A URL's host is a Service's DNS name as a pod resolves it: `svc`, `svc.ns`, `svc.ns.svc` or
`svc.ns.svc.cluster.local`; without a namespace it is the job's own. One pattern holds the URL
on both sides (the CRD's CEL rule and the model's validator): http or https, a host of one of
those forms in lower case, an optional port from 1 to 65535, then a path and a query. A Service
outside the job's namespace is refused (`outside`): the job's NetworkPolicy lets its pods reach
the Service's pods by their labels, which selects pods of its own namespace only, and a team's
job has no business calling another team's services. Admission's rules cannot see the job's
namespace, so that refusal is the operator's (and `ftjob validate`'s, where the manifest names
its namespace).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

# A Service's name is a DNS-1035 label (a letter first); a namespace's a DNS-1123 label.
_SERVICE: Final = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_NAMESPACE: Final = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_PORT: Final = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# RE2 (CEL's `matches`) and Python's re read it alike.
URL_PATTERN: Final = (
    rf"^https?://{_SERVICE}(\.{_NAMESPACE}(\.svc(\.cluster\.local)?)?)?(:{_PORT})?(/[^\s?#]*)?(\?[^\s#]*)?$"
)
URL_RULE: Final = (
    "an http:// or https:// URL of a Service: its host svc, svc.ns, svc.ns.svc or svc.ns.svc.cluster.local "
    "(lower case), an optional port, then a path"
)
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
OUTSIDE: Final = "{field}: {what} must be in the job's namespace ({namespace}), not {named}"


@dataclass(frozen=True)
class ServiceUrl:
    """A Service a job's trainer calls: where the spec says it, which, and on which port."""

    field: str  # the spec field holding the URL, e.g. spec.training.grpo.rewards[3].http.url
    what: str  # what the Service is to the job, for messages: "a reward service"
    service: str
    namespace: str | None  # the namespace the URL names; None: the job's own
    port: int  # the Service's port the URL names (80 for http, 443 for https when it names none)

    def namespace_in(self, job_namespace: str) -> str:
        """The Service's namespace for a job of `job_namespace`."""
        return self.namespace or job_namespace


def check_url(url: str) -> str:
    """`url`, or ValueError with the rule when it is no URL of a Service."""
    if not re.fullmatch(URL_PATTERN, url):
        raise ValueError(f"{url!r}: expected {URL_RULE}")
    return url


def read_url(field: str, what: str, url: str) -> ServiceUrl:
    """The Service a checked URL (`check_url`) names."""
    parts = urllib.parse.urlsplit(check_url(url))
    labels = (parts.hostname or "").split(".")
    namespace = labels[1] if len(labels) > 1 else None
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    return ServiceUrl(field=field, what=what, service=labels[0], namespace=namespace, port=port)


def outside(calls: Iterable[ServiceUrl], namespace: str) -> str | None:
    """The refusal of the first Service outside `namespace`, or None when all are in it."""
    for call in calls:
        if call.namespace_in(namespace) != namespace:
            return OUTSIDE.format(field=call.field, what=call.what, namespace=namespace, named=call.namespace)
    return None
