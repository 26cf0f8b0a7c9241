"""What a reconcile decides, from what it saw: every path the cluster tests prove end to end
(create, refused child, ownership, Events for trouble only, suspend, deletion), here with no
threads and no API server."""

from typing import Any

from finetune_operator.decide import Actions, Observed, decide
from finetune_operator.settings import Settings
from finetune_plan.nodes import NodeFacts
from tests.support import bodies
from tests.support.specs import OWNER, body

NOW = "2026-01-01T00:00:10Z"
SETTINGS = Settings()


def finetunejob(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    meta = {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid, "generation": 1}
    return {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "metadata": meta, "spec": body(**spec)} | (
        {"status": status} if status else {}
    )


def batch_job(owner_uid: str = OWNER.uid, **spec: Any) -> dict[str, Any]:
    meta = {"name": OWNER.name, "namespace": OWNER.namespace, "uid": "job-uid"}
    meta["ownerReferences"] = [{"kind": "FineTuneJob", "name": OWNER.name, "uid": owner_uid, "controller": True}]
    return {"metadata": meta, "spec": {"suspend": False, **spec}, "status": {}}


def checked_inputs(owner_uid: str = OWNER.uid) -> dict[str, Any]:
    """A pre-flight Job that found the inputs good (test_decide_preflight.py has the rest)."""
    meta = {"name": f"{OWNER.name}-preflight", "namespace": OWNER.namespace, "uid": "preflight-uid"}
    meta["ownerReferences"] = [{"kind": "FineTuneJob", "name": OWNER.name, "uid": owner_uid, "controller": True}]
    return {"metadata": meta, "spec": {}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}


def seen(job_body: dict[str, Any] | None, **kwargs: Any) -> Observed:
    kwargs.setdefault("preflight", checked_inputs())
    return Observed(namespace=OWNER.namespace, name=OWNER.name, settings=SETTINGS, now=NOW, body=job_body, **kwargs)


PENDING = {"phase": "Pending", "observedGeneration": 1}


def test_a_new_job_gets_its_children_and_nothing_else_in_that_pass() -> None:
    actions = decide(seen(finetunejob(output={"pvc": None, "storage": {"size": "1Gi"}})))
    assert [c["kind"] for c in actions.create] == ["PersistentVolumeClaim", "Job"]  # the Job last
    assert actions.create[-1]["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert actions.status_patch is None and actions.events == () and not actions.writes


def test_a_refused_child_fails_the_job_once_instead_of_creating_again() -> None:
    refusal = "the API server rejected Job tiny: spec.template.spec.affinity: Invalid value"
    actions = decide(seen(finetunejob(), rejected=refusal))
    assert not actions.create
    assert actions.phase == "Failed" and actions.status_patch is not None
    failed = next(c for c in actions.status_patch["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], failed["message"]) == ("Invalid", refusal)
    assert [(e.reason, e.message) for e in actions.events] == [("Invalid", refusal)]
    # The next pass, with the verdict written and no Job: nothing is created again.
    written = finetunejob(status=actions.status_patch)
    assert not decide(seen(written)).create


def test_a_job_of_another_owner_is_neither_used_nor_replaced() -> None:
    # The Job of a deleted FineTuneJob of the same name, not collected yet.
    actions = decide(seen(finetunejob(), job=batch_job(owner_uid="old-uid"), pods=[]))
    assert not actions.create and actions.job_patch is None
    assert actions.phase == "Pending"
    assert actions.status_patch is not None and "restarts" not in actions.status_patch


def test_a_job_that_runs_well_posts_no_event_its_status_says_it_all() -> None:
    """The first write after the Job's creation says Pending (or wherever the job is by then),
    and no Event repeats it: not its creation, not a phase (status.transitions)."""
    first = decide(seen(finetunejob(), job=batch_job()))
    assert first.status_patch is not None and first.status_patch["phase"] == "Pending"
    assert first.writes and first.events == ()
    again = decide(seen(finetunejob(status=first.status_patch), job=batch_job()))
    assert not again.writes and again.status_patch is None


def test_a_first_write_after_the_job_finished_is_one_status_patch_and_no_event() -> None:
    """Writes are coalesced (reconcile.py): the first may find the job already Succeeded. One
    status patch, no Event: phase, Complete and completionTime say it."""
    job = batch_job()
    job["status"] = {"conditions": [bodies.cond("Complete", "Completed")], "completionTime": NOW, "startTime": NOW}
    done = bodies.pod("tiny-0", "Succeeded", exit_code=0, node="n")
    done["metadata"]["ownerReferences"] = [{"uid": "job-uid"}]
    actions = decide(seen(finetunejob(), job=job, pods=[done]))
    assert actions.status_patch is not None and actions.status_patch["phase"] == "Succeeded"
    assert actions.status_patch["completionTime"] == NOW
    assert actions.events == ()


def test_a_failure_is_a_warning_event_even_in_the_first_write() -> None:
    """What a user must act on stays an Event, however the writes were coalesced."""
    job = batch_job()
    job["status"] = {"conditions": [bodies.cond("Failed", "BackoffLimitExceeded")], "startTime": NOW, "failed": 1}
    failed = bodies.pod("tiny-0", "Failed", exit_code=1, node="n")
    failed["metadata"]["ownerReferences"] = [{"uid": "job-uid"}]
    actions = decide(seen(finetunejob(), job=job, pods=[failed]))
    assert actions.status_patch is not None and actions.status_patch["phase"] == "Failed"
    assert [e.type for e in actions.events] == ["Warning"]


def _merged(status: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    out = {**status, **(patch or {})}
    return {k: v for k, v in out.items() if v is not None}


def _shown(status: dict[str, Any]) -> dict[str, Any]:
    """What a user reads, less the times a write stamps (the moment it was written)."""
    conditions = [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]]
    return {**{k: v for k, v in status.items() if k != "conditions"}, "conditions": conditions}


def test_one_coalesced_write_ends_where_a_write_per_step_ends() -> None:
    """The same status for the user whether the operator wrote Pending, Running and Succeeded as
    they came, or only once, after the job finished."""
    running_pod = bodies.pod("tiny-0", "Running", node="n", scheduled=(True, "Scheduled", ""))
    done_pod = bodies.pod("tiny-0", "Succeeded", exit_code=0, node="n", scheduled=(True, "Scheduled", ""))
    for pod in (running_pod, done_pod):
        pod["metadata"]["ownerReferences"] = [{"uid": "job-uid"}]
    started = batch_job()
    started["status"] = {"startTime": NOW, "active": 1}
    finished = batch_job()
    finished["status"] = {"conditions": [bodies.cond("Complete", "Completed")], "completionTime": NOW, "startTime": NOW}

    stepwise: dict[str, Any] = {}
    for job, pods in ((started, []), (started, [running_pod]), (finished, [done_pod])):
        actions = decide(seen(finetunejob(status=stepwise or None), job=job, pods=pods))
        stepwise = _merged(stepwise, actions.status_patch)
    once = decide(seen(finetunejob(), job=finished, pods=[done_pod])).status_patch
    assert once is not None and stepwise["phase"] == "Succeeded"
    assert _shown(once) == _shown(stepwise)


def test_suspend_and_resume_patch_the_job_before_any_status() -> None:
    actions = decide(seen(finetunejob(status=PENDING, suspend=True), job=batch_job()))
    assert actions.job_patch == {"suspend": True} and actions.status_patch is None
    resumed = decide(seen(finetunejob(status=PENDING), job=batch_job(suspend=True)))
    assert resumed.job_patch == {"suspend": False}
    # A queued Job is Kueue's to unsuspend.
    queued = finetunejob(status=PENDING, placement={"queueName": "team-a"})
    assert decide(seen(queued, job=batch_job(suspend=True))).job_patch is None
    # Suspended as asked: the status says so.
    suspended = decide(seen(finetunejob(status=PENDING, suspend=True), job=batch_job(suspend=True)))
    assert suspended.job_patch is None and suspended.phase == "Suspended"


def test_a_deleted_job_is_forgotten_and_a_deleting_one_left_to_the_garbage_collector() -> None:
    assert decide(seen(None)).forget
    deleting = finetunejob()
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert decide(seen(deleting, job=batch_job())) == Actions()


def test_an_image_outside_the_allow_list_fails_the_job_and_creates_nothing() -> None:
    actions = decide(seen(finetunejob(image="evil.example.com/miner:1")))
    assert not actions.create and actions.phase == "Failed"
    assert actions.status_patch is not None and "allow-list" in actions.status_patch["message"]
    # A job that got its Job under a wider list is never failed by a narrower one.
    running = finetunejob(status={"phase": "Running"}, image="evil.example.com/miner:1")
    assert decide(seen(running, job=batch_job())).phase != "Failed"


def test_a_job_in_a_namespace_the_operator_never_writes_in_fails_and_creates_nothing() -> None:
    for namespace in ("kube-system", "kube-public", "kube-node-lease"):
        job_body = finetunejob()
        job_body["metadata"]["namespace"] = namespace
        observed = Observed(namespace=namespace, name=OWNER.name, settings=SETTINGS, now=NOW, body=job_body)
        actions = decide(observed)
        assert not actions.create and actions.phase == "Failed", namespace
        assert actions.status_patch is not None
        failed = next(c for c in actions.status_patch["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "NamespaceNotAllowed"
        assert f"namespace '{namespace}' is one the operator never writes in" in failed["message"]
    # The chart adds its own namespace and more; a team namespace is untouched.
    extra = Settings(excluded_namespaces=(*SETTINGS.excluded_namespaces, "finetune-system"))
    team = Observed(namespace=OWNER.namespace, name=OWNER.name, settings=extra, now=NOW, body=finetunejob())
    assert decide(team).preflight  # the first child: the input check


def test_a_terminal_job_whose_job_is_gone_keeps_its_verdict_and_gets_no_new_job() -> None:
    done = {"phase": "Succeeded", "observedGeneration": 1, "completionTime": NOW}
    actions = decide(seen(finetunejob(status=done)))
    assert not actions.create and actions.phase == "Succeeded"


# --- a job of several nodes: one gang of pods ---------------------------------------------

TWO_NODES = {"gpus": 0, "cpu": "1", "memory": "2Gi", "processes": 1, "nodes": 2}


def gang_pod(index: int, phase: str, **kwargs: Any) -> dict[str, Any]:
    made = bodies.pod(f"{OWNER.name}-{index}-abcde", phase, **kwargs)
    made["metadata"]["ownerReferences"] = [{"kind": "Job", "name": OWNER.name, "uid": "job-uid", "controller": True}]
    return made


def test_a_job_of_two_nodes_gets_its_headless_service_then_its_indexed_job() -> None:
    output = {"pvc": None, "storage": {"size": "1Gi"}}
    actions = decide(seen(finetunejob(resources=TWO_NODES, output=output, backoffLimit=3)))
    assert [c["kind"] for c in actions.create] == ["PersistentVolumeClaim", "Service", "Job"]
    claim, service, job = actions.create
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every pod mounts the output
    assert service["metadata"]["name"] == OWNER.name
    assert service["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert (service["spec"]["clusterIP"], service["spec"]["publishNotReadyAddresses"]) == ("None", True)
    assert [p["port"] for p in service["spec"]["ports"]] == [29400]
    assert job["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["template"]["spec"]["subdomain"] == OWNER.name
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    # A gang attempt costs up to one failed pod per node: the spec's limit counts attempts.
    assert spec["backoffLimit"] == 2 * 3
    assert actions.status_patch is None and not actions.writes


def test_a_job_of_one_node_gets_no_service() -> None:
    actions = decide(seen(finetunejob(resources={**TWO_NODES, "nodes": 1})))
    assert [c["kind"] for c in actions.create] == ["Job"]
    assert "completionMode" not in actions.create[0]["spec"]


def test_a_gang_with_a_pod_the_scheduler_cannot_place_says_what_is_missing_and_is_not_running() -> None:
    refusal = "0/5 nodes are available: 4 Insufficient nvidia.com/gpu, 1 node(s) didn't match pod anti-affinity."
    pods = [
        gang_pod(0, "Running", node="local-0", scheduled=(True, "", "")),
        gang_pod(1, "Pending", scheduled=(False, "Unschedulable", refusal)),
    ]
    actions = decide(seen(finetunejob(status=PENDING, resources=TWO_NODES), job=batch_job(), pods=pods))
    patch = actions.status_patch
    assert patch is not None and actions.phase == "Pending"
    assert patch["message"] == f"Unschedulable: 1 of 2 pods pending: {refusal}"
    assert patch["nodes"] == {"ready": 1, "total": 2}
    running = next(c for c in patch["conditions"] if c["type"] == "Running")
    assert running["status"] == "False"
    scheduled = next(c for c in patch["conditions"] if c["type"] == "Scheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    # Said by the status (and the scheduler's FailedScheduling on the pod): no Event of ours.
    assert actions.events == ()


def test_a_gang_is_running_only_when_every_pod_runs() -> None:
    one = [gang_pod(0, "Running", node="local-0"), gang_pod(1, "Pending", node="local-1")]
    waiting = decide(seen(finetunejob(status=PENDING, resources=TWO_NODES), job=batch_job(), pods=one))
    assert waiting.phase == "Pending"
    assert waiting.status_patch is not None and "message" not in waiting.status_patch
    running = next(c for c in waiting.status_patch["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"]) == ("False", "WaitingForNodes")
    assert running["message"].startswith("1 of 2 pods running")

    both = [gang_pod(0, "Running", node="local-0"), gang_pod(1, "Running", node="local-1")]
    whole = decide(seen(finetunejob(status=PENDING, resources=TWO_NODES), job=batch_job(), pods=both))
    assert whole.phase == "Running"
    assert whole.status_patch is not None and whole.status_patch["nodes"] == {"ready": 2, "total": 2}
    scheduled = next(c for c in whole.status_patch["conditions"] if c["type"] == "Scheduled")
    assert scheduled["status"] == "True" and scheduled["message"] == "2 of 2 pods are on nodes local-0, local-1"


def test_a_gang_that_failed_together_counts_one_restart() -> None:
    pods = [
        gang_pod(0, "Failed", exit_code=1, created="2026-01-01T00:00:01Z"),
        gang_pod(1, "Failed", exit_code=137, created="2026-01-01T00:00:01Z"),
        gang_pod(0, "Running", node="local-0", created="2026-01-01T00:00:05Z"),
        gang_pod(1, "Running", node="local-1", created="2026-01-01T00:00:05Z"),
    ]
    job = batch_job()
    job["status"] = {"failed": 2, "startTime": "2026-01-01T00:00:00Z"}
    actions = decide(seen(finetunejob(status=PENDING, resources=TWO_NODES), job=job, pods=pods))
    assert actions.phase == "Running"
    assert actions.status_patch is not None and actions.status_patch["restarts"] == 1
    assert actions.status_patch["nodes"] == {"ready": 2, "total": 2}
    assert "Restarted" in [e.reason for e in actions.events]


# --- the pod's memory against its plan -------------------------------------------------------

KNOWN_8B = {"source": {"hub": {"id": "meta-llama/Llama-3.1-8B"}}}


def test_memory_below_the_plan_fails_the_job_wont_fit_and_creates_nothing() -> None:
    short = finetunejob(model=KNOWN_8B, resources={"gpus": 1, "gpuProduct": "Tesla-P40", "memory": "2Gi"})
    actions = decide(seen(short))
    assert not actions.create and actions.phase == "Failed"
    assert actions.status_patch is not None
    message = actions.status_patch["message"]
    assert "spec.resources.memory" in message and "Gi" in message
    failed = next(c for c in actions.status_patch["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "WontFit"
    # It stays refused: the next pass does not make the Job either.
    again = decide(seen(finetunejob(status=actions.status_patch, model=KNOWN_8B, resources=short["spec"]["resources"])))
    assert not again.create and again.phase == "Failed"


def test_enough_memory_or_none_or_an_unknown_model_creates_the_job() -> None:
    for resources, model in (
        ({"gpus": 1, "gpuProduct": "Tesla-P40", "memory": "64Gi"}, KNOWN_8B),
        ({"gpus": 1, "gpuProduct": "Tesla-P40", "memory": None}, KNOWN_8B),
        ({"gpus": 1, "gpuProduct": "Tesla-P40", "memory": "2Gi"}, {"source": {"hub": {"id": "org/unknown"}}}),
    ):
        assert decide(seen(finetunejob(model=model, resources=resources))).create, resources


# --- an attempt out of GPU memory: one retry on a tighter plan, then Failed ----------------------

RETRY_SAID = (
    "OutOfMemory at step 5 (peak 21.20 GiB of plan 21.90 GiB on cuda:0): retrying once with a tighter plan: "
    "loss chunks 512, micro-batch 1 x 4, eval micro-batch 1, gradient checkpointing on"
)


def job_pod(suffix: str, phase: str, **kwargs: Any) -> dict[str, Any]:
    made = bodies.pod(f"{OWNER.name}-{suffix}", phase, **kwargs)
    made["metadata"]["ownerReferences"] = [{"kind": "Job", "name": OWNER.name, "uid": "job-uid", "controller": True}]
    return made


RETRIED = job_pod(
    "a", "Failed", exit_code=5, term_message=f"OutOfMemoryRetry: {RETRY_SAID}", created="2026-01-01T00:00:01Z"
)


def test_the_first_oom_is_said_once_in_an_event_and_in_the_message_while_the_retry_runs() -> None:
    running = {"phase": "Running", "observedGeneration": 1}
    pods = [RETRIED, job_pod("b", "Running", node="local-0", created="2026-01-01T00:00:05Z")]
    actions = decide(seen(finetunejob(status=running), job=batch_job(), pods=pods))
    assert actions.phase == "Running"
    assert actions.status_patch is not None
    assert actions.status_patch["message"] == RETRY_SAID
    assert actions.status_patch["oomRetry"] == {"pod": "tiny-a", "message": RETRY_SAID}
    assert "restarts" not in actions.status_patch or actions.status_patch["restarts"] == 0  # not counted
    assert [(e.type, e.reason, e.message) for e in actions.events] == [("Warning", "OutOfMemoryRetry", RETRY_SAID)]
    # Written, and seen again (or after the failed pod is gone): no second Event, nothing to write.
    written = finetunejob(status={**running, **actions.status_patch})
    for later in (pods, pods[1:]):
        again = decide(seen(written, job=batch_job(), pods=later))
        assert not again.events and again.status_patch is None


def test_a_second_oom_fails_the_job_with_the_plan_and_the_peak_and_keeps_the_retry_on_record() -> None:
    final = (
        "at step 7 (peak 21.80 GiB of plan 21.40 GiB on cuda:0): CUDA out of memory; again on the retry's tighter "
        "plan (loss chunks 512, micro-batch 1 x 4, eval micro-batch 1, gradient checkpointing on): lower ..."
    )
    pods = [
        RETRIED,
        job_pod("b", "Failed", exit_code=14, term_message=f"OutOfMemory: {final}", created="2026-01-01T00:00:05Z"),
    ]
    job = batch_job()
    job["status"] = {"failed": 1, "conditions": [bodies.cond("Failed", "PodFailurePolicy", "exit code 14")]}
    retrying = {"phase": "Running", "observedGeneration": 1, "oomRetry": {"pod": "tiny-a", "message": RETRY_SAID}}
    actions = decide(seen(finetunejob(status={**retrying, "message": RETRY_SAID}), job=job, pods=pods))
    assert actions.phase == "Failed" and actions.status_patch is not None
    failed = next(c for c in actions.status_patch["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], failed["message"]) == ("OutOfMemory", final)
    assert actions.status_patch["message"] == f"OutOfMemory: {final}"
    assert "oomRetry" not in actions.status_patch  # unchanged: still on record
    assert [e.reason for e in actions.events] == ["OutOfMemory"]


def test_between_the_oom_and_the_retry_the_job_stays_running_and_says_nothing_of_scheduling() -> None:
    running = {"phase": "Running", "observedGeneration": 1}
    pods = [RETRIED, job_pod("b", "Pending", created="2026-01-01T00:00:05Z")]
    actions = decide(seen(finetunejob(status=running), job=batch_job(), pods=pods))
    # Never back from Running to Pending: the Running condition says the retry is coming.
    assert actions.phase == "Running" and actions.status_patch is not None
    assert actions.status_patch["message"] == RETRY_SAID  # the retry's words, not the scheduler's
    condition = next(c for c in actions.status_patch["conditions"] if c["type"] == "Running")
    assert (condition["status"], condition["reason"]) == ("False", "Restarting")
    assert [e.reason for e in actions.events] == ["OutOfMemoryRetry"]


# --- the platform's guardrails (guardrails.py) ---------------------------------------------

LIMITS = Settings(max_gpus_per_job=4, max_nodes_per_job=2)


def test_a_job_above_the_platforms_limits_fails_naming_the_field_and_the_limit_and_creates_nothing() -> None:
    cases = {
        "spec.resources.gpus: 8 GPU(s) is above this cluster's limit of 4 GPU(s) per job": {"gpus": 8},
        "spec.resources.gpus: 4 per node x 2 nodes = 8 GPU(s) is above this cluster's limit of 4 GPU(s) per job": {
            "gpus": 4,
            "nodes": 2,
        },
        "spec.resources.nodes: 3 is above this cluster's limit of 2 node(s) per job": {"gpus": 1, "nodes": 3},
    }
    for message, resources in cases.items():
        actions = decide(Observed(**{**seen(finetunejob(resources=resources)).__dict__, "settings": LIMITS}))
        assert not actions.create and actions.phase == "Failed", message
        assert actions.status_patch is not None and actions.status_patch["message"] == message
        failed = next(c for c in actions.status_patch["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "ExceedsLimit"
    within = decide(Observed(**{**seen(finetunejob(resources={"gpus": 4})).__dict__, "settings": LIMITS}))
    assert [c["kind"] for c in within.create] == ["Job"]


SCHEDULER_SAID = "0/7 nodes are available: 6 node(s) didn't match Pod's node affinity/selector."
TIMEOUT = Settings(pending_timeout_seconds=300)


def stuck_pod(since: str) -> dict[str, Any]:
    made = job_pod("a", "Pending", scheduled=(False, "Unschedulable", SCHEDULER_SAID))
    made["status"]["conditions"][0]["lastTransitionTime"] = since
    return made


def timed(job_body: dict[str, Any], **kwargs: Any) -> Observed:
    return Observed(
        namespace=OWNER.namespace,
        name=OWNER.name,
        settings=TIMEOUT,
        now="2026-01-01T00:10:00Z",
        body=job_body,
        **kwargs,
    )


def gpu_nodes(counts: dict[str, int]) -> tuple[NodeFacts, ...]:
    """Nodes of 4 GPUs by product, as the watch cache holds them."""
    return tuple(NodeFacts(f"{p}-{i}", p, 4, 256 * 2**30) for p, n in counts.items() for i in range(n))


def test_a_job_pending_past_the_timeout_stops_its_pods_then_fails_unschedulable_naming_the_nodes() -> None:
    ftj = finetunejob(status=PENDING, resources={"gpus": 2, "gpuProduct": "NVIDIA-H100-80GB-HBM3"})
    pods = [stuck_pod("2026-01-01T00:04:00Z")]  # 6 minutes ago
    listed = gpu_nodes({"Tesla-P40": 12, "NVIDIA-A100-80GB": 4})
    first = decide(timed(ftj, job=batch_job(), pods=pods, nodes=listed))
    assert first.job_patch == {"suspend": True}  # its pods go: none can be placed later
    third = decide(timed(ftj, job=batch_job(suspend=True), pods=pods, nodes=listed))
    said = (
        "pods unschedulable for over 300 s: no node has nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 "
        "(nodes have: Tesla-P40 x 12, NVIDIA-A100-80GB x 4)"
    )
    assert third.phase == "Failed" and third.status_patch is not None
    assert third.status_patch["message"] == said
    conditions = {c["type"]: c for c in third.status_patch["conditions"]}
    assert (conditions["Failed"]["reason"], conditions["Failed"]["message"]) == ("Unschedulable", said)
    assert conditions["Validated"]["status"] == "True"  # the cluster's doing, not the spec's
    # For good: with its pods gone and the verdict written, the job stays Failed and suspended.
    written = finetunejob(status=third.status_patch, resources={"gpus": 2, "gpuProduct": "NVIDIA-H100-80GB-HBM3"})
    later = decide(timed(written, job=batch_job(suspend=True), pods=[]))
    assert later.phase == "Failed" and later.job_patch is None


def test_before_the_timeout_or_without_one_a_pending_job_waits() -> None:
    ftj = finetunejob(status=PENDING, resources={"gpus": 2})
    recent = [stuck_pod("2026-01-01T00:06:00Z")]  # 4 minutes ago
    assert decide(timed(ftj, job=batch_job(), pods=recent)).phase == "Pending"
    old = [stuck_pod("2026-01-01T00:00:00Z")]
    untimed = Observed(**{**timed(ftj, job=batch_job(), pods=old).__dict__, "settings": SETTINGS})
    assert decide(untimed).phase == "Pending"
    # A job queued through Kueue is left to Kueue, which would unsuspend what we suspend.
    queued = finetunejob(status=PENDING, resources={"gpus": 2}, placement={"queueName": "team-a"})
    actions = decide(timed(queued, job=batch_job(), pods=old))
    assert actions.job_patch is None and actions.phase != "Failed"


def test_where_the_product_exists_or_nodes_cannot_be_listed_the_schedulers_words_are_the_message() -> None:
    ftj = finetunejob(status=PENDING, resources={"gpus": 2})  # Tesla-P40, which nodes have
    pods = [stuck_pod("2026-01-01T00:00:00Z")]
    for listed in (gpu_nodes({"Tesla-P40": 2}), None):
        actions = decide(timed(ftj, job=batch_job(suspend=True), pods=pods, nodes=listed))
        assert actions.status_patch is not None
        assert actions.status_patch["message"] == f"pods unschedulable for over 300 s: {SCHEDULER_SAID}"


def test_a_pod_above_what_a_node_offers_fails_wont_fit_naming_the_fields() -> None:
    """resources.memory unset: the pod's plan must fit the host memory a node of the product offers
    (`trainer.gpu.hostMemoryPerGpu`); Llama-3.1-8B's trainer alone needs 6Gi, a node offering 4Gi
    per P40 holds no pod, and no Job is made."""
    from dataclasses import replace

    small = replace(SETTINGS, host_memory_per_gpu={"Tesla-P40": "4Gi"})
    body = finetunejob(model=KNOWN_8B, resources={"gpus": 1, "gpuProduct": "Tesla-P40", "memory": None})
    observed = Observed(
        namespace=OWNER.namespace, name=OWNER.name, settings=small, now=NOW, body=body, preflight=checked_inputs()
    )
    actions = decide(observed)
    assert not actions.create and actions.phase == "Failed"
    assert actions.status_patch is not None
    message = actions.status_patch["message"]
    assert "does not fit the host memory" in message and "the 4 GiB a Tesla-P40 node offers 1 GPU" in message
    assert "spec.resources.memory" in message and "trainer.gpu.hostMemoryPerGpu" in message
    assert decide(seen(body)).create  # the product's default, 28 GiB, holds it
