"""`ftjob serve NAME --adapter JOB [--adapter JOB] [--apply]`: a ModelServer of finished jobs'
gguf-lora adapters on their base, written as YAML, or applied (checked first as the operator
checks it: nothing is sent that it would refuse)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml
from pydantic import ValidationError

from finetune_api.constants import API_VERSION, GROUP, SERVER_KIND, SERVER_PLURAL, VERSION
from finetune_api.problems import problems_from
from finetune_api.server_resource import ModelServer

from . import kube
from .errors import CliError
from .servers import cluster_problems


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "serve",
        help="write or apply a ModelServer of finished jobs' adapters",
        description="Write a ModelServer (llama-server with each job's gguf-lora adapter, loaded at scale 0, on the "
        "base the first job wrote beside its adapter) as YAML on stdout; with --apply, check it on the cluster as the "
        "operator would and create it, or change the adapters of the one there (its pods roll, none refused).",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--adapter", metavar="JOB", action="append", default=[], help="a finished job's gguf-lora adapter (repeatable)"
    )
    parser.add_argument(
        "--base", metavar="JOB", help="the job whose GGUF base is served (default: the first --adapter)"
    )
    parser.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs of each pod (0 = CPU; default 1)")
    parser.add_argument("--gpu-product", metavar="PRODUCT", help="node label value (default Tesla-P40)")
    parser.add_argument("--replicas", type=int, metavar="N", help="pods behind the Service (default 1)")
    parser.add_argument("--context-size", type=int, metavar="N", help="tokens of context of a pod (default 4096)")
    parser.add_argument("--parallel", type=int, metavar="N", help="requests a pod serves at once (default 4)")
    parser.add_argument("--apply", action="store_true", help="create it on the cluster, or update the one there")
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def manifest(args: argparse.Namespace, namespace: str | None) -> dict[str, Any]:
    base = args.base or (args.adapter[0] if args.adapter else None)
    if base is None:
        raise CliError("name the adapters' jobs with --adapter JOB (or the base with --base JOB)")
    spec: dict[str, Any] = {
        "base": {"job": base},
        "adapters": [{"job": job} for job in args.adapter],
        "resources": {"gpus": args.gpus, **({"gpuProduct": args.gpu_product} if args.gpu_product else {})},
    }
    for key, value in (("replicas", args.replicas), ("contextSize", args.context_size), ("parallel", args.parallel)):
        if value is not None:
            spec[key] = value
    meta = {"name": args.name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": API_VERSION, "kind": SERVER_KIND, "metadata": meta, "spec": spec}


def checked(body: dict[str, Any], applying: bool) -> ModelServer:
    try:
        return ModelServer.model_validate(body)
    except ValidationError as exc:
        problems = problems_from(exc, ModelServer)
        for problem in problems[:-1]:
            print(f"error: {problem}", file=sys.stderr)
        raise CliError(f"{problems[-1]} (nothing {'applied' if applying else 'written'})") from None


def apply(cluster: kube.Cluster, body: dict[str, Any]) -> str:
    """Create the server, or set the spec of the one there; what happened."""
    from kubernetes.client.exceptions import ApiException

    api, name = cluster.custom(), body["metadata"]["name"]
    args = (GROUP, VERSION, cluster.namespace, SERVER_PLURAL)
    with kube.api_errors(cluster, f"modelserver {name}"):
        try:
            api.create_namespaced_custom_object(*args, body)
            return "created"
        except ApiException as exc:
            if exc.status != 409:
                raise
        api.patch_namespaced_custom_object(*args, name, {"spec": body["spec"]})
    return "configured"


def run(args: argparse.Namespace) -> int:
    if not args.apply:
        body = manifest(args, args.namespace)
        checked(body, applying=False)
        print(yaml.safe_dump(body, sort_keys=False), end="")
        return 0
    cluster = kube.connect(args)
    body = manifest(args, cluster.namespace)
    server = checked(body, applying=True)
    problems = cluster_problems(cluster, server.spec)
    if problems:
        for problem in problems[:-1]:
            print(f"error: {problem}", file=sys.stderr)
        raise CliError(f"{problems[-1]} (nothing applied)")
    done = apply(cluster, body)
    print(f"modelserver.finetune.dev/{args.name} {done} in namespace {cluster.namespace}")
    return 0
