"""What a ModelServer loads, found through its namespace's jobs and claims (finetune_api.served_files):
the pod's paths and the adapters' ids, and each refusal in one line naming the field. The jobs are
the bodies the operator writes (its status.output from the builders), with the trainer's fingerprint."""

from typing import Any

import pytest

from finetune_api.served_files import resolve
from finetune_api.server_spec import ModelServerSpec
from tests.support.server_cases import job

NS = "team-a"


def server(base: dict[str, Any], *adapters: dict[str, Any]) -> ModelServerSpec:
    return ModelServerSpec.model_validate({"base": base, "adapters": list(adapters)})


def test_a_servable_server_loads_each_jobs_files_by_their_pod_paths_with_ids_in_order() -> None:
    jobs = {"a": job("a"), "b": job("b")}
    gguf = {"pvc": {"claimName": "models", "path": "shared/extra.gguf"}}
    found = resolve(server({"job": "a"}, {"job": "a"}, {"job": "b"}, gguf), NS, jobs, {"outputs", "models"})
    assert found.problems == []
    assert found.base is not None and found.base.status() == {
        "claimName": "outputs",
        "path": "/mnt/claims/outputs/runs/a/gguf/base-f16.gguf",
        "job": "a",
    }
    assert [a.status() for a in found.adapters] == [
        {"id": 0, "claimName": "outputs", "path": "/mnt/claims/outputs/runs/a/gguf/adapter-f16.gguf", "job": "a"},
        {"id": 1, "claimName": "outputs", "path": "/mnt/claims/outputs/runs/b/gguf/adapter-f16.gguf", "job": "b"},
        {"id": 2, "claimName": "models", "path": "/mnt/claims/models/shared/extra.gguf"},
    ]
    assert found.claims == ["outputs", "models"]


@pytest.mark.parametrize(
    ("adapter", "said"),
    [
        (job("b", phase="Running"), "spec.adapters[0].job: job b is Running, not Succeeded: a server loads only a "
         "finished job's files"),
        (job("b", phase="Failed"), "spec.adapters[0].job: job b is Failed, not Succeeded"),
        (job("b", formats=["peft", "merged"]), "spec.adapters[0].job: job b does not write gguf-lora (its "
         "spec.output.formats: peft, merged), the GGUF adapter and base a server loads"),
        (job("b", exported="gguf-lora: the converter failed"), "spec.adapters[0].job: job b did not write gguf-lora "
         "(gguf-lora: the converter failed), and `ftjob export b` writes it"),
        (job("b", fingerprint="bbbb"), "spec.adapters[0].job: job b was trained on another base than spec.base "
         "(job a): model fingerprint bbbb against aaaa"),
        (None, "spec.adapters[0].job: FineTuneJob 'b' not found in namespace 'team-a'"),
    ],
    ids=["running", "failed", "no gguf-lora", "export failed", "other base", "missing"],
)  # fmt: skip
def test_each_refusal_is_one_line_naming_the_adapters_field(adapter: dict[str, Any] | None, said: str) -> None:
    found = resolve(server({"job": "a"}, {"job": "b"}), NS, {"a": job("a"), "b": adapter}, {"outputs"})
    assert [str(p) for p in found.problems] == [said] or str(found.problems[0]).startswith(said), found.problems
    assert len(found.problems) == 1
    assert ";" not in str(found.problems[0]), "the status joins refusals with '; '"


def test_a_claim_the_namespace_does_not_have_is_named_by_its_field() -> None:
    gguf = {"pvc": {"claimName": "theirs", "path": "a.gguf"}}
    found = resolve(server({"job": "a"}, gguf), NS, {"a": job("a")}, {"outputs"})
    assert [str(p) for p in found.problems] == [
        "spec.adapters[0].pvc.claimName: claim 'theirs' not found in namespace 'team-a' (a server mounts only "
        "claims of its own namespace)"
    ]
    gone = resolve(server({"job": "a"}), NS, {"a": job("a")}, set())
    assert [str(p) for p in gone.problems] == [
        "spec.base.job: job a's output claim 'outputs' not found in namespace 'team-a' (a server mounts only "
        "claims of its own namespace)"
    ]
    unchecked = resolve(server({"job": "a"}, gguf), NS, {"a": job("a")}, None)
    assert unchecked.problems == []


def test_with_a_file_for_base_the_first_fingerprinted_adapter_is_the_reference() -> None:
    base = {"pvc": {"claimName": "models", "path": "base.gguf"}}
    jobs = {"a": job("a", fingerprint=None), "b": job("b", fingerprint="bbbb"), "c": job("c", fingerprint="cccc")}
    found = resolve(server(base, {"job": "a"}, {"job": "b"}, {"job": "c"}), NS, jobs, None)
    assert [str(p) for p in found.problems] == [
        "spec.adapters[2].job: job c was trained on another base than spec.adapters[1] (job b): model fingerprint "
        "cccc against bbbb"
    ]


def test_every_problem_of_a_server_is_said_not_only_the_first() -> None:
    jobs = {"a": job("a", phase="Running"), "b": job("b", formats=["peft"])}
    found = resolve(server({"job": "a"}, {"job": "a"}, {"job": "b"}), NS, jobs, {"outputs"})
    assert [p.path for p in found.problems] == ["spec.base.job", "spec.adapters[0].job", "spec.adapters[1].job"]
