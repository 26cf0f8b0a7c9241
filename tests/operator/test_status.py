"""The status logic: phase, conditions and Events from what the cluster shows."""

from finetune_operator.status.events import transitions
from finetune_operator.status.observation import Observation
from finetune_operator.status.patch import needs_patch, status_patch
from finetune_operator.status.phase import compute, hand_over
from tests.support.bodies import NOW, cond, job, pod


def observe(current=None, **kw):
    return compute(Observation(generation=2, now=NOW, current=current or {}, **kw))


def conditions(outcome):
    return {c["type"]: c for c in outcome.status["conditions"]}


def test_no_job_yet_is_pending_and_validated():
    out = observe()
    assert out.phase == "Pending"
    assert conditions(out)["Validated"]["status"] == "True"
    assert conditions(out)["Validated"]["observedGeneration"] == 2
    assert out.status["observedGeneration"] == 2


def test_invalid_spec_fails_with_the_problem_as_message():
    out = observe(invalid="spec.training.maxSteps: must be >= 1")
    c = conditions(out)
    assert out.phase == "Failed"
    assert c["Validated"]["status"] == "False" and c["Validated"]["reason"] == "Invalid"
    assert out.status["message"] == "spec.training.maxSteps: must be >= 1"


def test_running_pod_makes_the_job_running():
    out = observe(job=job(), pods=[pod("p", "Running", node="local-0", scheduled=(True, "", ""))])
    c = conditions(out)
    assert out.phase == "Running"
    assert c["Running"]["status"] == "True"
    assert c["Scheduled"]["status"] == "True" and "local-0" in c["Scheduled"]["message"]
    assert out.status["startTime"] == "2026-01-01T00:00:00Z"
    # The phase and the Running condition (with the moment it flipped) say it: no Event.
    assert out.transitions == []


def test_unschedulable_pod_stays_pending_with_the_schedulers_message():
    text = "0/6 nodes are available: 6 Insufficient nvidia.com/gpu."
    out = observe(job=job(), pods=[pod("p", "Pending", scheduled=(False, "Unschedulable", text))])
    c = conditions(out)
    assert out.phase == "Pending"
    assert c["Scheduled"] == {**c["Scheduled"], "status": "False", "reason": "Unschedulable", "message": text}
    assert out.status["message"] == text
    # Said by the status and by the scheduler's own FailedScheduling Warning on the pod.
    assert out.transitions == []


def test_a_failed_pod_while_retries_remain_is_a_restart_not_a_failure():
    pods = [
        pod("a", "Failed", exit_code=1, term_message="TrainerError: killed", created="2026-01-01T00:00:01Z"),
        pod("b", "Pending", created="2026-01-01T00:00:05Z"),
    ]
    before = {"phase": "Running", "restarts": 0}
    out = observe(current=before, job=job(failed=1), pods=pods)
    # The phase never goes back from Running to Pending; the Running condition says no trainer runs.
    assert out.phase == "Running"
    running = conditions(out)["Running"]
    assert (running["status"], running["reason"], running["message"]) == ("False", "Restarting", "waiting to retry")
    assert out.status["restarts"] == 1
    assert "Failed" not in conditions(out)
    assert ("Warning", "Restarted") in [(t.type, t.reason) for t in out.transitions]


def test_non_retryable_exit_fails_with_the_trainers_reason():
    pods = [pod("a", "Failed", exit_code=11, term_message="InvalidData: line 3: empty output")]
    policy = cond("Failed", "PodFailurePolicy", "Container trainer for pod x failed with exit code 11")
    out = observe(current={"phase": "Running"}, job=job(failed=1, conditions=[policy]), pods=pods)
    failed = conditions(out)["Failed"]
    assert out.phase == "Failed"
    assert failed["reason"] == "InvalidData" and failed["message"] == "line 3: empty output"
    assert out.status["restarts"] == 0  # the failure that ends the job is not a restart
    assert out.status["completionTime"] == "2026-01-01T00:00:09Z"
    assert [(t.type, t.reason) for t in out.transitions] == [("Warning", "InvalidData")]


def test_exit_code_names_the_reason_when_the_message_is_missing():
    pods = [pod("a", "Failed", exit_code=12)]
    out = observe(job=job(failed=1, conditions=[cond("Failed", "PodFailurePolicy")]), pods=pods)
    assert conditions(out)["Failed"]["reason"] == "NonFiniteLoss"


