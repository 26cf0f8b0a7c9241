"""The trainer image allow-list rule (finetune_api/images.py): the cases here are also sent to the real API
server against the fence policy's CEL form of the rule (tests/security/test_fence.py), so the
operator and admission cannot disagree on them."""

import pytest

from finetune_api import images
from finetune_api.constants import DEFAULT_IMAGE
from finetune_operator.decide import image_refusal
from finetune_operator.settings import Settings
from tests.support.images import CASES, PATTERNS
from tests.support.specs import spec


@pytest.mark.parametrize(("image", "expected"), CASES)
def test_patterns_allow_a_repository_a_prefix_or_one_image(image: str, expected: bool) -> None:
    assert images.allowed(image, PATTERNS) is expected


def test_a_lone_star_allows_everything_and_an_empty_list_nothing() -> None:
    assert images.allowed("anything.example/x:y", ("*",))
    assert not images.allowed(DEFAULT_IMAGE, ())


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("ghcr.io/a/b:1", "ghcr.io/a/b"),
        ("localhost:5000/a/b:1", "localhost:5000/a/b"),
        ("localhost:5000/a/b", "localhost:5000/a/b"),
        ("ghcr.io/a/b:1@sha256:" + "0" * 64, "ghcr.io/a/b"),
    ],
)
def test_repository_drops_tag_and_digest_but_keeps_a_registry_port(image: str, repository: str) -> None:
    assert images.repository(image) == repository


def test_the_default_list_allows_the_default_image() -> None:
    assert images.allowed(DEFAULT_IMAGE, images.DEFAULT_ALLOWED_IMAGES)


@pytest.mark.parametrize("pattern", ["", " x", "reg/*/trainer"])
def test_unusable_patterns_are_named(pattern: str) -> None:
    assert images.pattern_problem(pattern) is not None


def test_a_job_outside_the_list_is_refused_naming_the_field_and_the_list() -> None:
    settings = Settings(allowed_images=PATTERNS)
    assert image_refusal(spec(image="registry.example.com/ml/t:1"), settings) is None
    refused = image_refusal(spec(image="docker.io/evil/miner:latest"), settings)
    assert refused is not None
    assert refused.startswith("spec.image: 'docker.io/evil/miner:latest' is not in the trainer image allow-list")
    assert all(p in refused for p in PATTERNS)
    # No spec.image: the operator's default, which settings.check keeps inside the list.
    assert image_refusal(spec(image=None), Settings()) is None
