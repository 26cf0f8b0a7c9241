"""Operator settings: what the platform team decides once, each declared once, in `Settings`.

Each field of `Settings` that is a setting is declared with `setting(...)`: its environment
variable, its parser (setting_parsers.py), its default, a line saying what it is, the chart
values that feed the variable and its command-line flag, if it has one. `SETTINGS` is that table
read back from the class, by field. From it follow the environment (`from_env`), the flags
(__main__.py: a flag wins over its variable) and the chart's wiring: the chart's Deployment
passes exactly the table's variables from the values it names, and values.yaml and
values.schema.json document each (tests/chart/test_settings_table.py holds the chart to the
table). A bad value stops the operator with one line naming the variable or flag, never a
traceback.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, TypeVar, cast

from finetune_api import images
from finetune_api.constants import DEFAULT_IMAGE, DEFAULT_SERVING_IMAGE
from finetune_api.quantities import to_bytes
from finetune_plan.gpu_products import lookup

from . import setting_parsers as p
from .runtime.leader import LeaseTimings
from .setting_parsers import SYSTEM_NAMESPACES, Parser, SettingsError, TrainerNetwork

T = TypeVar("T")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("json", "text")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_GPU_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
_ROW = "setting"  # the key of a setting's row in its field's metadata


@dataclass(frozen=True)
class Setting:
    """One row of the table: where a setting comes from and how its text is read."""

    env: str
    parse: Parser
    doc: str
    # The chart values (paths in values.yaml) the chart's Deployment feeds `env` from; () when
    # the chart does not set it from values.
    chart: tuple[str, ...] = ()
    # Its command-line option strings, e.g. ("-n", "--namespace"); () when it has none.
    flag: tuple[str, ...] = ()
    # An empty value is a value (parsed), not the default: the chart writes "" for "none".
    blank: bool = False
    # A variable read when `env` is unset or empty (the chart sets it from the downward API).
    fallback: str | None = None
    # The flag may be given more than once; its values are joined by commas.
    repeated: bool = False
    # The Settings field: filled in from the class.
    name: str = ""


def setting(
    default: T,
    env: str,
    parse: Parser,
    doc: str,
    *,
    chart: str | tuple[str, ...] = (),
    flag: str | tuple[str, ...] = (),
    blank: bool = False,
    fallback: str | None = None,
    repeated: bool = False,
) -> T:
    """A field of Settings that is a setting (typed as its value, as dataclasses.field is). A
    mutable default (a dict) is copied for each Settings."""
    row = Setting(
        env=env,
        parse=parse,
        doc=doc,
        chart=(chart,) if isinstance(chart, str) else chart,
        flag=(flag,) if isinstance(flag, str) else flag,
        blank=blank,
        fallback=fallback,
        repeated=repeated,
    )
    metadata = {_ROW: row}
    if isinstance(default, dict):
        made: Any = field(default_factory=lambda: dict(default), metadata=metadata)
    else:
        made = field(default=default, metadata=metadata)
    return cast(T, made)


@dataclass(frozen=True)
class Settings:
    """The table of settings (`setting(default, variable, parser, doc, ...)` each), and the few
    fields that are no setting of their own."""

    # One setting a row or two, as a table reads: the formatter would spread each over eight.
    # fmt: off

    trainer_image: str = setting(
        DEFAULT_IMAGE, "FINETUNE_TRAINER_IMAGE", p.text, "trainer image for jobs that name none",
        chart="trainer.image", flag="--trainer-image",
    )
    image_pull_policy: str = setting(
        "IfNotPresent", "FINETUNE_IMAGE_PULL_POLICY", p.choice(PULL_POLICIES), "pull policy of trainer containers",
        chart="trainer.imagePullPolicy",
    )
    gpu_product_label: str = setting(
        "nvidia.com/gpu.product", "FINETUNE_GPU_PRODUCT_LABEL", p.label_key, "node label that holds the GPU product",
        chart="trainer.gpu.productLabelKey",
    )
    gpu_resource: str = setting(
        "nvidia.com/gpu", "FINETUNE_GPU_RESOURCE", p.text, "extended resource name of a GPU",
        chart="trainer.gpu.resourceName",
    )
    gpu_tolerations: tuple[dict[str, Any], ...] = setting(
        DEFAULT_GPU_TOLERATIONS, "FINETUNE_GPU_TOLERATIONS", p.tolerations, "tolerations of every GPU trainer pod",
        chart="trainer.gpu.tolerations", blank=True,
    )
    # A product not named here gets the planner's default (`GpuProduct.host_memory_gib`).
    host_memory_per_gpu: Mapping[str, str] = setting(
        {}, "FINETUNE_HOST_MEMORY_PER_GPU", p.host_memory_per_gpu, "host memory a node offers per GPU, by product",
        chart="trainer.gpu.hostMemoryPerGpu",
    )
    default_cpu: str | None = setting(
        None, "FINETUNE_DEFAULT_CPU", p.quantity, "CPU of a trainer pod whose spec sets none",
        chart="trainer.defaultResources.cpu", blank=True,
    )
    default_memory: str | None = setting(
        None, "FINETUNE_DEFAULT_MEMORY", p.quantity, "memory of a trainer pod whose spec sets none",
        chart="trainer.defaultResources.memory", blank=True,
    )
    shm_size: str = setting(
        "8Gi", "FINETUNE_SHM_SIZE", p.quantity, "size of a trainer pod's memory-backed /dev/shm",
        chart="trainer.shmSize",
    )
    # /dev/shm is memory: it may take at most this share of the pod's memory limit, so that a
    # full /dev/shm is an error in the trainer, not an OOM kill of the whole pod.
    shm_memory_fraction: float = setting(
        0.5, "FINETUNE_SHM_MEMORY_FRACTION", p.fraction, "largest share of a pod's memory limit /dev/shm takes",
        chart="trainer.shmMemoryFraction",
    )
    # The trainer's /tmp (its HOME: library caches) is capped, and the pod asks for disk.
    tmp_size: str = setting(
        "8Gi", "FINETUNE_TMP_SIZE", p.quantity, "size limit of a trainer pod's /tmp", chart="trainer.tmpSize"
    )
    ephemeral_storage_request: str = setting(
        "1Gi", "FINETUNE_EPHEMERAL_STORAGE_REQUEST", p.quantity, "ephemeral storage a trainer pod requests",
        chart="trainer.ephemeralStorageRequest",
    )
    # The default image must be one of these (check).
    allowed_images: tuple[str, ...] = setting(
        images.DEFAULT_ALLOWED_IMAGES, "FINETUNE_ALLOWED_IMAGES", p.allowed_images, "images jobs may run (patterns)",
        chart="trainer.allowedImages",
    )
    # ModelServers (servers/): their llama-server image and the images they may run.
    serving_image: str = setting(
        DEFAULT_SERVING_IMAGE, "FINETUNE_SERVING_IMAGE", p.text, "serving image for ModelServers that name none",
        chart="serving.image",
    )
    allowed_serving_images: tuple[str, ...] = setting(
        images.DEFAULT_ALLOWED_SERVING_IMAGES, "FINETUNE_ALLOWED_SERVING_IMAGES", p.allowed_images,
        "images ModelServers may run (patterns)", chart="serving.allowedImages",
    )
    trainer_uid: int = setting(
        1000, "FINETUNE_TRAINER_UID", p.user_id, "user and group id trainer pods run as", chart="trainer.uid"
    )
    # The fence admits these variables at these values only.
    hub_env: Mapping[str, str] = setting(
        {}, "FINETUNE_HUB_ENV", p.hub_env, "HF_ENDPOINT and proxy variables of Hub jobs", chart="trainer.hubEnv"
    )
    # A FineTuneJob in one of these ends Failed (NamespaceNotAllowed); the fence refuses its children.
    excluded_namespaces: tuple[str, ...] = setting(
        SYSTEM_NAMESPACES, "FINETUNE_EXCLUDED_NAMESPACES", p.excluded_namespaces,
        "namespaces the operator never writes in, besides the system ones",
        chart="watch.excludedNamespaces", blank=True,
    )
    namespaces: tuple[str, ...] = setting(
        (), "FINETUNE_NAMESPACES", p.namespaces, "watch this namespace (repeatable); none: cluster-wide",
        chart=("watch.mode", "watch.namespaces"), flag=("-n", "--namespace"), blank=True, repeated=True,
    )
    # Guardrails of the platform team (None: no limit). A job above a limit ends Failed before
    # any child exists; one whose pods stay unschedulable this long ends Failed (Unschedulable).
    max_gpus_per_job: int | None = setting(
        None, "FINETUNE_MAX_GPUS_PER_JOB", p.limit, "most GPUs one job may use (0: no limit)",
        chart="guardrails.maxGpusPerJob",
    )
    max_nodes_per_job: int | None = setting(
        None, "FINETUNE_MAX_NODES_PER_JOB", p.limit, "most nodes one job may use (0: no limit)",
        chart="guardrails.maxNodesPerJob",
    )
    default_active_deadline_seconds: int | None = setting(
        None, "FINETUNE_DEFAULT_ACTIVE_DEADLINE_SECONDS", p.limit, "activeDeadlineSeconds of jobs that set none",
        chart="guardrails.defaultActiveDeadlineSeconds",
    )
    pending_timeout_seconds: int | None = setting(
        None, "FINETUNE_PENDING_TIMEOUT_SECONDS", p.limit, "seconds a job may stay unschedulable (0: forever)",
        chart="guardrails.pendingTimeoutSeconds",
    )
    # None: no per-job NetworkPolicy (the chart's trainer.networkPolicy.enabled false).
    trainer_network: TrainerNetwork | None = setting(
        None, "FINETUNE_TRAINER_NETWORK", p.trainer_network, "the trainers' NetworkPolicy rules, rendered",
        chart="trainer.networkPolicy", blank=True,
    )
    # The pre-flight Job (builders/preflight.py): its CPU pod checks a job's claims before the GPU
    # Job exists. Its memory holds the tokenizer and the dataset's records while they are checked.
    preflight: bool = setting(
        True, "FINETUNE_PREFLIGHT", p.boolean, "check a job's inputs before its GPU Job", chart="preflight.enabled"
    )
    preflight_cpu: str = setting(
        "1", "FINETUNE_PREFLIGHT_CPU", p.quantity, "CPU of the input check's pod", chart="preflight.cpu"
    )
    preflight_memory: str = setting(
        "2Gi", "FINETUNE_PREFLIGHT_MEMORY", p.quantity, "memory of the input check's pod", chart="preflight.memory"
    )
    preflight_deadline_seconds: int = 600
    # The namespace's object cache claim (builders/objects.py), made for jobs that name none.
    object_cache_access_mode: str = setting(
        "ReadWriteMany", "FINETUNE_OBJECT_CACHE_ACCESS_MODE",
        p.choice(("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")),
        "access mode of the namespace's object cache claim", chart="objectCache.accessMode",
    )
    object_cache_storage_class: str = setting(
        "", "FINETUNE_OBJECT_CACHE_STORAGE_CLASS", p.text, "StorageClass of the namespace's object cache claim",
        chart="objectCache.storageClassName", blank=True,
    )
    object_cache_least: str = setting(
        "10Gi", "FINETUNE_OBJECT_CACHE_LEAST", p.quantity, "the least size of the namespace's object cache claim",
        chart="objectCache.leastSize",
    )
    metrics_port: int = setting(
        8000, "FINETUNE_METRICS_PORT", p.port, "Prometheus metrics port (0 = off)",
        chart="metrics.port", flag="--metrics-port",
    )
    health_port: int = setting(
        8080, "FINETUNE_HEALTH_PORT", p.port, "liveness port, serves /healthz (0 = off)",
        chart="health.port", flag="--health-port",
    )
    # Replicas that share one network namespace (the local cluster's node agent runs pods as host
    # processes) each listen on their pod's own address (`status.podIP`), so their ports do not collide.
    listen_address: str = setting(
        "0.0.0.0", "FINETUNE_LISTEN_ADDRESS", p.text, "address the health and metrics servers listen on"
    )
    log_level: str = setting(
        "INFO", "FINETUNE_LOG_LEVEL", p.choice(LOG_LEVELS, upper=True), "log level: DEBUG, INFO, WARNING or ERROR",
        chart="logLevel", flag="--log-level",
    )
    log_format: str = setting(
        "json", "FINETUNE_LOG_FORMAT", p.choice(LOG_FORMATS), "log format: json (one object a line) or text",
        chart="logFormat", flag="--log-format",
    )
    resync_seconds: float = setting(
        30.0, "FINETUNE_RESYNC_SECONDS", p.seconds, "seconds between re-checks of every job", chart="resyncSeconds"
    )
    # A job's status changes short of Succeeded or Failed wait until what the user would read has
    # stood unchanged this many seconds (at most four times that), then the newest state is
    # written once (runtime/coalesce.py); a terminal phase is written at once. 0: every change at once.
    status_coalesce_seconds: float = setting(
        5.0, "FINETUNE_STATUS_COALESCE_SECONDS", p.seconds_within(0, 300), "seconds a status change waits to stand",
        chart="statusCoalesceSeconds",
    )
    # Several replicas, one leader: only the holder of the Lease reconciles and writes.
    leader_election: bool = setting(
        False, "FINETUNE_LEADER_ELECTION", p.boolean, "reconcile only while holding the Lease",
        chart="leaderElection.enabled", flag="--leader-elect",
    )
    lease_name: str = setting(
        "finetune-operator", "FINETUNE_LEASE_NAME", p.text, "the Lease's name",
        chart="leaderElection.leaseName", flag="--lease-name",
    )
    # The operator's own namespace, from the chart's downward API, when no other is named.
    lease_namespace: str | None = setting(
        None, "FINETUNE_LEASE_NAMESPACE", p.text, "the Lease's namespace",
        flag="--lease-namespace", fallback="POD_NAMESPACE",
    )
    lease_duration_seconds: float = setting(
        LeaseTimings.lease_duration_s, "FINETUNE_LEASE_DURATION_SECONDS", p.seconds,
        "seconds a standby waits on the Lease's last change before it takes the Lease",
        chart="leaderElection.leaseDuration",
    )
    lease_renew_deadline_seconds: float = setting(
        LeaseTimings.renew_deadline_s, "FINETUNE_LEASE_RENEW_DEADLINE_SECONDS", p.seconds,
        "seconds a leader tries to renew before it stops", chart="leaderElection.renewDeadline",
    )
    lease_retry_period_seconds: float = setting(
        LeaseTimings.retry_period_s, "FINETUNE_LEASE_RETRY_PERIOD_SECONDS", p.seconds,
        "seconds between tries to take or renew the Lease", chart="leaderElection.retryPeriod",
    )
    # The chart passes the pod's name from the downward API; it starts the leader's identity.
    pod_name: str | None = setting(None, "POD_NAME", p.text, "the operator pod's name")
    # Test hook only (acceptance: operator killed between two creates). Names the child kind after
    # whose creation the process exits hard, e.g. "Job". Never set it in production.
    crash_after: str | None = setting(None, "FINETUNE_TEST_CRASH_AFTER", p.text, "test hook: exit after this create")
    # fmt: on

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @property
    def lease_timings(self) -> LeaseTimings:
        return LeaseTimings(
            self.lease_duration_seconds, self.lease_renew_deadline_seconds, self.lease_retry_period_seconds
        )

    def host_memory_for(self, product: str) -> int | None:
        """Bytes a node of `product` offers a pod per GPU, where the chart names the product."""
        wanted = lookup(product)
        for name, quantity in self.host_memory_per_gpu.items():
            if wanted is not None and lookup(name) == wanted:
                return to_bytes(quantity)
        return None


# The table, by field, in the order of the class.
SETTINGS: Mapping[str, Setting] = MappingProxyType(
    {f.name: replace(f.metadata[_ROW], name=f.name) for f in fields(Settings) if _ROW in f.metadata}
)


def given(row: Setting, env: Mapping[str, str]) -> tuple[str, str] | None:
    """The variable that sets `row` in `env` and its text, or None where the default stands."""
    raw = env.get(row.env)
    if raw is not None and (raw or row.blank):
        return row.env, raw
    if row.fallback and (other := env.get(row.fallback)):
        return row.fallback, other
    return None


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from environment variables; defaults for the ones not set."""
    env = os.environ if env is None else env
    updates: dict[str, Any] = {}
    for row in SETTINGS.values():
        if (found := given(row, env)) is not None:
            updates[row.name] = row.parse(*found)
    return Settings(**updates)


def check(settings: Settings) -> Settings:
    """Rules across settings, checked once the flags are in: every job would fail otherwise."""
    if not images.allowed(settings.trainer_image, settings.allowed_images):
        raise SettingsError(
            f"{SETTINGS['trainer_image'].env}: the default trainer image {settings.trainer_image!r} is not in "
            f"{SETTINGS['allowed_images'].env} ({', '.join(settings.allowed_images)})"
        )
    if not images.allowed(settings.serving_image, settings.allowed_serving_images):
        raise SettingsError(
            f"{SETTINGS['serving_image'].env}: the default serving image {settings.serving_image!r} is not in "
            f"{SETTINGS['allowed_serving_images'].env} ({', '.join(settings.allowed_serving_images)})"
        )
    if settings.leader_election:
        lease = SETTINGS["lease_namespace"]
        if not settings.lease_namespace:
            raise SettingsError(f"{lease.env}: leader election needs the Lease's namespace (or {lease.fallback})")
        if problem := settings.lease_timings.problem():
            timings = ("lease_duration_seconds", "lease_renew_deadline_seconds", "lease_retry_period_seconds")
            raise SettingsError(f"{', '.join(SETTINGS[t].env for t in timings)}: {problem}")
    return settings
