"""`ftjob export NAME`: the export Job is the job's trainer pod less its GPUs, running
`--export-only`, owned by the FineTuneJob and invisible to the operator (no finetune.dev/job label)."""

import argparse

import pytest

from finetune_api.constants import LABEL_JOB
from finetune_api.contract import CONFIG_ANNOTATION, CONTAINER, EXPORT_ONLY_FLAG, TRAINER_COMMAND
from finetune_cli.errors import CliError
from finetune_cli.export import _formats
from finetune_cli.export_job import LABEL_EXPORT_OF, export_job, export_job_name
from finetune_cli.main import build_parser
from finetune_operator.builders.job import job as trainer_job
from hack.cluster.nodes import GPU_RESOURCE
from tests.support.specs import OWNER, SETTINGS, body, spec

GGUF = {"pvc": {"claimName": "outputs"}, "formats": ["gguf", "merged"]}


def fine_tune_job(**overrides: object) -> dict:
    meta = {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid}
    return {"metadata": meta, "spec": body(**overrides), "status": {"phase": "Succeeded"}}


def test_the_export_job_is_the_trainer_pod_without_gpus_running_export_only() -> None:
    trainer = trainer_job(OWNER, spec(output=GGUF, resources={"gpus": 1, "gpuProduct": "Tesla-P40"}), SETTINGS)
    built = export_job(fine_tune_job(output=GGUF), trainer, ["gguf"])
    pod, source = built["spec"]["template"]["spec"], trainer["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (trained,) = [c for c in source["containers"] if c["name"] == CONTAINER]
    assert container["command"] == [*TRAINER_COMMAND, EXPORT_ONLY_FLAG, "--formats", "gguf"]
    assert GPU_RESOURCE in trained["resources"]["limits"]
    assert not any("/" in name for kind in container["resources"].values() for name in kind)
    assert container["resources"]["limits"]["memory"] == trained["resources"]["limits"]["memory"]
    # The same image, environment, claims and config as the trainer's.
    assert (container["image"], container["env"]) == (trained["image"], trained["env"])
    assert container["volumeMounts"] == trained["volumeMounts"] and pod["volumes"] == source["volumes"]
    annotations = built["spec"]["template"]["metadata"]["annotations"]
    assert annotations[CONFIG_ANNOTATION] == trainer["spec"]["template"]["metadata"]["annotations"][CONFIG_ANNOTATION]
    assert pod["securityContext"] == source["securityContext"]
    assert (pod["restartPolicy"], pod["automountServiceAccountToken"]) == ("Never", False)
    assert "serviceAccountName" not in pod and built["spec"]["backoffLimit"] == 0
    # Owned by the FineTuneJob; the operator, which follows finetune.dev/job, never sees its pod.
    labels = built["spec"]["template"]["metadata"]["labels"]
    assert LABEL_JOB not in labels and labels[LABEL_EXPORT_OF] == OWNER.name
    (owner,) = built["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("FineTuneJob", OWNER.name, OWNER.uid)
    assert built["metadata"]["name"] == "tiny-export"


def test_a_long_name_keeps_the_export_job_name_within_63_characters() -> None:
    name = export_job_name("j" * 63)
    assert len(name) <= 63 and name.endswith("-export") and name != export_job_name("j" * 62 + "k")


def test_the_formats_asked_must_be_the_jobs() -> None:
    job = fine_tune_job(output=GGUF)
    assert _formats(job, []) == ["merged", "gguf"]
    assert _formats(job, ["gguf"]) == ["gguf"]
    with pytest.raises(CliError, match=r"^--format gguf-lora: not among the job's formats \(peft, merged, gguf\)$"):
        _formats(job, ["gguf-lora"])
    with pytest.raises(CliError, match="writes peft alone: there is nothing to export"):
        _formats(fine_tune_job(), [])


def test_the_command_takes_its_options() -> None:
    args = build_parser().parse_args(["export", "tiny", "--format", "gguf", "--format", "merged", "--no-wait"])
    assert isinstance(args, argparse.Namespace)
    assert (args.name, args.formats, args.no_wait) == ("tiny", ["gguf", "merged"], True)
