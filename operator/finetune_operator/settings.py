"""Operator settings: what the platform team decides once (the chart sets them as env vars).

Every setting has an environment variable (the Helm chart's values feed them) and most have a
command-line flag that wins over it. A bad value stops the operator with one line naming the
variable, never a traceback.
"""

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from finetune_api import images
from finetune_api.base import LABEL_KEY_PATTERN, QUANTITY_PATTERN
from finetune_api.constants import DEFAULT_IMAGE
from finetune_api.contract import HUB_ENDPOINT_ENV
from finetune_api.quantities import to_bytes
from finetune_plan.gpu_products import known_names, lookup

from .runtime.leader import LeaseTimings

DEFAULT_GPU_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)

# Environment variables, one per setting; the chart writes exactly these names.
ENV_TRAINER_IMAGE = "FINETUNE_TRAINER_IMAGE"
ENV_IMAGE_PULL_POLICY = "FINETUNE_IMAGE_PULL_POLICY"
ENV_GPU_PRODUCT_LABEL = "FINETUNE_GPU_PRODUCT_LABEL"
ENV_GPU_RESOURCE = "FINETUNE_GPU_RESOURCE"
ENV_GPU_TOLERATIONS = "FINETUNE_GPU_TOLERATIONS"
ENV_HOST_MEMORY_PER_GPU = "FINETUNE_HOST_MEMORY_PER_GPU"
ENV_DEFAULT_CPU = "FINETUNE_DEFAULT_CPU"
ENV_DEFAULT_MEMORY = "FINETUNE_DEFAULT_MEMORY"
ENV_SHM_SIZE = "FINETUNE_SHM_SIZE"
ENV_TRAINER_UID = "FINETUNE_TRAINER_UID"
ENV_NAMESPACES = "FINETUNE_NAMESPACES"
ENV_METRICS_PORT = "FINETUNE_METRICS_PORT"
ENV_HEALTH_PORT = "FINETUNE_HEALTH_PORT"
# The address the health and metrics servers listen on: all by default. Replicas that share one
# network namespace (the local cluster's node agent runs pods as host processes) each listen on
# their pod's own address instead (`status.podIP`), so their ports do not collide.
ENV_LISTEN_ADDRESS = "FINETUNE_LISTEN_ADDRESS"
ENV_LOG_LEVEL = "FINETUNE_LOG_LEVEL"
ENV_LOG_FORMAT = "FINETUNE_LOG_FORMAT"
ENV_RESYNC_SECONDS = "FINETUNE_RESYNC_SECONDS"
ENV_STATUS_COALESCE = "FINETUNE_STATUS_COALESCE_SECONDS"
ENV_ALLOWED_IMAGES = "FINETUNE_ALLOWED_IMAGES"
ENV_TMP_SIZE = "FINETUNE_TMP_SIZE"
ENV_EPHEMERAL_STORAGE_REQUEST = "FINETUNE_EPHEMERAL_STORAGE_REQUEST"
ENV_SHM_MEMORY_FRACTION = "FINETUNE_SHM_MEMORY_FRACTION"
ENV_HUB_ENV = "FINETUNE_HUB_ENV"
ENV_EXCLUDED_NAMESPACES = "FINETUNE_EXCLUDED_NAMESPACES"
ENV_MAX_GPUS_PER_JOB = "FINETUNE_MAX_GPUS_PER_JOB"
ENV_MAX_NODES_PER_JOB = "FINETUNE_MAX_NODES_PER_JOB"
ENV_DEFAULT_ACTIVE_DEADLINE = "FINETUNE_DEFAULT_ACTIVE_DEADLINE_SECONDS"
ENV_PENDING_TIMEOUT = "FINETUNE_PENDING_TIMEOUT_SECONDS"
# The trainers' NetworkPolicy rules (trainer.networkPolicy), as the chart renders them; empty or
# unset: the operator makes no NetworkPolicy (clusters without a NetworkPolicy controller).
ENV_TRAINER_NETWORK = "FINETUNE_TRAINER_NETWORK"
ENV_PREFLIGHT = "FINETUNE_PREFLIGHT"
ENV_PREFLIGHT_CPU = "FINETUNE_PREFLIGHT_CPU"
ENV_PREFLIGHT_MEMORY = "FINETUNE_PREFLIGHT_MEMORY"
# Leader election (runtime/leader.py): off for a lone process; the chart turns it on for its replicas.
ENV_LEADER_ELECTION = "FINETUNE_LEADER_ELECTION"
ENV_LEASE_NAME = "FINETUNE_LEASE_NAME"
# The Lease's namespace: the operator's own (the chart's POD_NAMESPACE when unset).
ENV_LEASE_NAMESPACE = "FINETUNE_LEASE_NAMESPACE"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_LEASE_DURATION = "FINETUNE_LEASE_DURATION_SECONDS"
ENV_LEASE_RENEW_DEADLINE = "FINETUNE_LEASE_RENEW_DEADLINE_SECONDS"
ENV_LEASE_RETRY_PERIOD = "FINETUNE_LEASE_RETRY_PERIOD_SECONDS"
# Namespaces the operator never writes in, whatever the chart adds (it adds its own namespace).
SYSTEM_NAMESPACES: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
# Test hook only (acceptance: operator killed between two creates). Names the child kind after
# whose creation the process exits hard, e.g. "Job". Never set it in production.
ENV_CRASH_AFTER = "FINETUNE_TEST_CRASH_AFTER"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("json", "text")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
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


