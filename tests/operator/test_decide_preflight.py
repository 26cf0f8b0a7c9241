"""The pre-flight: a job's inputs are checked by a CPU Job before its GPU Job exists, and a bad
path fails the job naming the claim and the path in it, with no other child made."""

from typing import Any

from finetune_api import contract
from finetune_api.spec import FineTuneJobSpec
from finetune_operator.decide import decide
from finetune_operator.settings import Settings
from tests.operator.test_decide import OWNER, batch_job, checked_inputs, finetunejob, seen
from tests.support.specs import gpu_spec
from tests.support.specs import spec as make_spec

MISSING = "InvalidData: spec.dataset: /mnt/dataset/support/train.json: no such file or folder"


def preflight(state: str | None, message: str | None = None, owner_uid: str = OWNER.uid) -> dict[str, Any]:
    job = checked_inputs(owner_uid)
    job["status"] = {"conditions": [{"type": state, "status": "True"}]} if state else {}
    return job


def preflight_pod(message: str, exit_code: int = 11) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "reason": "Error", "message": message}
    return {
        "metadata": {
            "name": "tiny-preflight-abcde",
            "ownerReferences": [{"kind": "Job", "uid": "preflight-uid", "controller": True}],
            "creationTimestamp": "2026-01-01T00:00:05Z",
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": contract.CONTAINER, "state": {"terminated": terminated}}],
        },
    }


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [c for c in status["conditions"] if c["type"] == kind]
    return found


