"""The Job and pod streams on the real API server: list, then every change in order, a fresh
list when the server cannot resume, objects without the label never seen.

Exercised on ConfigMaps (any list function of the client works the same way) so the test owns
every object and event it sees.
"""

import threading
import uuid
from functools import partial
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_operator.kube import Kube
from finetune_operator.runtime.streams import Source, Stream, sources
from tests.support.harness import wait_for

pytestmark = pytest.mark.cluster

LABEL = "finetune.dev/job"


class Seen:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lists: list[tuple[list[str], str]] = []
        self._lock = threading.Lock()

    def event(self, kind: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((kind, body["metadata"]["name"]))

    def relisted(self, items: list[dict[str, Any]], version: str) -> None:
        with self._lock:
            self.lists.append((sorted(i["metadata"]["name"] for i in items), version))


def config_map(name: str, labelled: bool = True) -> dict[str, Any]:
    labels = {LABEL: name} if labelled else {}
    return {"metadata": {"name": name, "labels": labels}, "data": {"v": "1"}}


def test_a_stream_lists_then_delivers_every_change_in_order(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(namespace, config_map("before"))
    seen = Seen()
    source = Source("config maps", partial(core.list_namespaced_config_map, namespace), LABEL)
    stream = Stream(source, seen.event, seen.relisted).start()
    try:
        assert stream.listed.wait(30)
        assert seen.lists[0][0] == ["before"] and int(seen.lists[0][1]) > 0
        assert seen.events == [("ADDED", "before")]
        core.create_namespaced_config_map(namespace, config_map("unlabelled", labelled=False))
        core.create_namespaced_config_map(namespace, config_map("after"))
        core.patch_namespaced_config_map("after", namespace, {"data": {"v": "2"}})
        core.delete_namespaced_config_map("after", namespace)
        wait_for(lambda: len(seen.events) >= 4, 30, f"four events (have {seen.events})")
        assert seen.events == [("ADDED", "before"), ("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "after")]
    finally:
        stream.stop()


def test_a_stream_that_cannot_resume_lists_again_and_goes_on(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(namespace, config_map("first"))
    watches: list[dict[str, Any]] = []

    def gone_once(**kwargs: Any) -> Any:
        # Stand-in for a resume from a version the server no longer keeps (a fresh test control
        # plane still keeps them all): the first watch is answered 410 Gone, as the server does.
        if kwargs.get("watch"):
            watches.append(kwargs)
            if len(watches) == 1:
                raise ApiException(status=410, reason="Gone")
        return core.list_namespaced_config_map(namespace, **kwargs)

    seen = Seen()
    stream = Stream(Source("config maps", gone_once, LABEL), seen.event, seen.relisted).start()
    try:
        wait_for(lambda: len(seen.lists) >= 2, 30, "a second list")
        core.create_namespaced_config_map(namespace, config_map("second"))
        wait_for(lambda: ("ADDED", "second") in seen.events, 30, "the object created after the second list")
        assert [names for names, _ in seen.lists] == [["first"], ["first"]]
    finally:
        stream.stop()


def test_cluster_wide_sources_stream_jobs_and_pods_of_every_namespace(
    kube: client.ApiClient, core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str
) -> None:
    """The chart's default (`watch.mode: cluster`): one Job and one pod stream for all namespaces."""
    selector = f"finetune.dev/stream-test={uuid.uuid4().hex[:8]}"
    key, value = selector.split("=")
    other = f"{namespace[:50]}-b"
    core.create_namespace({"metadata": {"name": other, "labels": {"finetune.dev/test": "true"}}})
    job_sources, pod_sources = sources(Kube(kube), (), selector)
    assert len(job_sources) == len(pod_sources) == 1
    jobs_seen, pods_seen = Seen(), Seen()
    streams = [
        Stream(job_sources[0], jobs_seen.event, jobs_seen.relisted).start(),
        Stream(pod_sources[0], pods_seen.event, pods_seen.relisted).start(),
    ]
    container = {"name": "c", "image": "busybox", "command": ["true"]}
    try:
        assert all(s.listed.wait(30) for s in streams)
        batch.create_namespaced_job(
            other,
            {
                "metadata": {"name": "suspended", "labels": {key: value}},
                "spec": {
                    "suspend": True,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
                },
            },
        )
        core.create_namespaced_pod(
            namespace, {"metadata": {"name": "bare", "labels": {key: value}}, "spec": {"containers": [container]}}
        )
        wait_for(lambda: ("ADDED", "suspended") in jobs_seen.events, 30, "the Job in the second namespace")
        wait_for(lambda: ("ADDED", "bare") in pods_seen.events, 30, "the pod in the first namespace")
        assert {name for _, name in jobs_seen.events} == {"suspended"}
        assert {name for _, name in pods_seen.events} == {"bare"}
    finally:
        for stream in streams:
            stream.stop()
        core.delete_namespace(other, propagation_policy="Background")
