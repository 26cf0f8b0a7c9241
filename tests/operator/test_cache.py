"""The watch cache: newest body wins, trimmed to what the status logic reads, deletes by uid."""

from typing import Any

from finetune_operator.runtime.cache import WatchCache


def obj(name: str, version: str, uid: str = "u1", annotations: dict[str, str] | None = None, **extra: Any) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version}
    meta["managedFields"] = [{"big": 1}]
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, **extra}


def test_an_older_body_never_replaces_a_newer_one() -> None:
    cache = WatchCache()
    cache.put_finetunejob(obj("a", "12", status={"phase": "Running"}))
    cache.put_finetunejob(obj("a", "11", status={"phase": "Pending"}))  # a late watch event
    held = cache.finetunejob("ns", "a")
    assert held is not None and held["status"]["phase"] == "Running"
    cache.put_finetunejob(obj("a", "13", status={"phase": "Succeeded"}))
    held = cache.finetunejob("ns", "a")
    assert held is not None and held["status"]["phase"] == "Succeeded"
    assert "managedFields" not in held["metadata"]
    cache.put_finetunejob(
        obj("a", "14", annotations={"kubectl.kubernetes.io/last-applied-configuration": "{...}", "team": "nlp"})
    )
    held = cache.finetunejob("ns", "a")
    assert held is not None and held["metadata"]["annotations"] == {"team": "nlp"}


def test_unordered_versions_take_the_last_arrival() -> None:
    cache = WatchCache()
    cache.put_job(obj("a", "x9", status={"active": 1}))
    cache.put_job(obj("a", "x1", status={"succeeded": 1}))
    held = cache.job("ns", "a")
    assert held is not None and held["status"] == {"succeeded": 1}


def test_job_and_pod_bodies_keep_only_what_status_reads() -> None:
    cache = WatchCache()
    template = {"spec": {"containers": [{"name": "trainer"}]}}
    cache.put_job(obj("a", "5", spec={"suspend": True, "template": template}, status={"active": 1}))
    job = cache.job("ns", "a")
    assert job is not None and job["spec"] == {"suspend": True} and job["status"] == {"active": 1}
    cache.put_pod("a", obj("a-x", "6", spec={"nodeName": "gpu-1", "containers": []}, status={"phase": "Running"}))
    cache.put_pod("a", obj("a-y", "7", spec={"containers": []}, status={"phase": "Pending"}))
    pods = {p["metadata"]["name"]: p for p in cache.pods("ns", "a")}
    assert pods["a-x"]["spec"] == {"nodeName": "gpu-1"} and pods["a-y"]["spec"] == {}
    assert cache.sizes() == {"finetunejobs": 0, "jobs": 1, "pods": 2, "workloads": 0}


def test_deletes_remove_only_what_they_name() -> None:
    cache = WatchCache()
    cache.put_job(obj("a", "5", uid="new"))
    cache.drop_job(obj("a", "4", uid="old"))  # the previous job of that name, collected late
    assert cache.job("ns", "a") is not None
    cache.drop_job(obj("a", "6", uid="new"))
    assert cache.job("ns", "a") is None
    cache.put_pod("a", obj("a-x", "6"))
    cache.drop_pod("a", obj("a-x", "7"))
    assert cache.pods("ns", "a") == [] and cache.sizes()["pods"] == 0
    cache.put_finetunejob(obj("a", "8"))
    cache.forget("ns", "a")
    assert cache.finetunejob("ns", "a") is None


def test_a_fresh_list_forgets_what_was_deleted_while_the_watch_was_away_but_not_what_is_newer() -> None:
    cache = WatchCache()
    cache.put_job(obj("kept", "10"))
    cache.put_job(obj("deleted", "11"))
    cache.put_job(obj("created-after-the-list", "30"))  # a create's reply, stored after the list
    other = obj("elsewhere", "12")
    other["metadata"]["namespace"] = "other-ns"
    cache.put_job(other)
    gone = cache.keep_listed_jobs([obj("kept", "10")], "ns", version="20")
    assert gone == [("ns", "deleted")]
    assert cache.job("ns", "kept") and cache.job("ns", "created-after-the-list") and cache.job("other-ns", "elsewhere")
    assert cache.job("ns", "deleted") is None

    cache.put_pod("train", obj("train-aaaaa", "10"))
    cache.put_pod("train", obj("train-bbbbb", "11"))
    cache.put_pod("solo", obj("solo-ccccc", "12"))
    touched = cache.keep_listed_pods([obj("train-aaaaa", "10")], None, version="20")
    assert sorted(touched) == [("ns", "solo"), ("ns", "train")]
    assert [p["metadata"]["name"] for p in cache.pods("ns", "train")] == ["train-aaaaa"]
    assert cache.pods("ns", "solo") == [] and cache.sizes()["pods"] == 1


def test_versions_that_are_not_plain_decimals_are_not_ordered() -> None:
    cache = WatchCache()
    cache.put_job(obj("a", "12", status={"active": 1}))
    cache.put_job(obj("a", "011", status={"succeeded": 1}))  # a leading zero: not an etcd revision
    held = cache.job("ns", "a")
    assert held is not None and held["status"] == {"succeeded": 1}
