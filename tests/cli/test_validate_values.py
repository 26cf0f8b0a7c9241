"""`ftjob validate --values`: a job's image against the chart's allow-list, before it is sent."""

from pathlib import Path

import yaml

from tests.support.cli import REPO, assert_one_line_error, ftjob

EXAMPLE_TINY = REPO / "examples" / "tiny-job.yaml"
CHART_VALUES = REPO / "charts" / "finetune-operator" / "values.yaml"


def _job(tmp_path: Path, image: str | None) -> str:
    body = yaml.safe_load(EXAMPLE_TINY.read_text())
    body["spec"].pop("image", None)
    if image is not None:
        body["spec"]["image"] = image
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_an_image_outside_the_charts_allow_list_is_refused_as_the_operator_refuses_it(tmp_path: Path) -> None:
    evil = _job(tmp_path, "docker.io/evil/miner:latest")
    result = ftjob("validate", evil, "--values", str(CHART_VALUES))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.strip() == (
        f"{evil}: ImageNotAllowed: spec.image: 'docker.io/evil/miner:latest' is not in the trainer image "
        "allow-list (ghcr.io/finetune-operator/trainer)"
    )
    # Without --values nothing is known of the cluster's list: the spec alone is valid.
    assert ftjob("validate", evil).returncode == 0


def test_the_charts_default_image_and_a_wider_list_are_read_from_the_values(tmp_path: Path) -> None:
    assert ftjob("validate", _job(tmp_path, None), "--values", str(CHART_VALUES)).returncode == 0
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "image": "registry.example.com/ml/trainer:1",
                    "allowedImages": ["registry.example.com/ml/*"],
                }
            }
        )
    )
    # Unset spec.image: the chart's trainer.image, which this list allows; the chart's own image is not.
    assert ftjob("validate", _job(tmp_path, None), "--values", str(values)).returncode == 0
    refused = ftjob("validate", _job(tmp_path, "ghcr.io/finetune-operator/trainer:0.1.0"), "--values", str(values))
    assert refused.returncode == 1 and "ImageNotAllowed" in refused.stdout


def test_a_bad_values_file_is_one_line(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"trainer": {"allowedImages": ["reg/*/x"]}}))
    result = ftjob("validate", _job(tmp_path, None), "--values", str(values))
    assert_one_line_error(result, "trainer.allowedImages pattern 'reg/*/x': `*` is allowed only at the end")