@dataclass(frozen=True)
class Settings:
    trainer_image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    gpu_product_label: str = "nvidia.com/gpu.product"
    gpu_resource: str = "nvidia.com/gpu"
    gpu_tolerations: tuple[dict[str, Any], ...] = DEFAULT_GPU_TOLERATIONS
    # Host memory a node offers a trainer pod per GPU, by product (`trainer.gpu.hostMemoryPerGpu`);
    # a product not named here gets the planner's default (`GpuProduct.host_memory_gib`).
    host_memory_per_gpu: Mapping[str, str] = field(default_factory=dict)
    default_cpu: str | None = None
    default_memory: str | None = None
    shm_size: str = "8Gi"
    # /dev/shm is memory: it may take at most this share of the pod's memory limit, so that a
    # full /dev/shm is an error in the trainer, not an OOM kill of the whole pod.
    shm_memory_fraction: float = 0.5
    # The trainer's /tmp (its HOME: library caches) is capped, and the pod asks for disk.
    tmp_size: str = "8Gi"
    ephemeral_storage_request: str = "1Gi"
    # Patterns of the images jobs may run (images.py); the default image must be one of them.
    allowed_images: tuple[str, ...] = images.DEFAULT_ALLOWED_IMAGES
    trainer_uid: int = 1000
    # HF_ENDPOINT and proxy variables of Hub jobs; the fence admits them at these values only.
    hub_env: Mapping[str, str] = field(default_factory=dict)
    # A FineTuneJob in one of these ends Failed (NamespaceNotAllowed); the fence refuses its children.
    excluded_namespaces: tuple[str, ...] = SYSTEM_NAMESPACES
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    # Guardrails of the platform team (None: no limit). A job above a limit ends Failed before
    # any child exists; one whose pods stay unschedulable this long ends Failed (Unschedulable).
    max_gpus_per_job: int | None = None
    max_nodes_per_job: int | None = None
    default_active_deadline_seconds: int | None = None
    pending_timeout_seconds: int | None = None
    # None: no per-job NetworkPolicy (the chart's trainer.networkPolicy.enabled false).
    trainer_network: TrainerNetwork | None = None
    # The pre-flight Job (builders/preflight.py): its CPU pod checks a job's claims before the GPU
    # Job exists. Its memory holds the tokenizer and the dataset's records while they are checked.
    preflight: bool = True
    preflight_cpu: str = "1"
    preflight_memory: str = "2Gi"
    preflight_deadline_seconds: int = 600
    metrics_port: int = 8000
    health_port: int = 8080
    listen_address: str = "0.0.0.0"
    log_level: str = "INFO"
    log_format: str = "json"
    resync_seconds: float = 30.0
    # A job's status changes short of Succeeded or Failed wait until what the user would read has
    # stood unchanged this many seconds (at most four times that), then the newest state is
    # written once (runtime/coalesce.py); a terminal phase is written at once. 0: every change at once.
    status_coalesce_seconds: float = 5.0
    # Several replicas, one leader: only the holder of the Lease reconciles and writes.
    leader_election: bool = False
    lease_name: str = "finetune-operator"
    lease_namespace: str | None = None
    lease_timings: LeaseTimings = field(default_factory=LeaseTimings)
    crash_after: str | None = None

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    def host_memory_for(self, product: str) -> int | None:
        """Bytes a node of `product` offers a pod per GPU, where the chart names the product."""
        wanted = lookup(product)
        for name, quantity in self.host_memory_per_gpu.items():
            if wanted is not None and lookup(name) == wanted:
                return to_bytes(quantity)
        return None


