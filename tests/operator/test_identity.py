"""The namespace trainer identity is made on a namespace's first job and re-checked only now and then."""

import threading
import time

import pytest

from finetune_operator.identity import TrainerIdentities


def test_made_once_per_namespace_in_binding_last_order_and_checked_again_after_refresh():
    made: list[tuple[str, str]] = []
    identities = TrainerIdentities(lambda body: made.append((body["metadata"]["namespace"], body["kind"])), 60)
    identities.ensure("team-a")
    identities.ensure("team-a")
    identities.ensure("team-b")
    assert made == [
        ("team-a", "ServiceAccount"),
        ("team-a", "Role"),
        ("team-a", "RoleBinding"),
        ("team-b", "ServiceAccount"),
        ("team-b", "Role"),
        ("team-b", "RoleBinding"),
    ]
    stale = TrainerIdentities(lambda body: made.append((body["metadata"]["namespace"], body["kind"])), 0)
    made.clear()
    stale.ensure("team-a")
    stale.ensure("team-a")
    assert len(made) == 6  # an identity someone deleted comes back on the next job


def test_a_failed_create_is_not_remembered():
    calls = []

    def create(body):
        calls.append(body["kind"])
        if len(calls) == 2:
            raise OSError("API server away")

    identities = TrainerIdentities(create, 60)
    with pytest.raises(OSError):
        identities.ensure("team-a")
    identities.ensure("team-a")
    assert calls == ["ServiceAccount", "Role", "ServiceAccount", "Role", "RoleBinding"]


def test_jobs_that_arrive_while_the_identity_is_being_made_wait_for_it_instead_of_making_it_again():
    started, release = threading.Event(), threading.Event()
    made: list[str] = []

    def create(body):
        made.append(body["kind"])
        started.set()
        release.wait(5)

    identities = TrainerIdentities(create, 60)
    first = threading.Thread(target=identities.ensure, args=("team-a",))
    first.start()
    assert started.wait(5)
    others = [threading.Thread(target=identities.ensure, args=("team-a",)) for _ in range(8)]
    for thread in others:
        thread.start()
    time.sleep(0.1)
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    assert made == ["ServiceAccount", "Role", "RoleBinding"]
