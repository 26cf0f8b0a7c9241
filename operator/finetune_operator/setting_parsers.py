"""The parsers of the operator's settings (settings.py): one setting's text to its value.

Every parser takes the name the text came under (the environment variable, or the flag) and the
text, and returns the value or raises SettingsError with one line that starts with that name:
a bad value stops the operator with that line, never a traceback.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from finetune_api import images
from finetune_api.base import LABEL_KEY_PATTERN, QUANTITY_PATTERN
from finetune_api.contract import HUB_ENDPOINT_ENV
from finetune_api.quantities import to_bytes
from finetune_plan.gpu_products import known_names, lookup

# (name the text came under, the text) -> the value.
Parser = Callable[[str, str], Any]

# Namespaces the operator never writes in, whatever the chart adds (it adds its own namespace).
SYSTEM_NAMESPACES: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
_LABEL_KEY = re.compile(LABEL_KEY_PATTERN)
_QUANTITY = re.compile(QUANTITY_PATTERN)


class SettingsError(ValueError):
    """One line naming the setting and what is wrong with it."""


@dataclass(frozen=True)
class TrainerNetwork:
    """The egress every trainer gets, from the chart (`trainer.networkPolicy`), rule for rule.

    The chart renders these rules once, for the operator (FINETUNE_TRAINER_NETWORK) and for the
    fence, which admits a job's NetworkPolicy only with these rules; builders/network.py copies
    them unchanged into each job's policy.
    """

    # NetworkPolicyEgressRule objects every trainer gets: the API server, DNS, `extraEgress`.
    egress: tuple[dict[str, Any], ...]
    # The HTTPS rule of jobs that download from the Hub (`hubEgress`); None when it is off.
    hub_egress: dict[str, Any] | None
    # NetworkPolicyPort objects a multi-node job's pods open to each other, and only to each other:
    # the rendezvous port and the collectives' range.
    peer_ports: tuple[dict[str, Any], ...]
    # The rules to the S3-compatible stores (`objectStorage`), for the pods that fetch and upload.
    object_egress: tuple[dict[str, Any], ...] = ()


def text(name: str, raw: str) -> str:
    return raw


def choice(choices: tuple[str, ...], *, upper: bool = False) -> Parser:
    """One of `choices`; `upper`: written in any case, kept upper-case."""

    def parse(name: str, raw: str) -> str:
        value = raw.upper() if upper else raw
        if value not in choices:
            raise SettingsError(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


def boolean(name: str, raw: str) -> bool:
    return bool(choice(("true", "false"))(name, raw.lower()) == "true")


def port(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected a port number, got {raw!r}") from None
    if not 0 <= value <= 65535:
        raise SettingsError(f"{name}: port {value} is outside 0-65535")
    return value


def label_key(name: str, raw: str) -> str:
    if not _LABEL_KEY.match(raw):
        raise SettingsError(f"{name}: {raw!r} is not a label key")
    return raw


def quantity(name: str, raw: str) -> str | None:
    """A Kubernetes quantity; empty: none."""
    if not raw:
        return None
    if not _QUANTITY.match(raw):
        raise SettingsError(f"{name}: {raw!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    return raw


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not JSON ({exc.msg} at column {exc.colno})") from None


def tolerations(name: str, raw: str) -> tuple[dict[str, Any], ...]:
    value = _json(name, raw)
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise SettingsError(f"{name}: expected a JSON list of toleration objects")
    return tuple(value)


def allowed_images(name: str, raw: str) -> tuple[str, ...]:
    value = _json(name, raw)
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        raise SettingsError(f"{name}: expected a non-empty JSON list of image patterns")
    for pattern in value:
        if problem := images.pattern_problem(pattern):
            raise SettingsError(f"{name}: pattern {pattern!r}: {problem}")
    return tuple(value)


def _json_string_map(name: str, raw: str, expected: str) -> dict[str, str]:
    """A JSON object of strings to strings; `expected` finishes the error when it is not one."""
    value = _json(name, raw)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SettingsError(f"{name}: expected a JSON object of {expected}")
    return value


def hub_env(name: str, raw: str) -> dict[str, str]:
    value = _json_string_map(name, raw, "variable names to strings")
    if unknown := sorted(set(value) - set(HUB_ENDPOINT_ENV)):
        raise SettingsError(f"{name}: {', '.join(unknown)} not among {', '.join(HUB_ENDPOINT_ENV)}")
    return value


def host_memory_per_gpu(name: str, raw: str) -> dict[str, str]:
    value = _json_string_map(name, raw, "GPU products to quantities (e.g. 48Gi)")
    for product, amount in value.items():
        if lookup(product) is None:
            raise SettingsError(
                f"{name}: {product!r} is not a GPU product the planner knows ({', '.join(known_names())})"
            )
        if not _QUANTITY.match(amount) or to_bytes(amount) <= 0:
            raise SettingsError(f"{name}: {product}: {amount!r} is not a positive quantity (e.g. 48Gi)")
    return value


def fraction(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected a number, got {raw!r}") from None
    if not 0 < value <= 1:
        raise SettingsError(f"{name}: {value} is not a fraction in (0, 1]")
    return value


def user_id(name: str, raw: str) -> int:
    if not raw.isdigit() or int(raw) == 0:
        raise SettingsError(f"{name}: expected a non-zero user id, got {raw!r}")
    return int(raw)


def limit(name: str, raw: str) -> int | None:
    """A positive whole number; 0 means no limit."""
    if not raw.isdigit():
        raise SettingsError(f"{name}: expected a whole number (0: no limit), got {raw!r}")
    return int(raw) or None


def namespaces(name: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list; empty: none."""
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def excluded_namespaces(name: str, raw: str) -> tuple[str, ...]:
    """The system namespaces, then the list's: they stay excluded whatever the list says."""
    return tuple(dict.fromkeys((*SYSTEM_NAMESPACES, *namespaces(name, raw))))


def seconds(name: str, raw: str) -> float:
    """Seconds, positive."""
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected seconds, got {raw!r}") from None
    if value <= 0:
        raise SettingsError(f"{name}: must be positive")
    return value


def seconds_within(low: float, high: float) -> Parser:
    """Seconds from `low` to `high`, both included."""

    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name}: expected seconds, got {raw!r}") from None
        if not low <= value <= high:
            raise SettingsError(f"{name}: expected {low:g} to {high:g} seconds")
        return value

    return parse


def _rules(name: str, field_name: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise SettingsError(f"{name}: {field_name} must be a JSON list of objects")
    return tuple(value)


def trainer_network(name: str, raw: str) -> TrainerNetwork | None:
    """The chart's rendered `trainer.networkPolicy`; empty: no per-job NetworkPolicy."""
    if not raw.strip():
        return None
    value = _json(name, raw)
    if not isinstance(value, dict):
        raise SettingsError(f"{name}: expected a JSON object with egress, hubEgress and peerPorts")
    hub = value.get("hubEgress")
    if hub is not None and not isinstance(hub, dict):
        raise SettingsError(f"{name}: hubEgress must be a JSON object or null")
    egress = _rules(name, "egress", value.get("egress"))
    if not egress:
        raise SettingsError(f"{name}: egress is empty (the trainers need at least the API server)")
    return TrainerNetwork(
        egress=egress,
        hub_egress=hub,
        peer_ports=_rules(name, "peerPorts", value.get("peerPorts")),
        object_egress=_rules(name, "objectEgress", value.get("objectEgress")),
    )
