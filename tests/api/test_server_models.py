"""The ModelServer's models: `ftjob validate` refuses each wrong server in one line naming the
field, the CRD is what they generate (structural, bounded), and the reference in docs/api.md is
current. The same wrong servers go through the API server in test_server_admission.py."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api import parse_file, server_crd
from finetune_api.constants import KIND, SERVER_KIND
from finetune_api.generate import SERVER_TARGETS, stale_targets
from finetune_api.reference import SERVER_BEGIN, SERVER_END
from finetune_api.server_spec import ModelServerSpec
from finetune_cli.main import main
from tests.support.server_cases import SERVER, WRONG_SERVERS, server_with

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, body: dict[str, Any]) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """These are the checks without a cluster: `ftjob validate` finds no kubeconfig."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


@pytest.mark.parametrize(("case", "change", "meta", "line", "_"), WRONG_SERVERS, ids=[c[0] for c in WRONG_SERVERS])
def test_a_wrong_server_is_refused_in_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, change: Any, meta: Any, line: str, _: str
) -> None:
    path = _write(tmp_path, server_with(change, meta))
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: {line}"), lines


def test_a_valid_server_says_what_went_unchecked_without_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, SERVER)
    assert main(["validate", str(path)]) == 0
    valid, note = capsys.readouterr().out.splitlines()
    assert valid == f"{path}: valid"
    assert note.startswith(f"{path}: note: not checked on a cluster (no kubeconfig found")
    assert note.endswith("): the adapters' jobs and the claims")


def test_only_validate_takes_a_model_server(tmp_path: Path) -> None:
    path = _write(tmp_path, SERVER)
    (doc,) = parse_file(path, (KIND, SERVER_KIND))
    assert doc.server is not None and doc.job is None and not doc.problems
    (doc,) = parse_file(path)  # what submit, run and plan read: FineTuneJobs alone
    assert [str(p) for p in doc.problems] == [
        "expected apiVersion finetune.dev/v1alpha1 and kind FineTuneJob, got 'finetune.dev/v1alpha1' / 'ModelServer'"
    ]


def test_the_defaults_serve_one_p40_with_four_slots() -> None:
    spec = ModelServerSpec.model_validate({"base": {"job": "a"}})
    assert (spec.resources.gpus, spec.resources.gpu_product, spec.replicas) == (1, "Tesla-P40", 1)
    assert (spec.context_size, spec.parallel, spec.adapters) == (4096, 4, [])


def test_the_committed_crds_and_the_reference_are_current() -> None:
    assert not stale_targets(server_crd.render_yaml(), SERVER_TARGETS), "run `make crds`"
    assert len({t.read_text() for t in SERVER_TARGETS}) == 1
    page = (ROOT / "docs" / "api.md").read_text()
    block = page[page.index(SERVER_BEGIN) : page.index(SERVER_END)]
    for field in ("`base.job`", "`adapters[].pvc.path`", "`resources.gpus`", "`contextSize`", "`parallel`"):
        assert field in block, field


def _walk(node: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, value in node.get("properties", {}).items():
        out.extend(_walk(value, f"{path}.{key}"))
    if isinstance(node.get("items"), dict):
        out.extend(_walk(node["items"], f"{path}[]"))
    return out


def test_the_schema_is_structural_and_bounded() -> None:
    schema = server_crd.openapi_schema()
    for part in ("spec", "status"):
        for path, node in _walk(schema["properties"][part], part):
            assert "$ref" not in node and "title" not in node, path
            assert "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
            if node.get("type") == "string" and "enum" not in node:
                assert "maxLength" in node, f"{path} is an unbounded string"
            if node.get("type") == "array":
                assert "maxItems" in node, f"{path} is an unbounded list"
    names = server_crd.crd()["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("ModelServer", "modelservers", ["ms"])
