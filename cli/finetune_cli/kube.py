"""Talking to the cluster the way kubectl does: `--kubeconfig`, then $KUBECONFIG (a list of
files, merged), then ~/.kube/config, then in-cluster config; `--context`; `-n/--namespace`,
else the context's namespace, else `default`. API failures become one line each.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_api.constants import GROUP, PLURAL, VERSION

from .errors import CliError

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def add_options(parser: argparse.ArgumentParser, *, namespace: bool = True) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    group.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current context)")
    if namespace:
        group.add_argument("-n", "--namespace", metavar="NS", help="namespace (default: the context's, else default)")


@dataclass
class Cluster:
    api: Any  # kubernetes.client.ApiClient
    namespace: str

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)


def kubeconfig_path(args: argparse.Namespace) -> str | None:
    explicit: str | None = getattr(args, "kubeconfig", None)
    if explicit:
        if not Path(explicit).is_file():
            raise CliError(f"--kubeconfig {explicit}: no such file")
        return explicit
    env = os.environ.get("KUBECONFIG")
    if env:
        # As kubectl reads it: the files it names that exist, and never ~/.kube/config besides.
        present = [p for p in env.split(os.pathsep) if p and Path(p).expanduser().is_file()]
        return os.pathsep.join(present) if present else None
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def connect(args: argparse.Namespace) -> Cluster:
    try:
        from kubernetes import client
        from kubernetes import config as config_module
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise CliError(
            "the cluster commands need the kubernetes package: pip install 'finetune-operator[cli]'"
        ) from None
    config: Any = config_module  # the client's loaders carry no type hints
    path = kubeconfig_path(args)
    context_name: str | None = getattr(args, "context", None)
    namespace: str | None = getattr(args, "namespace", None)
    try:
        if path is None:
            if not os.environ.get("KUBERNETES_SERVICE_HOST"):
                raise CliError("no kubeconfig found: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config")
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            api = client.ApiClient(configuration)
            if namespace is None and IN_CLUSTER_NAMESPACE.is_file():
                namespace = IN_CLUSTER_NAMESPACE.read_text().strip()
        else:
            api = config.new_client_from_config(config_file=path, context=context_name)
            if namespace is None:
                contexts, current = config.list_kube_config_contexts(config_file=path)
                chosen = next((c for c in contexts if c.get("name") == context_name), None) if context_name else current
                namespace = ((chosen or {}).get("context") or {}).get("namespace")
    except ConfigException as exc:
        raise CliError(f"kubeconfig: {' '.join(str(exc).split())}") from None
    return Cluster(api=api, namespace=namespace or "default")


def _api_message(exc: Any) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    import json

    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(message or exc.reason or exc.status).split())


@contextmanager
def api_errors(cluster: Cluster, what: str) -> Iterator[None]:
    """Turn client exceptions into one-line CliErrors; `what` names the object (`finetunejob x`)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        if exc.status == 404:
            raise CliError(f"{what} not found in namespace {cluster.namespace}") from None
        if exc.status == 409:
            raise CliError(f"{what} already exists in namespace {cluster.namespace}") from None
        if exc.status == 403:
            raise CliError(f"forbidden: {_api_message(exc)}") from None
        if exc.status == 401:
            raise CliError("unauthorized: the kubeconfig's credentials were rejected") from None
        if exc.status == 0:
            raise CliError(f"cannot reach the API server at {cluster.host}: {exc.reason}") from None
        raise CliError(f"{what}: {_api_message(exc)}") from None
    except (HTTPError, OSError) as exc:
        reason = str(getattr(exc, "reason", None) or exc)
        reason = re.sub(r"<[^>]*>:\s*", "", reason)  # urllib3 prefixes the connection object's repr
        raise CliError(f"cannot reach the API server at {cluster.host}: {' '.join(reason.split())}") from None


def get_job(cluster: Cluster, name: str) -> dict[str, Any]:
    with api_errors(cluster, f"finetunejob {name}"):
        job: dict[str, Any] = cluster.custom().get_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name
        )
    return job


def job_api_args(cluster: Cluster) -> tuple[str, str, str, str]:
    return GROUP, VERSION, cluster.namespace, PLURAL
