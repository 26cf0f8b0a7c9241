"""The pure builders: what each child looks like for a given spec and operator settings."""

import json
import math
import os
import subprocess
import sys
import time

from finetune_api.constants import GROUP, LABEL_JOB, PLURAL
from finetune_api.reasons import NON_RETRYABLE, ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_operator.builders import config, job, pvc, rbac
from finetune_operator.children import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL
from finetune_operator.decide import desired_children, job_patch, output_status
from finetune_operator.settings import Settings
from finetune_plan import grace
from finetune_plan.pod import grace_for
from tests.support.harness import REPO
from tests.support.specs import OWNER, SETTINGS, spec


def pod_spec(s=None, settings=SETTINGS):
    return job.job(OWNER, s or spec(), settings)["spec"]["template"]["spec"]


def container(s=None, settings=SETTINGS):
    return pod_spec(s, settings)["containers"][0]


def test_the_pod_template_carries_the_trainer_config_and_a_volume_makes_it_the_config_file():
    template = job.job(OWNER, spec(), SETTINGS)["spec"]["template"]
    cfg = TrainerConfig.model_validate_json(template["metadata"]["annotations"]["finetune.dev/trainer-config"])
    config_volume = next(v for v in template["spec"]["volumes"] if v["name"] == "config")
    assert config_volume == {
        "name": "config",
        "downwardAPI": {
            "items": [
                {
                    "path": "config.json",
                    "fieldRef": {"fieldPath": "metadata.annotations['finetune.dev/trainer-config']"},
                }
            ]
        },
    }
    assert cfg.job_name == "tiny" and cfg.namespace == "team-a"
    assert cfg.paths.model == "/mnt/model/tiny-llama"
    assert cfg.paths.dataset == "/mnt/dataset/tiny/alpaca.jsonl"
    # No output path in the spec: the job's name keeps jobs sharing a claim apart.
    assert cfg.paths.output == "/mnt/output/tiny"
    assert cfg.paths.cache is None


def test_output_path_follows_the_pvc_path_and_status_points_at_the_adapter():
    s = spec(output={"pvc": {"claimName": "outputs", "path": "runs/a"}, "merge": True})
    assert config.trainer_config(OWNER, s).paths.output == "/mnt/output/runs/a"
    out = output_status(OWNER, s)
    assert out["claimName"] == "outputs"
    assert out["adapterPath"] == "/mnt/output/runs/a/adapter"
    assert out["mergedPath"] == "/mnt/output/runs/a/merged"
    assert [f["format"] for f in out["formats"]] == ["peft", "merged"]


def test_every_owned_child_points_at_the_finetunejob_and_carries_the_job_label():
    children = desired_children(
        OWNER, spec(output={"pvc": None, "storage": {"size": "1Gi", "deleteWithJob": True}}), SETTINGS
    )
    # The config rides in the Job and the trainer identity is the namespace's: nothing else per job.
    assert [c["kind"] for c in children] == ["PersistentVolumeClaim", "Job"]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["labels"][LABEL_JOB] == "tiny"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "finetune.dev/v1alpha1",
                "kind": "FineTuneJob",
                "name": "tiny",
                "uid": "0000-uid",
                "controller": True,
            }
        ]


def test_output_pvc_outlives_the_job_unless_asked():
    kept = pvc.output_pvc(OWNER, spec(output={"pvc": None, "storage": {"size": "50Gi", "storageClassName": "fast"}}))
    assert kept is not None
    assert "ownerReferences" not in kept["metadata"]
    assert kept["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "fast",
    }
    assert pvc.output_pvc(OWNER, spec()) is None  # the user's own claim: nothing to create
    s = spec(output={"pvc": None, "storage": {"size": "50Gi"}})
    assert pod_spec(s)["volumes"][1] == {"name": "output", "persistentVolumeClaim": {"claimName": "tiny-output"}}


