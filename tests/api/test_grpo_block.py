"""GRPO's settings block (finetune_api.objectives.grpo): registered with the objectives, read as
the trainer reads it, and its http rewards' URLs read as the Services of the job's namespace
they name (finetune_api.services). The wrong specs both sides refuse are in
tests/support/api_cases.py; the trainer's side of the block in tests/trainer/test_grpo_api.py."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.objectives import OBJECTIVES, dataset_formats, services_of
from finetune_api.objectives.grpo import GRPO, GrpoSpec
from finetune_api.services import ServiceUrl, outside, read_url
from finetune_api.spec import FineTuneJobSpec, TrainingSpec
from finetune_cli.main import main
from tests.support.api_cases import GRPO_REWARD, grpo_with, tiny_with

JUDGE = {"name": "judge", "weight": 0.5, "http": {"url": "http://judge:8080/score"}}


def _spec(**grpo: Any) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate(tiny_with(grpo_with(grpo))["spec"])


def test_the_objectives_package_registers_grpo_and_its_prompt_format() -> None:
    assert OBJECTIVES.get("grpo") is GRPO
    assert "prompt" in dataset_formats() and list(GRPO.dataset_formats) == ["prompt"]
    assert GRPO.settings is GrpoSpec and not GRPO.packs
    assert GRPO.trainer == "finetune_trainer.objectives.grpo.objective:Grpo"


def test_the_rules_default_max_length_is_the_specs() -> None:
    """The maxCompletionLength rule's CEL side spells training.maxLength's default."""
    assert f": {TrainingSpec().max_length})" in GRPO.rules[-1].cel


def test_the_block_gives_the_trainers_settings_and_rewards_in_their_shapes() -> None:
    block = _spec(rewards=[GRPO_REWARD, {"name": "tidy", "weight": 0.2, "format": {"pattern": "^<think>"}}, JUDGE])
    settings = block.training.settings_of(GrpoSpec)
    assert settings.as_settings() == {
        "num_generations": 8,
        "max_completion_length": 16,
        "temperature": 1.0,
        "top_p": 1.0,
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": None,
        "num_iterations": 1,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "use_bias_correction_kl": True,
    }
    assert settings.reward_settings() == [
        {"name": "right", "weight": 1.0, "answer": {"field": "answer", "pattern": "answer is (\\d+)"}},
        {"name": "tidy", "weight": 0.2, "format": {"pattern": "^<think>"}},
        {
            "name": "judge",
            "weight": 0.5,
            "http": {"url": "http://judge:8080/score", "timeoutSeconds": 30.0, "batchSize": 64},
        },
    ]


@pytest.mark.parametrize(
    ("url", "service", "namespace", "port"),
    [
        ("http://judge/score", "judge", None, 80),
        ("http://judge.team-a:8080/score", "judge", "team-a", 8080),
        ("https://judge.team-a.svc/v1/score?strict=1", "judge", "team-a", 443),
        ("http://judge.team-a.svc.cluster.local:9000", "judge", "team-a", 9000),
    ],
)
def test_each_host_form_names_a_service_its_namespace_and_port(
    url: str, service: str, namespace: str | None, port: int
) -> None:
    said = read_url("f", "a reward service", url)
    assert (said.service, said.namespace, said.port) == (service, namespace, port)
    assert said.namespace_in("team-a") == "team-a"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://judge/score",
        "http://10.0.0.7/score",
        "http://Judge/score",
        "http://judge.team-a.svc.other.domain/",
        "http://judge:0/",
        "http://judge:65536/",
        "http://user@judge/",
        "http://judge/a b",
    ],
)
def test_a_url_of_no_service_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="expected an http:// or https:// URL of a Service"):
        read_url("f", "a reward service", url)


def test_the_services_of_a_job_are_its_http_rewards_with_their_fields() -> None:
    spec = _spec(rewards=[GRPO_REWARD, JUDGE, {"name": "other", "http": {"url": "http://scorer.team-b/x"}}])
    assert services_of(spec.training) == (
        ServiceUrl("spec.training.grpo.rewards[1].http.url", "a reward service", "judge", None, 8080),
        ServiceUrl("spec.training.grpo.rewards[2].http.url", "a reward service", "scorer", "team-b", 80),
    )
    # judge names no namespace: it is the job's, wherever the job is.
    assert outside(services_of(spec.training), "team-b") is None
    assert outside(services_of(spec.training), "team-a") == (
        "spec.training.grpo.rewards[2].http.url: a reward service must be in the job's namespace (team-a), not team-b"
    )
    assert services_of(FineTuneJobSpec.model_validate(tiny_with({})["spec"]).training) == ()


def _manifest(tmp_path: Path, namespace: str | None) -> Path:
    body = tiny_with(grpo_with({"rewards": [{"name": "judge", "http": {"url": "http://judge.team-a:8080/score"}}]}))
    if namespace is not None:
        body["metadata"]["namespace"] = namespace
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_ftjob_validate_refuses_a_reward_service_of_another_namespace_when_the_manifest_names_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for namespace in (None, "team-a"):
        assert main(["validate", str(_manifest(tmp_path, namespace))]) == 0
    path = _manifest(tmp_path, "team-b")
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{path}: spec.training.grpo.rewards[0].http.url: a reward service must be in the job's namespace "
        "(team-b), not team-a"
    )
