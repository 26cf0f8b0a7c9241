"""A ModelServer's children and status, from the pure builders (builders/model_server.py) and the
decision (servers/decide.py, servers/status.py): no cluster. What the fence makes of the same
objects is tests/security/test_fence_servers.py; the whole server on the cluster, test_e2e_serving.py."""

import copy
import json
from typing import Any

from finetune_api.served_files import resolve
from finetune_api.server_spec import ModelServerSpec
from finetune_operator.builders import model_server as builder
from finetune_operator.servers import status as server_status
from finetune_operator.servers.decide import TEMPLATE_HASH, ServerObserved, decide
from finetune_operator.settings import SETTINGS as ROWS
from finetune_operator.settings import Settings, from_env
from tests.support.harness import TRAINER_NETWORK
from tests.support.server_cases import job

OWNER = builder.ServerOwner("chat", "team-a", "uid-1")
SETTINGS = Settings(default_cpu="4", default_memory="16Gi")
JOBS = {"a": job("a"), "b": job("b")}
NOW = "2026-01-01T00:00:00Z"


def spec(**overrides: Any) -> ModelServerSpec:
    body = {"base": {"job": "a"}, "adapters": [{"job": "a"}, {"job": "b"}], **overrides}
    return ModelServerSpec.model_validate(body)


def deployment(s: ModelServerSpec | None = None, settings: Settings = SETTINGS) -> dict[str, Any]:
    s = s or spec()
    return builder.deployment(OWNER, s, resolve(s, OWNER.namespace, JOBS, None), settings)


def _pod(d: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = d["spec"]["template"]["spec"]
    return pod


def test_llama_server_loads_the_base_and_every_adapter_at_scale_zero() -> None:
    args = _pod(deployment())["containers"][0]["args"]
    assert args[:6] == [
        "--model",
        "/mnt/claims/outputs/runs/a/gguf/base-f16.gguf",
        "--lora-scaled",
        "/mnt/claims/outputs/runs/a/gguf/adapter-f16.gguf:0,/mnt/claims/outputs/runs/b/gguf/adapter-f16.gguf:0",
        "--lora-init-without-apply",
        "--no-cache-prompt",
    ]
    pairs = dict(zip(args[6::2], args[7::2], strict=False))
    assert pairs["--host"] == "$(POD_IP)" and pairs["--port"] == "8080"
    assert (pairs["--ctx-size"], pairs["--parallel"], pairs["--threads"]) == ("4096", "4", "4")
    assert pairs["--n-gpu-layers"] == "all" and "--metrics" in args
    alone = _pod(deployment(spec(adapters=[])))["containers"][0]["args"]
    assert not [a for a in alone if a.startswith("--lora") or a == "--no-cache-prompt"]


def test_the_pod_mounts_each_claim_once_read_only_and_gets_no_token() -> None:
    pod = _pod(deployment(spec(adapters=[{"job": "b"}, {"pvc": {"claimName": "models", "path": "x.gguf"}}])))
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert [(v["persistentVolumeClaim"]["claimName"], v["persistentVolumeClaim"]["readOnly"]) for v in claims] == [
        ("outputs", True),
        ("models", True),
    ]
    mounts = pod["containers"][0]["volumeMounts"]
    assert [(m["mountPath"], m.get("readOnly", False)) for m in mounts] == [
        ("/tmp", False),
        ("/mnt/claims/outputs", True),
        ("/mnt/claims/models", True),
    ]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    container = pod["containers"][0]
    assert container["command"] == ["llama-server"] and container["image"] == SETTINGS.serving_image
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": builder.DRAIN_SECONDS}}}


def test_the_pod_is_placed_and_secured_as_a_trainer_pod() -> None:
    from finetune_operator.builders.job import security_contexts

    pod = _pod(deployment())
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-P40"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["containers"][0]["resources"]["limits"] == {
        "cpu": "4",
        "memory": "16Gi",
        "nvidia.com/gpu": "1",
        "ephemeral-storage": "1Gi",
    }
    assert (pod["securityContext"], pod["containers"][0]["securityContext"]) == security_contexts(SETTINGS)
    on_cpu = _pod(deployment(spec(resources={"gpus": 0})))
    assert "nodeSelector" not in on_cpu and "tolerations" not in on_cpu
    assert "nvidia.com/gpu" not in on_cpu["containers"][0]["resources"]["limits"]


def test_a_roll_surges_one_pod_and_keeps_every_old_one_until_it_is_ready() -> None:
    made = deployment()
    assert made["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert made["spec"]["selector"] == {"matchLabels": {"finetune.dev/server": "chat"}}
    assert made["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "finetune.dev/v1alpha1",
            "kind": "ModelServer",
            "name": "chat",
            "uid": "uid-1",
            "controller": True,
        }
    ]


