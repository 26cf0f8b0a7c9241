"""`ftjob eval SERVER --tasks DIR [--adapter JOB ...] [--limit N] [-o table|json]`: lm-evaluation-
harness generation tasks from a local folder (or pvc:CLAIM/PATH, eval_claim) against a
ModelServer, once for the base and once per adapter, in one table (rows: tasks x metrics;
columns: the base, then each adapter).

The task folder is read and every task built before anything is sent (eval_tasks); the runs use
lm-evaluation-harness's own OpenAI-compatible chat model (`local-chat-completions`: the server
renders the prompt with the base's chat template, as the adapters were trained) with no tokenizer
of its own (nothing downloaded), through a loopback relay to the API server's service proxy that
picks the adapter (eval_relay). The numbers are lm-evaluation-harness's results, unchanged."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Final

from . import kube
from .chat import post, service_name
from .display import one_line
from .errors import CliError
from .eval_claim import claim_folder, claim_tasks
from .eval_relay import Relay
from .eval_table import document, rows, text
from .eval_tasks import TaskFile, checked, lm_eval_module
from .job_output import add_reader_options
from .servers import adapter_id, get_server

CHAT_PATH: Final = "v1/chat/completions"
MODEL: Final = "local-chat-completions"
# A failed request is tried once more: a server that refuses answers the same the third time.
RETRIES: Final = 2
REQUEST_SECONDS: Final = 600
# lm-evaluation-harness's default seed of the few-shot sampler: the same examples for every model.
SEED: Final = 1234


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "eval",
        help="lm-evaluation-harness tasks against a ModelServer: the base and each adapter",
        description="Run the lm-evaluation-harness generation tasks of a folder (task YAMLs and their json/jsonl "
        "data files, read offline; a local folder, or pvc:CLAIM/PATH copied from a claim) against a ModelServer "
        "through the API server's service proxy: once for the base and once per adapter (all the server's, or each "
        "--adapter), and print one table of lm-evaluation-harness's figures (rows: task and metric; columns: base "
        "and adapters). A task file that does not parse or build is refused before anything is sent. Needs the "
        "CLI's eval extra (pip install 'finetune-cli[eval]').",
    )
    parser.add_argument("server", metavar="SERVER")
    parser.add_argument(
        "--tasks",
        required=True,
        metavar="DIR",
        help="a folder of lm-evaluation-harness task YAMLs and their data files, or pvc:CLAIM/PATH, one on a claim",
    )
    parser.add_argument(
        "--adapter", metavar="JOB", action="append", default=[], help="a job (or id) among the server's adapters "
        "(repeatable; default: every adapter)",
    )  # fmt: skip
    parser.add_argument("--limit", type=int, metavar="N", help="the first N examples of each task (default: all)")
    parser.add_argument(
        "--concurrent", type=int, metavar="N", help="requests in flight at once (default: the server's spec.parallel)"
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="how the table is printed")
    add_reader_options(parser)  # for pvc:CLAIM/PATH: the pod that mounts the claim, as ftjob upload's
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def columns_of(server: dict[str, Any], wanted: list[str]) -> dict[str, int]:
    """Column name -> llama-server adapter id: each --adapter, or every adapter the server lists
    (a job named `base` is shown with its id, the base's column being `base`)."""
    if wanted:
        ids = {name: adapter_id(server, name) for name in dict.fromkeys(wanted)}
    else:
        listed = (server.get("status") or {}).get("adapters") or []
        ids = {str(e.get("job") or e.get("id")): int(e["id"]) for e in listed}
    return {(f"base (id {i})" if name == "base" else name): i for name, i in ids.items()}


def ready_server(cluster: kube.Cluster, name: str) -> dict[str, Any]:
    server = get_server(cluster, name)
    status = server.get("status") or {}
    if status.get("phase") != "Ready":
        said = status.get("message") or "not seen by the operator yet"
        raise CliError(f"modelserver {name} is {status.get('phase') or 'Pending'}: {one_line(said)}")
    return server


def measure(tasks: list[TaskFile], relay: Relay, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """One lm-evaluation-harness run of every task through the relay (its adapter set already).
    What `simple_evaluate` does for a run, without what it adds after (the machine's torch and
    git description, which would load torch for nothing)."""
    evaluator = lm_eval_module("lm_eval.evaluator")
    registry = lm_eval_module("lm_eval.api.registry")
    manager = lm_eval_module("lm_eval.tasks").TaskManager(include_defaults=False)
    lm = registry.get_model(MODEL).create_from_arg_obj(
        {
            "base_url": relay.url(CHAT_PATH),
            "model": model,
            "tokenizer_backend": None,  # the server tokenizes; nothing is downloaded
            "tokenized_requests": False,
            "num_concurrent": args.concurrent,
            "max_retries": RETRIES,
            "timeout": REQUEST_SECONDS,
        }
    )
    loaded = manager.load([task.fresh() for task in tasks])
    for task in loaded["tasks"].values():
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=SEED)
    results: dict[str, Any] | None = evaluator.evaluate(
        lm=lm,
        task_dict=loaded,
        limit=args.limit,
        bootstrap_iters=0,
        log_samples=False,
        apply_chat_template=True,
        fewshot_as_multiturn=True,
    )
    return results or {}


def run_all(
    tasks: list[TaskFile], relay: Relay, server: dict[str, Any], adapters: dict[str, int], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for column, lora in [("base", []), *((c, [{"id": i, "scale": 1.0}]) for c, i in adapters.items())]:
        relay.lora, relay.failure, started = lora, None, time.monotonic()
        print(f"{column}: {len(tasks)} task(s) ...", file=sys.stderr, flush=True)
        try:
            runs[column] = measure(tasks, relay, server["metadata"]["name"], args)
        except CliError:
            raise
        except Exception as exc:  # lm-evaluation-harness's failure, or the server's in its words
            raise CliError(f"{column}: lm-evaluation-harness stopped: {relay.failure or one_line(exc)}") from None
        print(f"{column}: done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return runs


def evaluate_on(cluster: kube.Cluster, server: dict[str, Any], tasks: list[TaskFile], args: argparse.Namespace) -> None:
    adapters = columns_of(server, args.adapter)
    if args.concurrent is None:
        args.concurrent = int((server.get("spec") or {}).get("parallel") or 1)
    service = service_name(server)
    with Relay(lambda path, body: post(cluster, service, path, body)) as relay:
        runs = run_all(tasks, relay, server, adapters, args)
    columns = ["base", *adapters]
    table = rows(columns, runs)
    if args.output == "json":
        print(json.dumps(document(args.server, columns, adapters, table), indent=2))
    else:
        print(text(columns, table))


def run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be 1 or more")
    if args.concurrent is not None and args.concurrent < 1:
        raise CliError("--concurrent must be 1 or more")
    on_claim = claim_folder(args.tasks)
    if on_claim is None:
        tasks = checked(Path(args.tasks))  # before the cluster is asked anything
        cluster = kube.connect(args)
        evaluate_on(cluster, ready_server(cluster, args.server), tasks, args)
        return 0
    cluster = kube.connect(args)
    server = ready_server(cluster, args.server)
    with claim_tasks(cluster, on_claim, args) as tasks:
        evaluate_on(cluster, server, tasks, args)
    return 0