def _port(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected a port number, got {raw!r}") from None
    if not 0 <= value <= 65535:
        raise SettingsError(f"{name}: port {value} is outside 0-65535")
    return value


def _choice(name: str, raw: str, choices: tuple[str, ...], *, upper: bool = False) -> str:
    value = raw.upper() if upper else raw
    if value not in choices:
        raise SettingsError(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
    return value


def _quantity(name: str, raw: str) -> str | None:
    if not raw:
        return None
    if not _QUANTITY.match(raw):
        raise SettingsError(f"{name}: {raw!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
    return raw


def _tolerations(name: str, raw: str) -> tuple[dict[str, Any], ...]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise SettingsError(f"{name}: expected a JSON list of toleration objects")
    return tuple(value)


def _allowed_images(name: str, raw: str) -> tuple[str, ...]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        raise SettingsError(f"{name}: expected a non-empty JSON list of image patterns")
    for pattern in value:
        if problem := images.pattern_problem(pattern):
            raise SettingsError(f"{name}: pattern {pattern!r}: {problem}")
    return tuple(value)


def _json_string_map(name: str, raw: str, expected: str) -> dict[str, str]:
    """A JSON object of strings to strings; `expected` finishes the error when it is not one."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SettingsError(f"{name}: expected a JSON object of {expected}")
    return value


def _hub_env(name: str, raw: str) -> dict[str, str]:
    value = _json_string_map(name, raw, "variable names to strings")
    if unknown := sorted(set(value) - set(HUB_ENDPOINT_ENV)):
        raise SettingsError(f"{name}: {', '.join(unknown)} not among {', '.join(HUB_ENDPOINT_ENV)}")
    return value


def _host_memory_per_gpu(name: str, raw: str) -> dict[str, str]:
    value = _json_string_map(name, raw, "GPU products to quantities (e.g. 48Gi)")
    for product, quantity in value.items():
        if lookup(product) is None:
            raise SettingsError(
                f"{name}: {product!r} is not a GPU product the planner knows ({', '.join(known_names())})"
            )
        if not _QUANTITY.match(quantity) or to_bytes(quantity) <= 0:
            raise SettingsError(f"{name}: {product}: {quantity!r} is not a positive quantity (e.g. 48Gi)")
    return value


def _fraction(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected a number, got {raw!r}") from None
    if not 0 < value <= 1:
        raise SettingsError(f"{name}: {value} is not a fraction in (0, 1]")
    return value


def _limit(name: str, raw: str) -> int | None:
    """A positive whole number; empty or 0 means no limit."""
    if not raw.isdigit():
        raise SettingsError(f"{name}: expected a whole number (0: no limit), got {raw!r}")
    return int(raw) or None


def _guardrails(env: Mapping[str, str]) -> dict[str, Any]:
    names = {
        "max_gpus_per_job": ENV_MAX_GPUS_PER_JOB,
        "max_nodes_per_job": ENV_MAX_NODES_PER_JOB,
        "default_active_deadline_seconds": ENV_DEFAULT_ACTIVE_DEADLINE,
        "pending_timeout_seconds": ENV_PENDING_TIMEOUT,
    }
    return {key: _limit(name, env[name]) for key, name in names.items() if env.get(name)}


def _rules(name: str, field_name: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        raise SettingsError(f"{name}: {field_name} must be a JSON list of objects")
    return tuple(value)


def _trainer_network(name: str, raw: str) -> TrainerNetwork | None:
    if not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{name}: expected a JSON object with egress, hubEgress and peerPorts")
    hub = value.get("hubEgress")
    if hub is not None and not isinstance(hub, dict):
        raise SettingsError(f"{name}: hubEgress must be a JSON object or null")
    egress = _rules(name, "egress", value.get("egress"))
    if not egress:
        raise SettingsError(f"{name}: egress is empty (the trainers need at least the API server)")
    return TrainerNetwork(egress=egress, hub_egress=hub, peer_ports=_rules(name, "peerPorts", value.get("peerPorts")))


def _seconds(name: str, raw: str, *, within: tuple[float, float] | None = None) -> float:
    """Seconds, positive, or within `within` (both ends included) where given."""
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected seconds, got {raw!r}") from None
    if within is None and value <= 0:
        raise SettingsError(f"{name}: must be positive")
    if within is not None and not within[0] <= value <= within[1]:
        raise SettingsError(f"{name}: expected {within[0]:g} to {within[1]:g} seconds")
    return value


def _leader_election(env: Mapping[str, str]) -> dict[str, Any]:
    updates: dict[str, Any] = {}
    if v := env.get(ENV_LEADER_ELECTION):
        updates["leader_election"] = _choice(ENV_LEADER_ELECTION, v.lower(), ("true", "false")) == "true"
    if v := env.get(ENV_LEASE_NAME):
        updates["lease_name"] = v
    if v := env.get(ENV_LEASE_NAMESPACE) or env.get(ENV_POD_NAMESPACE):
        updates["lease_namespace"] = v
    base = LeaseTimings()
    timings = {
        "lease_duration_s": env.get(ENV_LEASE_DURATION),
        "renew_deadline_s": env.get(ENV_LEASE_RENEW_DEADLINE),
        "retry_period_s": env.get(ENV_LEASE_RETRY_PERIOD),
    }
    names = dict(zip(timings, (ENV_LEASE_DURATION, ENV_LEASE_RENEW_DEADLINE, ENV_LEASE_RETRY_PERIOD), strict=True))
    given = {key: _seconds(names[key], raw) for key, raw in timings.items() if raw}
    if given:
        updates["lease_timings"] = replace(base, **given)
    return updates


def _namespaces(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def _timing(env: Mapping[str, str]) -> dict[str, Any]:
    """The resync period (positive seconds) and the status coalescing window (0 to 300 s)."""
    updates: dict[str, Any] = {}
    if v := env.get(ENV_RESYNC_SECONDS):
        updates["resync_seconds"] = _seconds(ENV_RESYNC_SECONDS, v)
    if v := env.get(ENV_STATUS_COALESCE):
        updates["status_coalesce_seconds"] = _seconds(ENV_STATUS_COALESCE, v, within=(0, 300))
    return updates


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from environment variables; defaults for the ones not set."""
    env = os.environ if env is None else env
    s = Settings()
    updates: dict[str, Any] = {}
    if v := env.get(ENV_TRAINER_IMAGE):
        updates["trainer_image"] = v
    if v := env.get(ENV_IMAGE_PULL_POLICY):
        updates["image_pull_policy"] = _choice(ENV_IMAGE_PULL_POLICY, v, PULL_POLICIES)
    if v := env.get(ENV_GPU_PRODUCT_LABEL):
        if not _LABEL_KEY.match(v):
            raise SettingsError(f"{ENV_GPU_PRODUCT_LABEL}: {v!r} is not a label key")
        updates["gpu_product_label"] = v
    if v := env.get(ENV_GPU_RESOURCE):
        updates["gpu_resource"] = v
    if ENV_GPU_TOLERATIONS in env:
        updates["gpu_tolerations"] = _tolerations(ENV_GPU_TOLERATIONS, env[ENV_GPU_TOLERATIONS])
    if v := env.get(ENV_HOST_MEMORY_PER_GPU):
        updates["host_memory_per_gpu"] = _host_memory_per_gpu(ENV_HOST_MEMORY_PER_GPU, v)
    if ENV_DEFAULT_CPU in env:
        updates["default_cpu"] = _quantity(ENV_DEFAULT_CPU, env[ENV_DEFAULT_CPU])
    if ENV_DEFAULT_MEMORY in env:
        updates["default_memory"] = _quantity(ENV_DEFAULT_MEMORY, env[ENV_DEFAULT_MEMORY])
    if v := env.get(ENV_SHM_SIZE):
        updates["shm_size"] = _quantity(ENV_SHM_SIZE, v) or s.shm_size
    if v := env.get(ENV_SHM_MEMORY_FRACTION):
        updates["shm_memory_fraction"] = _fraction(ENV_SHM_MEMORY_FRACTION, v)
    if v := env.get(ENV_TMP_SIZE):
        updates["tmp_size"] = _quantity(ENV_TMP_SIZE, v) or s.tmp_size
    if v := env.get(ENV_EPHEMERAL_STORAGE_REQUEST):
        updates["ephemeral_storage_request"] = (
            _quantity(ENV_EPHEMERAL_STORAGE_REQUEST, v) or s.ephemeral_storage_request
        )
    if v := env.get(ENV_ALLOWED_IMAGES):
        updates["allowed_images"] = _allowed_images(ENV_ALLOWED_IMAGES, v)
    if v := env.get(ENV_TRAINER_UID):
        if not v.isdigit() or int(v) == 0:
            raise SettingsError(f"{ENV_TRAINER_UID}: expected a non-zero user id, got {v!r}")
        updates["trainer_uid"] = int(v)
    if ENV_NAMESPACES in env:
        updates["namespaces"] = _namespaces(env[ENV_NAMESPACES])
    if v := env.get(ENV_HUB_ENV):
        updates["hub_env"] = _hub_env(ENV_HUB_ENV, v)
    if ENV_EXCLUDED_NAMESPACES in env:
        updates["excluded_namespaces"] = tuple(
            dict.fromkeys((*SYSTEM_NAMESPACES, *_namespaces(env[ENV_EXCLUDED_NAMESPACES])))
        )
    updates.update(_guardrails(env))
    if ENV_TRAINER_NETWORK in env:
        updates["trainer_network"] = _trainer_network(ENV_TRAINER_NETWORK, env[ENV_TRAINER_NETWORK])
    if v := env.get(ENV_PREFLIGHT):
        updates["preflight"] = _choice(ENV_PREFLIGHT, v.lower(), ("true", "false")) == "true"
    if v := env.get(ENV_PREFLIGHT_CPU):
        updates["preflight_cpu"] = _quantity(ENV_PREFLIGHT_CPU, v) or s.preflight_cpu
    if v := env.get(ENV_PREFLIGHT_MEMORY):
        updates["preflight_memory"] = _quantity(ENV_PREFLIGHT_MEMORY, v) or s.preflight_memory
    if v := env.get(ENV_METRICS_PORT):
        updates["metrics_port"] = _port(ENV_METRICS_PORT, v)
    if v := env.get(ENV_HEALTH_PORT):
        updates["health_port"] = _port(ENV_HEALTH_PORT, v)
    if v := env.get(ENV_LISTEN_ADDRESS):
        updates["listen_address"] = v
    if v := env.get(ENV_LOG_LEVEL):
        updates["log_level"] = _choice(ENV_LOG_LEVEL, v, LOG_LEVELS, upper=True)
    if v := env.get(ENV_LOG_FORMAT):
        updates["log_format"] = _choice(ENV_LOG_FORMAT, v, LOG_FORMATS)
    updates.update(_timing(env))
    updates.update(_leader_election(env))
    if v := env.get(ENV_CRASH_AFTER):
        updates["crash_after"] = v
    return replace(s, **updates)


def check(settings: Settings) -> Settings:
    """Rules across settings, checked once the flags are in: every job would fail otherwise."""
    if not images.allowed(settings.trainer_image, settings.allowed_images):
        raise SettingsError(
            f"{ENV_TRAINER_IMAGE}: the default trainer image {settings.trainer_image!r} is not in "
            f"{ENV_ALLOWED_IMAGES} ({', '.join(settings.allowed_images)})"
        )
    if settings.leader_election:
        if not settings.lease_namespace:
            raise SettingsError(
                f"{ENV_LEASE_NAMESPACE}: leader election needs the Lease's namespace (or {ENV_POD_NAMESPACE})"
            )
        if problem := settings.lease_timings.problem():
            raise SettingsError(
                f"{ENV_LEASE_DURATION}, {ENV_LEASE_RENEW_DEADLINE}, {ENV_LEASE_RETRY_PERIOD}: {problem}"
            )
    return settings
