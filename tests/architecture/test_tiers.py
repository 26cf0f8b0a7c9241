"""The tiers (tests/support/tiers.py): a test's marker follows from what it needs, `make test-fast`
never imports torch nor starts a binary built from source, and the guards that hold it to that
fire on a planted import, a planted run of a cached binary and a planted build."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hack.cluster import binaries
from tests.support import tiers

REPO = Path(__file__).resolve().parents[2]


def test_a_module_importing_torch_through_the_trainer_is_trainer_tier() -> None:
    chain = tiers.heavy_chain(REPO / "tests" / "trainer" / "test_hardware.py")
    assert chain is not None and chain[0] == "finetune_trainer.hardware.capabilities" and chain[-1] == "torch"
    assert tiers.heavy_chain(REPO / "tests" / "planning" / "test_memory.py") is None


def test_imports_inside_functions_and_for_the_type_checker_do_not_count(tmp_path: Path) -> None:
    module = tmp_path / "test_lazy.py"
    module.write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                import torch
            def test_x():
                import transformers
            """
        )
    )
    assert tiers.heavy_chain(module) is None
    module.write_text("try:\n    import peft\nexcept ImportError:\n    peft = None\n")
    tiers._CHAINS.clear()
    assert tiers.heavy_chain(module) == ("peft",)


@pytest.mark.parametrize(
    ("markexpr", "skipped"),
    [
        ("fast", True),
        ("not trainer", True),
        ("not cluster and not trainer", True),
        ("cluster", False),  # a trainer-tier module may hold cluster tests
        ("not gpu and not soak", False),
        ("gpu", False),
        ("", False),
    ],
)
def test_a_trainer_tier_module_is_not_imported_only_where_none_of_its_tests_can_match(
    markexpr: str, skipped: bool
) -> None:
    assert tiers.skippable(markexpr, REPO / "tests" / "trainer" / "test_hardware.py") is skipped
    assert not tiers.skippable(markexpr, REPO / "tests" / "planning" / "test_memory.py")


def test_tiers_follow_needs() -> None:
    light = REPO / "tests" / "planning" / "test_memory.py"
    heavy = REPO / "tests" / "trainer" / "test_hardware.py"
    assert tiers.tiers_of(set(), ["tmp_path"], light) == {"fast"}
    assert tiers.tiers_of(set(), ["namespace", "cluster"], light) == {"cluster"}
    assert tiers.tiers_of({"parametrize"}, [], heavy) == {"trainer"}
    assert tiers.tiers_of({"soak"}, ["cluster"], light) == {"soak", "cluster"}
    assert tiers.tiers_of(set(), ["tmp_path", "helm_binary"], light) == {"tools"}
    assert tiers.tiers_of(set(), ["promtool_binary", "helm_binary"], light) == {"tools"}
    # MinIO's server: a test that only reads a bucket is a tools test, never a fast one.
    assert tiers.tiers_of(set(), ["s3", "object_store"], light) == {"tools"}