def test_the_network_policy_comes_where_the_platform_turned_policies_on() -> None:
    s = spec()
    files = resolve(s, OWNER.namespace, JOBS, None)
    assert [c["kind"] for c in builder.children(OWNER, s, files, SETTINGS)] == ["Service", "Deployment"]
    fenced = from_env({ROWS["trainer_network"].env: json.dumps(TRAINER_NETWORK)})
    policy, service, made = builder.children(OWNER, s, files, fenced)
    assert policy["spec"]["egress"] == []
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}]}]
    assert policy["spec"]["podSelector"]["matchLabels"] == made["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == {"finetune.dev/server": "chat"}


# --- the decision --------------------------------------------------------------------------------


def body(spec_body: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": spec_body or {"base": {"job": "a"}, "adapters": [{"job": "a"}, {"job": "b"}]},
        "status": status or {},
    }


def observed(**fields: Any) -> ServerObserved:
    base: dict[str, Any] = {"body": body(), "jobs": JOBS, "claims": {"outputs"}}
    return ServerObserved("team-a", "chat", SETTINGS, NOW, **{**base, **fields})


def test_a_new_server_makes_its_children_with_the_deployment_last() -> None:
    actions = decide(observed())
    assert [c["kind"] for c in actions.create] == ["Service", "Deployment"]
    assert TEMPLATE_HASH in actions.create[-1]["metadata"]["annotations"]


def test_a_changed_adapter_list_applies_the_deployment_again_and_nothing_else() -> None:
    live = decide(observed()).create[-1]
    assert decide(observed(deployment=live)).apply is None
    changed = body({"base": {"job": "a"}, "adapters": [{"job": "a"}, {"job": "b"}, {"pvc": {"claimName": "outputs",
                    "path": "x.gguf"}}]})  # fmt: skip
    applied = decide(observed(body=changed, deployment=live)).apply
    assert applied is not None and applied["metadata"]["annotations"] != live["metadata"]["annotations"]


def test_a_refused_server_makes_nothing_and_says_why_in_one_line_per_field() -> None:
    running = {**JOBS, "b": job("b", phase="Running")}
    actions = decide(observed(jobs=running))
    assert actions.create == () and actions.apply is None
    assert actions.status_patch is not None and actions.status_patch["phase"] == "Failed"
    assert actions.status_patch["message"].startswith("spec.adapters[1].job: job b is Running, not Succeeded")
    assert actions.events == (("Refused", actions.status_patch["message"]),)
    off_list = body({"base": {"job": "a"}, "image": "docker.io/x/server:1"})
    said = decide(observed(body=off_list)).status_patch
    assert said is not None and said["message"] == (
        "spec.image: 'docker.io/x/server:1' is not in the serving image allow-list (ghcr.io/finetune-operator/server)"
    )


# --- the status ------------------------------------------------------------------------------------


def pod(args: list[str], *, phase: str = "Running", ready: bool = True, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": f"chat-server-{len(args)}"},
        "spec": {"containers": [{"args": args}]},
        "status": {"phase": phase, "conditions": conditions + status.pop("conditions", []), **status},
    }


def seen(pods: list[dict[str, Any]], args: list[str]) -> server_status.Seen:
    return server_status.Seen(1, NOW, {}, 1, OWNER.endpoint, deployment={"status": {}}, pods=pods, args=args)


NEW, OLD = ["--model", "new"], ["--model", "old"]


def test_the_phase_follows_the_pods() -> None:
    assert server_status.compute(seen([pod(NEW)], NEW))["phase"] == "Ready"
    loading = server_status.compute(seen([pod(NEW, ready=False)], NEW))
    assert (loading["phase"], loading["message"]) == (
        "Loading",
        "llama-server is loading the model (/health not yet 200)",
    )
    unplaced = {"type": "PodScheduled", "status": "False", "message": "0/5 nodes: insufficient nvidia.com/gpu"}
    waiting = server_status.compute(seen([pod(NEW, phase="Pending", ready=False, conditions=[unplaced])], NEW))
    assert (waiting["phase"], waiting["message"]) == (
        "Pending",
        "waiting for a node: 0/5 nodes: insufficient nvidia.com/gpu",
    )


def test_a_server_that_keeps_exiting_is_failed_with_its_last_words() -> None:
    last = {"terminated": {"exitCode": 1, "message": "loading model\nerror: failed to load model 'x.gguf'"}}
    crashed = pod(NEW, ready=False, containerStatuses=[{"restartCount": 3, "lastState": last}])
    status = server_status.compute(seen([crashed], NEW))
    assert status["phase"] == "Failed"
    assert status["message"] == (
        "llama-server exited 1 (3 restarts): loading model | error: failed to load model 'x.gguf'"
    )


def test_a_roll_waiting_for_a_gpu_says_so_while_the_old_pod_serves() -> None:
    unplaced = {"type": "PodScheduled", "status": "False", "message": "0/5 nodes: insufficient nvidia.com/gpu"}
    pods = [pod(OLD), pod(NEW, phase="Pending", ready=False, conditions=[unplaced])]
    status = server_status.compute(seen(pods, NEW))
    assert status["phase"] == "Ready"
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "WaitingForGpu")
    assert progressing["message"].startswith("the new pod waits for a GPU (0/5 nodes: insufficient nvidia.com/gpu)")
    before = copy.deepcopy(status)
    before["conditions"] = [c for c in before["conditions"] if c["type"] != "Progressing"]
    assert server_status.transitions(before, status) == [("WaitingForGpu", progressing["message"])]
    done = server_status.compute(seen([pod(NEW)], NEW))
    assert next(c for c in done["conditions"] if c["type"] == "Progressing")["reason"] == "Rolled"