def test_a_new_job_on_claims_gets_its_input_check_first_and_nothing_else() -> None:
    actions = decide(seen(finetunejob(), preflight=None))
    assert actions.create == () and actions.status_patch is None
    assert actions.preflight
    check = actions.preflight[-1]
    assert check["metadata"]["name"] == "tiny-preflight"
    # Its pods are the job's trainer pods to the job's own NetworkPolicy (builders/network.py).
    pod_labels = check["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["finetune.dev/component"] == "trainer" and pod_labels[contract.PREFLIGHT_POD_LABEL] == "true"
    pod = check["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == list(contract.PREFLIGHT_COMMAND)
    assert all("gpu" not in key for side in container["resources"].values() for key in side)
    assert {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v} == {
        "models",
        "datasets",
    }


def test_while_the_inputs_are_checked_the_job_is_pending_saying_so() -> None:
    actions = decide(seen(finetunejob(), preflight=preflight(None)))
    assert actions.create == () and actions.preflight == ()
    assert actions.status_patch is not None
    assert actions.status_patch["phase"] == "Pending"
    running = _condition(actions.status_patch, "Running")
    assert (running["status"], running["reason"]) == ("False", "CheckingInputs")
    assert actions.status_patch["message"].startswith("checking inputs")
    # An input check is no scheduling trouble (no Unschedulable warning), and the status says it:
    # no Event repeats it.
    assert actions.events == ()


def test_checked_inputs_let_the_gpu_job_be_created() -> None:
    actions = decide(seen(finetunejob({"phase": "Pending", "observedGeneration": 1}), preflight=preflight("Complete")))
    assert [c["kind"] for c in actions.create] == ["Job"]


def test_a_wrong_dataset_path_fails_the_job_naming_the_claim_and_no_job_is_made() -> None:
    check = preflight("Failed")
    actions = decide(seen(finetunejob({"phase": "Pending"}), preflight=check, pods=[preflight_pod(MISSING)]))
    assert actions.create == () and actions.preflight == ()
    assert actions.status_patch is not None and actions.status_patch["phase"] == "Failed"
    said = "spec.dataset: claim 'datasets', path 'support/train.json': no such file or folder"
    failed = _condition(actions.status_patch, "Failed")
    assert (failed["reason"], failed["message"]) == ("InvalidData", said)
    assert "/mnt/" not in actions.status_patch["message"]
    # Decided again once Failed: the same verdict, still no Job.
    after = finetunejob({**actions.status_patch, "observedGeneration": 1})
    again = decide(seen(after, preflight=check, pods=[preflight_pod(MISSING)]))
    assert again.create == () and again.preflight == () and again.status_patch is None


def test_an_input_check_that_ended_without_a_reason_fails_the_job_saying_which_check() -> None:
    check = preflight("Failed")
    check["status"]["conditions"][0].update(reason="DeadlineExceeded", message="Job was active longer than 600 s")
    actions = decide(seen(finetunejob({"phase": "Pending"}), preflight=check))
    assert actions.status_patch is not None
    failed = _condition(actions.status_patch, "Failed")
    assert failed["reason"] == "PreflightFailed"
    assert "Job tiny-preflight" in failed["message"] and "600 s" in failed["message"]


def test_hub_sources_and_a_platform_without_preflight_go_straight_to_the_gpu_job() -> None:
    hub = finetunejob(**gpu_spec())
    assert [c["kind"] for c in decide(seen(hub, preflight=None)).create][-1] == "Job"
    off = seen(finetunejob(), preflight=None)
    off = type(off)(**{**off.__dict__, "settings": Settings(preflight=False)})
    assert [c["kind"] for c in decide(off).create] == ["Job"]


def test_a_deleted_jobs_input_check_is_not_ours() -> None:
    actions = decide(seen(finetunejob({"phase": "Pending"}), preflight=preflight(None, owner_uid="old-uid")))
    assert actions.create == () and actions.preflight == ()


def test_a_running_job_never_looks_at_the_input_check_again() -> None:
    running = finetunejob({"phase": "Running", "observedGeneration": 1})
    actions = decide(seen(running, job=batch_job(), preflight=preflight("Failed"), pods=[preflight_pod(MISSING)]))
    assert actions.status_patch is None or actions.status_patch.get("phase") != "Failed"


def test_messages_name_the_claim_and_the_path_in_it_not_the_mount() -> None:
    spec: FineTuneJobSpec = make_spec()
    said = contract.on_claims(
        "spec.model.source.pvc: /mnt/model/tiny-llama is not a model folder; 2 problem(s) in /mnt/dataset: x; "
        "/mnt/datasetx stays",
        spec,
    )
    assert said == (
        "spec.model.source.pvc: claim 'models', path 'tiny-llama' is not a model folder; "
        "2 problem(s) in claim 'datasets', path '/': x; /mnt/datasetx stays"
    )


def test_the_namespace_policy_fences_the_input_check_and_a_jobs_own_comes_first() -> None:
    """The check's pod carries the job's trainer labels, so the namespace's policy of every
    trainer pod fences it (made with the identity, before any child of any job); a job of several
    nodes has its own policy too, created before the check, as it is before the GPU Job's
    children (no pod of a job runs unfenced)."""
    import json

    from finetune_operator.decide import namespace_children
    from finetune_operator.settings import SETTINGS, from_env
    from tests.support.harness import TRAINER_NETWORK

    rules = from_env({SETTINGS["trainer_network"].env: json.dumps(TRAINER_NETWORK)}).trainer_network
    settings = Settings(trainer_network=rules)
    job = seen(finetunejob(), preflight=None)
    fenced = type(job)(**{**job.__dict__, "settings": settings})
    (check,) = decide(fenced).preflight
    assert check["metadata"]["name"] == "tiny-preflight"
    pod_labels = check["spec"]["template"]["metadata"]["labels"]
    shared = [c for c in namespace_children(job.namespace, settings) if c["kind"] == "NetworkPolicy"]
    selecting = [p for p in shared if p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()]
    assert [p["metadata"]["name"] for p in selecting] == ["finetune-trainers"]
    two = seen(finetunejob(resources={"gpus": 0, "cpu": "1", "memory": "2Gi", "nodes": 2}), preflight=None)
    policy, check = decide(type(two)(**{**two.__dict__, "settings": settings})).preflight
    assert policy["kind"] == "NetworkPolicy" and check["metadata"]["name"] == "tiny-preflight"
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items() <= check["spec"]["template"]["metadata"]["labels"].items()
    )
