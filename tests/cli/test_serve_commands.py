"""`ftjob serve`, `ftjob chat` and `ftjob status` of a ModelServer, without a cluster: the manifest
serve writes (and validate takes), the request chat sends, the lines status prints, and one-line
errors. On the cluster they run in tests/operator/test_e2e_serving.py."""

import argparse
from typing import Any

import pytest
import yaml

from finetune_cli.chat import request_body, service_name, token_ids
from finetune_cli.errors import CliError
from finetune_cli.main import main
from finetune_cli.servers import adapter_id, describe
from tests.support.cli import assert_one_line_error, ftjob

SERVER: dict[str, Any] = {
    "metadata": {"name": "support", "namespace": "team-a"},
    "spec": {"replicas": 1},
    "status": {
        "phase": "Ready",
        "readyReplicas": 1,
        "endpoint": "http://support-server.team-a.svc:8080",
        "base": {"claimName": "outputs", "path": "/mnt/claims/outputs/en/gguf/base-q8_0.gguf", "job": "en"},
        "adapters": [
            {"id": 0, "claimName": "outputs", "path": "/mnt/claims/outputs/en/gguf/adapter-f16.gguf", "job": "en"},
            {"id": 1, "claimName": "models", "path": "/mnt/claims/models/de.gguf"},
        ],
    },
}


def test_serve_writes_a_server_of_the_jobs_on_the_first_ones_base(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "support", "--adapter", "en", "--adapter", "de", "--gpus", "1", "--parallel", "8"]) == 0
    body = yaml.safe_load(capsys.readouterr().out)
    assert body == {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "ModelServer",
        "metadata": {"name": "support"},
        "spec": {
            "base": {"job": "en"},
            "adapters": [{"job": "en"}, {"job": "de"}],
            "resources": {"gpus": 1},
            "parallel": 8,
        },
    }


def test_serve_refuses_in_one_line_what_the_models_refuse() -> None:
    done = ftjob("serve", "support", "--adapter", "en", "--context-size", "512", "--parallel", "8")
    assert_one_line_error(done, "spec: contextSize / parallel (each slot's context) must be at least 128 tokens",
                          "(nothing written)")  # fmt: skip
    assert_one_line_error(ftjob("serve", "7b", "--adapter", "en"), "metadata.name:")
    assert_one_line_error(ftjob("serve", "support"), "name the adapters' jobs with --adapter JOB")


def _args(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"adapter": None, "prompt": "hi", "max_tokens": 8, "temperature": 0.0,
                                 "output": "text", **given})  # fmt: skip


def test_chat_picks_the_adapter_by_job_or_id_and_none_is_the_base() -> None:
    assert request_body(SERVER, _args(adapter="en"))["lora"] == [{"id": 0, "scale": 1.0}]
    assert request_body(SERVER, _args(adapter="1"))["lora"] == [{"id": 1, "scale": 1.0}]
    plain = request_body(SERVER, _args())
    assert plain["lora"] == [] and plain["temperature"] == 0.0 and "logprobs" not in plain
    assert request_body(SERVER, _args(output="tokens"))["logprobs"] is True
    assert service_name(SERVER) == "support-server"
    with pytest.raises(CliError, match=r"^modelserver support serves no adapter 'fr' \(its adapters: 0 \(en\), 1 "):
        adapter_id(SERVER, "fr")
    reply = {"choices": [{"logprobs": {"content": [{"id": 7, "token": "a"}, {"id": 9, "token": "b"}]}}]}
    assert token_ids(reply) == [7, 9]


def test_status_shows_the_endpoint_and_each_adapters_id() -> None:
    lines = describe(SERVER).splitlines()
    assert "Phase:       Ready" in lines
    assert (
        "Endpoint:    http://support-server.team-a.svc:8080/v1  (OpenAI API; `ftjob chat support` from here)" in lines
    )
    assert "  id 0: job en, /mnt/claims/outputs/en/gguf/adapter-f16.gguf" in lines
    assert "  id 1: file, /mnt/claims/models/de.gguf" in lines
