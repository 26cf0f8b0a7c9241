"""The GPU nodes `ftjob plan` judges a job against (finetune_plan.nodes): the cluster's, read when
a kubeconfig reaches one, else the planner's figures for a server of the product.

The operator judges with the Nodes of its watch cache, so on a cluster `ftjob plan` and the
operator give the same verdict on the same spec. Where no kubeconfig is found, the cluster does
not answer within seconds, or listing Nodes is forbidden (a team's credentials often are), the
plan says so on its `nodes` line and judges against one server of the product.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from finetune_plan.nodes import GPU_RESOURCE, PRODUCT_LABEL, Nodes, facts, product_nodes

from . import kube
from .errors import CliError

# Seconds to connect and to read the list: a plan never waits long on a cluster that is away.
TIMEOUTS = (3.0, 10.0)


def add_options(parser: argparse.ArgumentParser) -> None:
    kube.add_options(parser, namespace=False)
    parser.add_argument(
        "--offline",
        action="store_true",
        help="judge the job against the planner's figures for a server of the product, not the cluster's nodes",
    )


def _listed(args: argparse.Namespace) -> list[dict[str, Any]]:
    cluster = kube.connect(args)
    with kube.api_errors(cluster, "nodes"):
        reply = cluster.core().list_node(
            label_selector=PRODUCT_LABEL, _request_timeout=TIMEOUTS, _preload_content=False
        )
    items: list[dict[str, Any]] = json.loads(reply.data).get("items") or []
    return items


def nodes_for(args: argparse.Namespace, product: str) -> tuple[Nodes, str | None]:
    """The nodes to judge against, and why they are not the cluster's (None: they are)."""
    if args.offline:
        return product_nodes(product), "--offline"
    if kube.kubeconfig_path(args) is None:
        return product_nodes(product), "no kubeconfig found"
    try:
        listed = _listed(args)
    except CliError as exc:
        return product_nodes(product), str(exc)
    found = tuple(f for f in (facts(n, PRODUCT_LABEL, GPU_RESOURCE) for n in listed) if f is not None)
    return Nodes(found, "the cluster's nodes"), None
