"""`ftjob chat SERVER [--adapter JOB] "prompt"`: one chat completion from a ModelServer, through
the API server's service proxy (`services/<svc>:http/proxy/v1/chat/completions`), so it needs no
port-forward and no route to the cluster: only HTTPS to the API server and RBAC `create` on
`services/proxy` (a POST; the built-in edit role has it).

The adapter is picked as any OpenAI client picks it: the request's `lora` field, `[{"id": ID,
"scale": 1.0}]`, with the id status.adapters lists for the job; without --adapter every adapter
stays at scale 0 and the base answers. Greedy (temperature 0) unless told otherwise."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any, Final

from finetune_api.server_spec import SERVER_PORT_NAME

from . import kube
from .errors import CliError
from .servers import adapter_id, get_server

CONNECT_SECONDS: Final = 15.0
READ_SECONDS: Final = 600.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "chat",
        help="one chat completion from a ModelServer",
        description="Send one chat completion to a ModelServer through the API server's service proxy and print "
        "the answer: with --adapter, that job's adapter (the request's lora field with the id status.adapters "
        "lists); without, the base. Greedy unless --temperature says otherwise.",
    )
    parser.add_argument("server", metavar="SERVER")
    parser.add_argument("prompt", metavar="PROMPT")
    parser.add_argument("--adapter", metavar="JOB", help="a job's name (or an id) among the server's adapters")
    parser.add_argument("--max-tokens", type=int, default=128, metavar="N", help="tokens to generate (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default 0)")
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "tokens"),
        default="text",
        help="the answer, the whole reply (with logprobs), or the answer's token ids",
    )
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def service_name(server: dict[str, Any]) -> str:
    """The Service in front of the server's pods, from its status.endpoint (http://SVC.NS.svc:PORT)."""
    endpoint = str((server.get("status") or {}).get("endpoint") or "")
    host = urllib.parse.urlparse(endpoint).hostname or ""
    if not host:
        raise CliError(f"modelserver {server['metadata']['name']} has no endpoint yet (the operator has not seen it)")
    return host.split(".", 1)[0]


def request_body(server: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    lora = [{"id": adapter_id(server, args.adapter), "scale": 1.0}] if args.adapter else []
    body = {
        "model": server["metadata"]["name"],
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "lora": lora,
    }
    # llama-server lists each generated token with its id under logprobs.
    return {**body, "logprobs": True} if args.output != "text" else body


def token_ids(reply: dict[str, Any]) -> list[int]:
    choice = (reply.get("choices") or [{}])[0]
    return [int(t["id"]) for t in (choice.get("logprobs") or {}).get("content") or []]


def post(cluster: kube.Cluster, service: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST JSON to the service through the API server's proxy; the reply's JSON."""
    import urllib3

    namespace = urllib.parse.quote(cluster.namespace, safe="")
    url = f"{cluster.host}/api/v1/namespaces/{namespace}/services/http:{service}:{SERVER_PORT_NAME}/proxy/{path}"
    headers = {"Content-Type": "application/json"}
    cluster.api.update_params_for_auth(headers, [], ["BearerToken"], None, None, None)
    try:
        response = cluster.api.rest_client.pool_manager.request(
            "POST",
            url,
            body=json.dumps(body).encode(),
            headers=headers,
            timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS),
            retries=False,
        )
    except urllib3.exceptions.HTTPError as exc:
        reason = " ".join(str(getattr(exc, "reason", None) or exc).split())
        raise CliError(f"cannot reach the API server at {cluster.host}: {reason}") from None
    try:
        reply = json.loads(response.data or b"{}")
    except ValueError:
        reply = {}
    if response.status != 200 or not isinstance(reply, dict):
        said = reply.get("error") or reply.get("message") if isinstance(reply, dict) else None
        if isinstance(said, dict):
            said = said.get("message")
        text = " ".join(str(said or response.data.decode(errors="replace")[:300] or response.status).split())
        raise CliError(f"service {service}: HTTP {response.status}: {text}")
    return reply


def run(args: argparse.Namespace) -> int:
    cluster = kube.connect(args)
    server = get_server(cluster, args.server)
    phase = (server.get("status") or {}).get("phase")
    if phase != "Ready":
        said = (server.get("status") or {}).get("message") or "not seen by the operator yet"
        raise CliError(f"modelserver {args.server} is {phase or 'Pending'}: {' '.join(str(said).split())}")
    reply = post(cluster, service_name(server), "v1/chat/completions", request_body(server, args))
    if args.output == "json":
        print(json.dumps(reply, indent=2))
        return 0
    if args.output == "tokens":
        print(" ".join(str(i) for i in token_ids(reply)))
        return 0
    choices = reply.get("choices") or [{}]
    print((choices[0].get("message") or {}).get("content") or "")
    return 0
