"""A container's environment, resolved the way the kubelet resolves it (pure, given lookups)."""

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

# (kind, namespace, name) -> data, or None when the object does not exist. Secrets come decoded.
Lookup = Callable[[str, str, str], Mapping[str, str] | None]


class ConfigPending(Exception):
    """A referenced ConfigMap/Secret/key is missing; the kubelet waits (CreateContainerConfigError)."""


_VAR = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` -> its value when defined, else left as is; `$$` -> `$` (Kubernetes' expansion rules)."""

    def repl(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR.sub(repl, text)


def _label_key(path: str) -> tuple[str, str] | None:
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    return (match.group(1), match.group(2)) if match else None


def field_value(pod: Mapping[str, Any], path: str) -> str:
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", "127.0.0.1"),
        "status.hostIPs": status.get("hostIP", "127.0.0.1"),
        "status.podIP": status.get("podIP", "127.0.0.1"),
        "status.podIPs": status.get("podIP", "127.0.0.1"),
    }
    if path in simple:
        return str(simple[path])
    keyed = _label_key(path)
    if keyed:
        return str((meta.get(keyed[0]) or {}).get(keyed[1], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ValueError(f"fieldRef {path!r} is not supported")


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity(text: str) -> float:
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", str(text).strip())
    if not match:
        raise ValueError(f"bad quantity {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    raise ValueError(f"bad quantity {text!r}")


def resource_value(container: Mapping[str, Any], node_allocatable: Mapping[str, str], ref: Mapping[str, Any]) -> str:
    """limits.X / requests.X with divisor, rounded up like the kubelet; limits default to the node's allocatable."""
    kind, _, resource = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(resource)
    if raw is None and kind == "limits":
        raw = node_allocatable.get(resource)
    if raw is None:
        raw = "0"
    divisor = quantity(ref.get("divisor") or "1")
    return str(max(math.ceil(quantity(raw) / divisor), 0 if quantity(raw) == 0 else 1))


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    lookup: Lookup,
    base: Mapping[str, str],
    node_allocatable: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """`base` (what the node adds), then envFrom, then env in order, each able to use earlier values."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = dict(base)

    def fetch(kind: str, name: str, optional: bool) -> Mapping[str, str] | None:
        data = lookup(kind, namespace, name)
        if data is None and not optional:
            raise ConfigPending(f'{kind} "{name}" not found')
        return data

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(key)
            if ref:
                data = fetch(kind, ref["name"], bool(ref.get("optional")))
                for name, value in (data or {}).items():
                    env[prefix + name] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(item.get("value", ""), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_value(container, node_allocatable or {}, source["resourceFieldRef"])
        else:
            for kind, key in (("configmap", "configMapKeyRef"), ("secret", "secretKeyRef")):
                ref = source.get(key)
                if not ref:
                    continue
                optional = bool(ref.get("optional"))
                data = fetch(kind, ref["name"], optional)
                if data is not None and ref["key"] in data:
                    env[name] = data[ref["key"]]
                elif not optional:
                    raise ConfigPending(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return env