def test_a_built_binary_is_told_from_what_a_fast_test_may_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    helm = tmp_path / "cache" / binaries.HELM.folder / "helm"
    helm.parent.mkdir(parents=True)
    elsewhere = tmp_path / "another-cache" / "kubectl"  # the checkout's link into another cache
    elsewhere.parent.mkdir()
    for binary in (helm, elsewhere):
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    linked = tmp_path / "checkout" / ".cache" / "cluster" / "bin"
    linked.mkdir(parents=True)
    (linked / "kubectl").symlink_to(elsewhere)
    path = f"{linked}{os.pathsep}{os.environ['PATH']}"

    assert tiers.built_binary(str(helm), [str(helm), "template"]) == f"{binaries.HELM.folder}/helm"
    assert tiers.built_binary(None, ["kubectl", "get", "pods"], {"PATH": path}) == "kubectl"
    assert tiers.built_binary("/bin/sh", ["/bin/sh", "-c", f"{helm} lint charts/x"]) == f"{binaries.HELM.folder}/helm"
    assert tiers.built_binary(None, ["go", "install", "helm.sh/helm/v3/cmd/helm"]) == "go"
    # A build that writes into the cache, wherever its program lives: llama.cpp's sdist by pip.
    download = [sys.executable, "-m", "pip", "download", "-d", str(tmp_path / "cache" / "llama-cpp-python")]
    assert tiers.built_binary(sys.executable, download) == "llama-cpp-python"
    # What a fast test does run: Python, the CLI, a shell's syntax check, hadolint from the venv.
    assert tiers.built_binary(sys.executable, [sys.executable, "-m", "finetune_cli", "plan", "job.yaml"]) is None
    assert tiers.built_binary(None, ["sh", "-n"]) is None
    assert tiers.built_binary(None, ["hadolint", "--no-color", "Dockerfile"], {"PATH": str(tmp_path)}) is None


def _fast(*paths: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "fast", "-q", "-p", "no:cacheprovider", "-rA", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_the_fast_tier_collects_without_importing_torch(request: pytest.FixtureRequest) -> None:
    if tiers.excludes_trainer(request.config.option.markexpr or ""):
        # This session is such a run (`make test-fast`): its own collection was held to it by
        # tests/conftest.py (a torch import there stops the session), so it is not run twice.
        assert "torch" not in sys.modules
        assert all(item.get_closest_marker("fast") for item in request.session.items)
        return
    result = _fast("--collect-only")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "deselected" in result.stdout


PLANTED = """
from tests.support.helm import helm
from tests.support.promtool import promtool_binary


def test_imports_torch_lazily():
    import torch  # noqa: F401


def test_runs_helm_unasked():
    helm("version")


def test_builds_promtool_unasked():
    promtool_binary()


def test_catches_the_refusal():
    try:
        helm("version")
    except RuntimeError:
        pass


import pytest


@pytest.mark.usefixtures("helm_binary")
def test_asks_for_helm():
    helm("version")
"""


# The trainer tier's, by hand: its own fast run imports torch in a child (the planted test does),
# seconds of CPU that the fast tier, which promises never to load torch, must not spend.
@pytest.mark.trainer
def test_fast_tests_that_import_torch_or_start_a_built_binary_error_naming_themselves(tmp_path: Path) -> None:
    """On a new machine's empty cache, with a helm there that records any run: the fast tests
    that import torch, run that helm (the refusal caught or not) or would build promtool error,
    each named; none ran helm or started a build; the test that asks for helm by its fixture is
    not in the fast tier at all."""
    cache = tmp_path / "cache"
    ran = tmp_path / "helm-ran"
    helm = cache / binaries.HELM.folder / "helm"
    helm.parent.mkdir(parents=True)
    helm.write_text(f"#!/bin/sh\ntouch {ran}\n")
    helm.chmod(0o755)
    planted = REPO / "tests" / "architecture" / "test_zz_planted_needs.py"
    planted.write_text(PLANTED)
    try:
        result = _fast(str(planted.relative_to(REPO)), env={"FINETUNE_CACHE": str(cache), "HELM": ""})
    finally:
        planted.unlink()
    said = result.stdout
    assert result.returncode != 0
    assert "test_imports_torch_lazily" in said and "imported torch" in said, said[-3000:]
    for test, started in [
        ("test_runs_helm_unasked", f"{binaries.HELM.folder}/helm"),
        ("test_builds_promtool_unasked", "go"),
        ("test_catches_the_refusal", f"{binaries.HELM.folder}/helm"),
    ]:
        assert f"the fast test tests/architecture/test_zz_planted_needs.py::{test} started {started}:" in said, said
    assert "1 deselected" in said, said[-1000:]
    assert not ran.exists(), "the fast tier ran a built helm"
    assert not (cache / binaries.PROMTOOL.folder / "promtool").exists()