def test_the_namespace_trainer_identity_may_only_patch_finetunejob_status():
    account, role, binding = rbac.identity("team-a")
    assert [o["kind"] for o in (account, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    assert role["rules"] == [{"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "finetune-trainer", "namespace": "team-a"}]
    for obj in (account, role, binding):
        # Shared by every job of the namespace: owned by none of them.
        assert obj["metadata"]["namespace"] == "team-a" and "ownerReferences" not in obj["metadata"]
    assert account["automountServiceAccountToken"] is False
    assert pod_spec()["serviceAccountName"] == "finetune-trainer"
    assert pod_spec()["automountServiceAccountToken"] is True


def test_cpu_job_has_no_gpu_placement():
    p = pod_spec()
    assert "nodeSelector" not in p and "tolerations" not in p
    assert container()["resources"] == {
        "limits": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "9216Mi"},
        "requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "1Gi"},
    }


def test_gpu_job_selects_the_product_tolerates_the_taint_and_limits_gpus():
    s = spec(
        resources={"gpus": 4, "gpuProduct": "Tesla-P40", "cpu": None, "memory": None},
        placement={
            "nodeSelector": {"zone": "a", "nvidia.com/gpu.product": "NVIDIA-A100"},
            "tolerations": [{"key": "spot", "operator": "Exists"}],
            "priorityClassName": "training",
        },
    )
    p = pod_spec(s)
    assert p["nodeSelector"] == {"zone": "a", "nvidia.com/gpu.product": "Tesla-P40"}
    assert p["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert p["priorityClassName"] == "training"
    limits = container(s)["resources"]["limits"]
    assert limits == {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "4", "ephemeral-storage": "9216Mi"}
    env = {e["name"]: e.get("value") for e in container(s)["env"]}
    assert env["TORCHDYNAMO_DISABLE"] == "1"  # Pascal


def test_gpu_label_key_toleration_and_resource_come_from_settings():
    custom = Settings(
        gpu_product_label="gpu.example/model",
        gpu_resource="example.com/gpu",
        gpu_tolerations=({"key": "g", "operator": "Exists"},),
    )
    s = spec(resources={"gpus": 2, "gpuProduct": "NVIDIA-A100-SXM4-80GB"})
    p = pod_spec(s, custom)
    assert p["nodeSelector"] == {"gpu.example/model": "NVIDIA-A100-SXM4-80GB"}
    assert p["tolerations"] == [{"key": "g", "operator": "Exists"}]
    assert p["containers"][0]["resources"]["limits"]["example.com/gpu"] == "2"
    assert "TORCHDYNAMO_DISABLE" not in {e["name"] for e in p["containers"][0]["env"]}


def test_pod_meets_pod_security_restricted():
    p = pod_spec()
    c = container()
    assert p["securityContext"]["runAsNonRoot"] is True
    assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert all("hostPath" not in v for v in p["volumes"])
    assert "hostNetwork" not in p and "hostPID" not in p


def test_mounts_follow_the_pod_path_contract():
    c = container()
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/finetune"]["readOnly"] is True
    assert mounts["/mnt/model"]["readOnly"] is True
    assert mounts["/mnt/dataset"]["readOnly"] is True
    assert not mounts["/mnt/output"].get("readOnly")
    vols = {v["name"]: v for v in pod_spec()["volumes"]}
    assert vols["shm"]["emptyDir"]["medium"] == "Memory"
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert c["command"] == ["python", "-m", "finetune_trainer", "--config", "/etc/finetune/config.json"]
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["image"] == "registry.example/trainer:1"
    assert container(spec(image="mine:2"))["image"] == "mine:2"


def test_hub_token_reaches_the_pod_only_through_a_secret_ref():
    s = spec(model={"source": {"hub": {"id": "org/model", "tokenSecret": "hf"}}})
    env = container(s)["env"]
    token = next(e for e in env if e["name"] == "HF_TOKEN")
    assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert "HF_HUB_OFFLINE" not in {e["name"] for e in env}
    cfg = config.trainer_config(OWNER, s)
    assert cfg.paths.model == "org/model" and cfg.paths.cache == "/mnt/output/.hf-cache"
    assert "model" not in {v["name"] for v in pod_spec(s)["volumes"]}
    offline = {e["name"]: e.get("value") for e in container()["env"]}
    assert offline["HF_HUB_OFFLINE"] == "1"


def test_pod_failure_policy_fails_fast_on_non_retryable_exits_and_ignores_disruptions():
    policy = job.job(OWNER, spec(), SETTINGS)["spec"]["podFailurePolicy"]
    fail, ignore, interrupted = policy["rules"]
    assert fail["action"] == "FailJob"
    assert set(fail["onExitCodes"]["values"]) == {int(c) for c in NON_RETRYABLE}
    assert ExitReason.TrainerError not in fail["onExitCodes"]["values"]
    assert fail["onExitCodes"]["containerName"] == "trainer"
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # Stopped on SIGTERM with its state saved, or the one retry after an OOM: retried without
    # counting an attempt.
    assert interrupted["action"] == "Ignore"
    uncounted = [int(ExitReason.Interrupted), int(ExitReason.OutOfMemoryRetry)]
    assert interrupted["onExitCodes"]["values"] == sorted(uncounted)
    assert not set(interrupted["onExitCodes"]["values"]) & {int(c) for c in NON_RETRYABLE}


def test_the_grace_period_is_the_planners_sigterm_to_checkpoint_estimate():
    cpu = job.job(OWNER, spec(), SETTINGS)["spec"]["template"]["spec"]
    assert cpu["terminationGracePeriodSeconds"] == grace.DEFAULT_S  # no GPU plan on the CPU
    big = spec(
        model={"source": {"hub": {"id": "meta-llama/Llama-3.3-70B-Instruct"}}},
        resources={"gpus": 4, "gpuProduct": "Tesla-P40"},
    )
    planned = grace_for(big)
    assert planned.micro_batch_s is not None and planned.micro_batch_s > 5  # a 70B micro-batch on a P40: seconds
    pod = job.job(OWNER, big, SETTINGS)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == planned.seconds
    # Hand arithmetic for the write: LoRA r=8 on q/k/v/o of 80 layers is 80 x 409,600 parameters,
    # each written as fp32 weight and gradient (8 bytes) and 8-bit Adam's two states with their
    # absmax per 256 (2 + 8/256 bytes): 328,704,000 bytes, 3.29 s at the stated 100 MB/s.
    assert planned.write_bytes == 80 * 409_600 * (8 + 2 + 8 / 256)
    # The rule as the README states it (x1.5 + 15 s, at least 60 s), not the module's constants;
    # the micro-batch time is the planner's speed model (a regression pin, test_calibration.py
    # holds it to measurements).
    assert planned.seconds == max(60, math.ceil(1.5 * (planned.micro_batch_s + 328_704_000 / 100e6) + 15))


def test_job_carries_retries_deadline_ttl_and_suspend():
    j = job.job(
        OWNER, spec(backoffLimit=5, activeDeadlineSeconds=600, ttlSecondsAfterFinished=60, suspend=True), SETTINGS
    )
    assert j["metadata"]["name"] == "tiny"
    assert j["spec"]["backoffLimit"] == 5
    assert j["spec"]["activeDeadlineSeconds"] == 600
    assert j["spec"]["ttlSecondsAfterFinished"] == 60
    assert j["spec"]["suspend"] is True
    assert j["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_queued_job_is_created_suspended_with_the_kueue_label():
    j = job.job(OWNER, spec(placement={"queueName": "gpu-queue"}), SETTINGS)
    assert j["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "gpu-queue"
    assert j["spec"]["suspend"] is True


def test_a_workload_priority_class_is_the_kueue_label_not_the_pods_priority():
    j = job.job(OWNER, spec(placement={"queueName": "q", "workloadPriorityClassName": "high"}), SETTINGS)
    assert j["metadata"]["labels"][KUEUE_PRIORITY_LABEL] == "high"
    assert "priorityClassName" not in j["spec"]["template"]["spec"]
    assert (
        KUEUE_PRIORITY_LABEL not in job.job(OWNER, spec(placement={"queueName": "q"}), SETTINGS)["metadata"]["labels"]
    )


def test_job_patch_follows_suspend_and_leaves_queued_jobs_to_kueue():
    live = {"spec": {"suspend": False}}
    assert job_patch(live, spec(suspend=True), SETTINGS) == {"suspend": True}
    assert job_patch({"spec": {"suspend": True}}, spec(), SETTINGS) == {"suspend": False}
    assert job_patch({"spec": {"suspend": True}}, spec(placement={"queueName": "q"}), SETTINGS) == {}
    assert job_patch(live, spec(activeDeadlineSeconds=30), SETTINGS) == {"activeDeadlineSeconds": 30}


def test_the_platforms_default_deadline_stands_where_the_spec_sets_none():
    platform = Settings(default_active_deadline_seconds=86400)
    assert job.job(OWNER, spec(), platform)["spec"]["activeDeadlineSeconds"] == 86400
    assert job.job(OWNER, spec(activeDeadlineSeconds=60), platform)["spec"]["activeDeadlineSeconds"] == 60
    assert "activeDeadlineSeconds" not in job.job(OWNER, spec(), SETTINGS)["spec"]
    # The live Job keeps the default: no patch takes it away again.
    live = {"spec": {"suspend": False, "activeDeadlineSeconds": 86400}}
    assert job_patch(live, spec(), platform) == {}


BUILD = (
    "import json; from finetune_operator.decide import desired_children; "
    "from finetune_operator.settings import Settings; from tests.support.specs import OWNER, spec; "
    "print(json.dumps(desired_children(OWNER, spec(), Settings())))"
)


def test_builders_are_deterministic():
    """Two interpreters, a second apart, with other hash seeds (so other set and str-hash orders),
    build the same children, key order included: a timestamp, a random name or an order taken
    from a set would show."""
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        command = [sys.executable, "-c", BUILD]
        outputs.append(subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout)
        time.sleep(1.0)
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0]) == desired_children(OWNER, spec(), Settings())


def test_tmp_is_capped_and_the_pod_asks_for_the_disk_it_may_use():
    custom = Settings(tmp_size="20Gi", ephemeral_storage_request="2Gi")
    vols = {v["name"]: v for v in pod_spec(settings=custom)["volumes"]}
    assert vols["tmp"]["emptyDir"] == {"sizeLimit": "20Gi"}
    res = container(settings=custom)["resources"]
    # /tmp plus 1Gi of logs: a pod that fills /tmp is evicted, not the node's disk.
    assert res["limits"]["ephemeral-storage"] == "21504Mi"
    assert res["requests"]["ephemeral-storage"] == "2Gi"


def test_shm_never_takes_more_than_its_share_of_the_memory_limit():
    # The tiny example's shape: 8Gi of /dev/shm asked, 4Gi of memory: half of it, 2Gi.
    small = spec(resources={"memory": "4Gi"})
    assert job.shm_size(small, Settings(shm_size="8Gi")) == "2048Mi"
    assert {v["name"]: v for v in pod_spec(small, Settings())["volumes"]}["shm"]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "2048Mi",
    }
    # Room enough: the configured size as it is.
    assert job.shm_size(spec(resources={"memory": "64Gi"}), Settings(shm_size="8Gi")) == "8Gi"
    assert job.shm_size(spec(resources={"memory": "10G"}), Settings(shm_size="8Gi", shm_memory_fraction=0.25)) == (
        "2384Mi"
    )
    # No memory limit anywhere: nothing to exceed.
    no_limit = spec(resources={"memory": None})
    assert job.shm_size(no_limit, Settings(default_memory=None)) == "8Gi"


def test_only_hub_jobs_carry_the_hub_egress_label():
    from finetune_operator.children import HUB_EGRESS_LABEL

    local = job.job(OWNER, spec(), SETTINGS)["spec"]["template"]["metadata"]["labels"]
    hub_model = spec(model={"source": {"hub": {"id": "org/m"}}})
    hub_data = spec(dataset={"source": {"hub": {"id": "org/d"}}, "format": "alpaca"})
    assert HUB_EGRESS_LABEL not in local
    for s in (hub_model, hub_data):
        template = job.job(OWNER, s, SETTINGS)["spec"]["template"]
        assert template["metadata"]["labels"][HUB_EGRESS_LABEL] == "true"
        # ...and the Job's own labels stay as they were (the streams select on them).
        assert HUB_EGRESS_LABEL not in job.job(OWNER, s, SETTINGS)["metadata"]["labels"]


def test_the_pods_memory_is_the_spec_s_else_the_plan_s_else_the_chart_default() -> None:
    """Llama-3.1-8B on one P40 (dataParallel, one process): the largest tensor the loader stages is
    the embedding, 128256 x 4096 fp32 = 1.957 GiB, plus the 1.5 GiB process base = 3.457 GiB;
    the pod: 3.457 x 1.10 + 2 = 5.80 GiB, written as 6Gi (hand arithmetic, memory.py's constants)."""
    known = {"source": {"hub": {"id": "meta-llama/Llama-3.1-8B"}}}

    def limits(**resources: object) -> dict:
        body = spec(model=known, resources={"gpus": 1, "gpuProduct": "Tesla-P40", **resources})
        return job.job(OWNER, body, SETTINGS)["spec"]["template"]["spec"]["containers"][0]["resources"]

    planned = limits(memory=None)
    assert planned["limits"]["memory"] == planned["requests"]["memory"] == "6Gi"
    assert limits(memory="40Gi")["limits"]["memory"] == "40Gi"
    unknown = spec(model={"source": {"hub": {"id": "org/unknown"}}}, resources={"gpus": 1, "memory": None})
    default = job.job(OWNER, unknown, SETTINGS)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert default["limits"].get("memory") == SETTINGS.default_memory


def test_the_pods_planned_memory_stays_within_what_a_node_offers_per_gpu() -> None:
    """Llama-3.1-8B at 2048 tokens on one P40 offloads activations (auto) up to what a node offers
    per GPU: the chart's figure bounds the pod the operator writes."""
    from dataclasses import replace

    from finetune_api.quantities import to_bytes

    known = {"source": {"hub": {"id": "meta-llama/Llama-3.1-8B"}}}
    resources = {"gpus": 1, "gpuProduct": "Tesla-P40", "memory": None}
    body = spec(model=known, training={"maxLength": 2048}, resources=resources)

    def memory(settings: Settings) -> int:
        container = job.job(OWNER, body, settings)["spec"]["template"]["spec"]["containers"][0]
        return to_bytes(container["resources"]["limits"]["memory"])

    default = memory(SETTINGS)
    tight = memory(replace(SETTINGS, host_memory_per_gpu={"Tesla-P40": "12Gi"}))
    assert tight <= 12 * 2**30 < default <= 28 * 2**30