def test_backoff_limit_exceeded_names_oom_when_the_last_attempt_was_oom_killed():
    pods = [
        pod("a", "Failed", exit_code=1, created="2026-01-01T00:00:01Z"),
        pod("b", "Failed", exit_code=137, term_reason="OOMKilled", created="2026-01-01T00:00:05Z"),
    ]
    out = observe(job=job(failed=2, conditions=[cond("Failed", "BackoffLimitExceeded")]), pods=pods)
    assert conditions(out)["Failed"]["reason"] == "OOMKilled"
    assert out.status["restarts"] == 1
    pods[1] = pod("b", "Failed", exit_code=1, term_message="TrainerError: boom", created="2026-01-01T00:00:05Z")
    out = observe(job=job(failed=2, conditions=[cond("Failed", "BackoffLimitExceeded")]), pods=pods)
    failed = conditions(out)["Failed"]
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "2 attempt(s) failed" in failed["message"] and "TrainerError: boom" in failed["message"]


def test_deadline_exceeded():
    out = observe(
        job=job(conditions=[cond("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")])
    )
    assert conditions(out)["Failed"]["reason"] == "DeadlineExceeded"


def test_complete_job_succeeds():
    out = observe(
        current={"phase": "Running"},
        job=job(conditions=[cond("Complete")], completion="2026-01-01T00:05:00Z"),
        pods=[pod("a", "Succeeded", exit_code=0)],
        output={"claimName": "outputs", "adapterPath": "/mnt/output/tiny/adapter"},
    )
    assert out.phase == "Succeeded"
    assert out.status["completionTime"] == "2026-01-01T00:05:00Z"
    assert out.status["output"]["adapterPath"] == "/mnt/output/tiny/adapter"
    assert conditions(out)["Complete"]["status"] == "True"
    assert conditions(out)["Running"]["status"] == "False"


def test_a_finished_pod_keeps_the_job_running_until_the_job_completes():
    running = {"phase": "Running", "conditions": []}
    out = observe(current=running, job=job(), pods=[pod("a", "Succeeded", exit_code=0)])
    assert out.phase == "Running"
    assert conditions(out)["Running"]["reason"] == "TrainerFinished"
    assert [t.reason for t in out.transitions] == []
    # The Job controller's verdict is all that is left: a hand-over, which may wait to be written.
    assert hand_over(out.status)
    running_pod = observe(current=running, job=job(), pods=[pod("a", "Running", node="n")])
    assert not hand_over(running_pod.status)


def test_a_job_waiting_for_its_first_pod_is_a_hand_over_and_a_refused_pod_is_not():
    """Its Job made, no pod yet (or none the scheduler has looked at): the Job controller and the
    scheduler have the next step. A pod the scheduler refused is the user's news."""
    assert hand_over(observe(job=job(), pods=[]).status)
    assert hand_over(observe(job=job(), pods=[pod("p", "Pending")]).status)
    text = "0/6 nodes are available: 6 Insufficient nvidia.com/gpu."
    refused = observe(job=job(), pods=[pod("p", "Pending", scheduled=(False, "Unschedulable", text))])
    assert not hand_over(refused.status)
    retry = observe(
        current={"phase": "Pending", "restarts": 0}, job=job(failed=1), pods=[pod("a", "Failed", exit_code=1)]
    )
    assert retry.status["restarts"] == 1 and not hand_over(retry.status)


def test_suspend_and_queue():
    out = observe(job=job(suspend=True), suspend_requested=True)
    assert out.phase == "Suspended"
    assert conditions(out)["Suspended"]["status"] == "True"
    queued = observe(job=job(suspend=True), queued=True)
    assert queued.phase == "Queued"
    resumed = observe(current=out.status, job=job(), pods=[pod("p", "Running", node="n")])
    assert resumed.phase == "Running"
    assert conditions(resumed)["Suspended"]["status"] == "False"


def test_terminal_status_survives_the_job_being_deleted_after_ttl():
    done = observe(job=job(conditions=[cond("Complete")], completion="2026-01-01T00:05:00Z"))
    after = observe(current=done.status, job=None)
    assert after.phase == "Succeeded"
    assert not needs_patch(done.status, after.status)


def test_transition_time_only_moves_when_the_status_flips():
    first = observe(job=job(), pods=[pod("p", "Running", node="n")])
    later = compute(
        Observation(
            generation=2,
            now="2026-01-01T01:00:00Z",
            current=first.status,
            job=job(),
            pods=[pod("p", "Running", node="n")],
        )
    )
    assert conditions(later)["Running"]["lastTransitionTime"] == NOW
    assert not needs_patch(first.status, later.status)
    assert later.transitions == []


def test_status_patch_never_touches_the_trainers_fields():
    current = {"phase": "Running", "progress": {"step": 5}, "lastCheckpoint": {"step": 4}, "message": "old"}
    desired = {"phase": "Succeeded", "progress": {"step": 0}}
    patch = status_patch(current, desired)
    assert patch == {"phase": "Succeeded", "message": None}
    assert "progress" not in patch and "lastCheckpoint" not in patch


def test_an_image_outside_the_allow_list_fails_the_job_with_its_own_reason():
    message = "spec.image: 'docker.io/evil/miner:latest' is not in the trainer image allow-list (ghcr.io/x)"
    out = observe(invalid=message, invalid_reason="ImageNotAllowed")
    c = conditions(out)
    assert out.phase == "Failed"
    assert c["Failed"]["reason"] == c["Validated"]["reason"] == "ImageNotAllowed"
    assert c["Failed"]["message"] == message
    assert [(t.type, t.reason) for t in out.transitions] == [("Warning", "ImageNotAllowed")]


def test_backoff_limit_exceeded_counts_the_last_attempt_before_the_job_status_does():
    # FailureTarget is set while the last pod still terminates and status.failed lags by one: the
    # count is the limit plus one at once, so `ftjob watch` (stops at the first Failed) and
    # `ftjob status` (later) agree.
    pods = [pod(n, "Failed", exit_code=1, term_message="TrainerError: boom") for n in "abc"]
    lagging = job(failed=3, conditions=[cond("FailureTarget", "BackoffLimitExceeded")])
    lagging["spec"]["backoffLimit"] = 3
    settled = job(failed=4, conditions=[cond("Failed", "BackoffLimitExceeded")])
    settled["spec"]["backoffLimit"] = 3
    early, late = observe(job=lagging, pods=pods), observe(job=settled, pods=[*pods, pod("d", "Failed", exit_code=1)])
    for out in (early, late):
        assert conditions(out)["Failed"]["message"].startswith("4 attempt(s) failed")
        assert out.status["restarts"] == 3


def test_events_are_for_trouble_only_and_each_is_a_warning():
    """Every phase a job passes (Pending, Queued, Admitted, Running, Suspended, Succeeded) is in
    the status; an Event is posted only for a failed attempt, the GPU-memory retry, a
    preemption and the failure that ends the job: each a Warning, each once."""
    quiet = [
        ({}, {"phase": "Pending", "message": "checking inputs"}),
        ({"phase": "Pending"}, {"phase": "Queued", "message": "insufficient quota"}),
        ({"phase": "Queued"}, {"phase": "Admitted", "message": "admitted by team-a"}),
        ({"phase": "Admitted"}, {"phase": "Running"}),
        ({"phase": "Running"}, {"phase": "Suspended"}),
        ({"phase": "Running"}, {"phase": "Succeeded"}),
        ({}, {"phase": "Succeeded"}),
    ]
    for before, after in quiet:
        assert transitions(before, after) == [], (before, after)
    failed = {"type": "Failed", "status": "True", "reason": "OOMKilled", "message": "out of memory"}
    loud = transitions(
        {"phase": "Running", "restarts": 0, "queue": {"preemptions": 0}},
        {
            "phase": "Running",
            "restarts": 1,
            "oomRetry": {"message": "retrying tighter"},
            "queue": {"preemptions": 1, "lastPreemption": {"message": "by priority"}},
        },
    )
    assert [(t.type, t.reason) for t in loud] == [
        ("Warning", "Restarted"),
        ("Warning", "OutOfMemoryRetry"),
        ("Warning", "Preempted"),
    ]
    end = transitions({"phase": "Running"}, {"phase": "Failed", "conditions": [failed]})
    assert [(t.type, t.reason, t.message) for t in end] == [("Warning", "OOMKilled", "out of memory")]
    assert transitions({"phase": "Failed", "conditions": [failed]}, {"phase": "Failed", "conditions": [failed]}) == []


def test_an_export_that_failed_after_training_leaves_the_job_succeeded_with_exported_false():
    said = "ExportFailed: gguf: llama.cpp's converter failed: the tokenizer"
    finished = [pod("a", "Succeeded", exit_code=0, term_message=said)]
    out = observe(current={"phase": "Running"}, job=job(conditions=[cond("Complete")]), pods=finished)
    exported = conditions(out)["Exported"]
    assert out.phase == "Succeeded"
    assert conditions(out)["Complete"]["status"] == "True"
    assert (exported["status"], exported["reason"]) == ("False", "ExportFailed")
    assert exported["message"] == "gguf: llama.cpp's converter failed: the tokenizer"
    assert out.status["message"] == said
    assert [(t.type, t.reason, t.message) for t in out.transitions] == [("Warning", "ExportFailed", said)]
    # Kept once the pod is gone (ttl), and said once: no second Event.
    again = observe(current=out.status, job=job(conditions=[cond("Complete")]), pods=[])
    assert conditions(again)["Exported"] == exported and again.transitions == []
    # A trainer that wrote every format says nothing of it: no Exported condition at all.
    clean = observe(current={"phase": "Running"}, job=job(conditions=[cond("Complete")]), pods=[pod("a", "Succeeded")])
    assert "Exported" not in conditions(clean) and "message" not in clean.status
