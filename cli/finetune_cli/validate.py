"""`ftjob validate FILE... [--model-config PATH]`: check FineTuneJob manifests offline with the API
models, and what the operator checks before it makes a pod.

With `--model-config` (the model's config.json or its folder) each job is also checked against
the model: a family the trainer does not train, or a `lora.targetModules` name missing from its
decoder layers, is one line and exit 1, as the trainer would refuse it at start. A
`resources.memory` below the pod's planned host memory (for a model the planner knows by name, or
the one given) is refused as the operator refuses it.

With `--values` (the chart's values file of the cluster the job is for) each job's image (its
`spec.image`, or the chart's `trainer.image` when unset) is checked against the chart's
`trainer.allowedImages`, as the operator checks it: outside the list is `ImageNotAllowed`, exit 1.

A ModelServer is checked by its models, and, where a cluster is reachable (the kubeconfig, as the
cluster commands find it), against what it names there as the operator checks it: an adapter's
job not Succeeded, without gguf-lora or trained on another base, a claim the namespace lacks, one
line each naming the field, exit 1. Without a cluster a note says what was not checked.

Exit status: 0 valid, 1 a problem with the spec, the model or the image, 3 valid but the pod's
memory would not hold its trainers.
"""

import argparse
from pathlib import Path
from typing import Any

import yaml

from finetune_api import ManifestError, ParsedDocument, images, parse_file
from finetune_api.constants import DEFAULT_IMAGE, KIND, SERVER_KIND
from finetune_api.formats.peft import lora_rank_warning
from finetune_api.problems import format_problems
from finetune_plan.pod import memory_refusal, pod_plan

from . import kube
from .claim_paths import path_problems
from .errors import CliError
from .family import family_line
from .plan import read_json

DOES_NOT_FIT = 3


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "validate",
        help="check FineTuneJob and ModelServer YAML files",
        description="Check FineTuneJob and ModelServer YAML files with the same models the CRDs are generated from: "
        "`FILE: spec.path: message` per problem, exit 1. With --values, each job's image (or the chart's "
        "trainer.image when unset) against trainer.allowedImages: `FILE: ImageNotAllowed: ...`, exit 1. "
        "For a model the planner knows by name, a resources.memory below the pod's host figure: "
        "`FILE: WontFit: ...`, exit 3 (what the operator would refuse). With --model-config, also its "
        "family and lora.targetModules (see Model families), exit 1. With --volumes, the model and dataset "
        "paths as the operator's input check finds them: `FILE: spec.dataset: claim 'C', path 'P': ...`, exit 1. "
        "A ModelServer is also checked on the cluster where one is reachable, as the operator checks it: its "
        "adapters' jobs (Succeeded, with gguf-lora, on the server's base) and its claims, exit 1.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument(
        "--model-config", metavar="PATH", help="the model's config.json (or its folder): also check its family"
    )
    parser.add_argument(
        "--volumes",
        metavar="DIR",
        help="folder holding PVCs as DIR/<claimName>/: also check that the model and dataset paths are there",
    )
    parser.add_argument(
        "--values",
        metavar="PATH",
        help="the chart's values file: also check each job's image against trainer.allowedImages",
    )
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def read_allow_list(path: Path) -> tuple[str, tuple[str, ...]]:
    """(default trainer image, allowed image patterns) from a chart values file; the chart's own
    defaults for what it leaves out."""
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"--values {path}: {str(exc).splitlines()[0]}") from None
    trainer = values.get("trainer") if isinstance(values, dict) else None
    trainer = trainer if isinstance(trainer, dict) else {}
    image = trainer.get("image", DEFAULT_IMAGE)
    patterns = trainer.get("allowedImages", list(images.DEFAULT_ALLOWED_IMAGES))
    if not isinstance(image, str) or not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise CliError(f"--values {path}: trainer.image must be a string and trainer.allowedImages a list of strings")
    for pattern in patterns:
        if problem := images.pattern_problem(pattern):
            raise CliError(f"--values {path}: trainer.allowedImages pattern {pattern!r}: {problem}")
    return image, tuple(patterns)


def image_problems(path: str, documents: list[ParsedDocument], allow_list: tuple[str, tuple[str, ...]]) -> list[str]:
    """`FILE: ImageNotAllowed: ...` lines for jobs whose image the operator would refuse."""
    default, patterns = allow_list
    lines = []
    for doc in documents:
        if doc.job is None:
            continue
        image = doc.job.spec.image or default
        if not images.allowed(image, patterns):
            lines.append(f"{_source(path, documents, doc)}: ImageNotAllowed: {images.refusal(image, patterns)}")
    return lines


KINDS = (KIND, SERVER_KIND)


def validate_file(path: str, model_config: dict[str, Any] | None = None, notes: list[str] | None = None) -> list[str]:
    """Problems as `FILE: spec.path: message` lines; empty when the file is valid. With a model
    config, `notes` gets what the trainer will do with it (family, kernel, targets) per job."""
    try:
        documents = parse_file(path, KINDS)
    except ManifestError as exc:
        return [f"{path}: {exc}"]
    return spec_problems(path, documents, model_config, notes)


def _source(path: str, documents: list[ParsedDocument], doc: ParsedDocument) -> str:
    return path if len(documents) == 1 else f"{path}[{doc.index}]"


def spec_problems(
    path: str,
    documents: list[ParsedDocument],
    model_config: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> list[str]:
    lines: list[str] = []
    for doc in documents:
        source = _source(path, documents, doc)
        lines.extend(format_problems(doc.problems, source))
        if model_config is not None and doc.job is not None:
            try:
                line = family_line(model_config, doc.job.spec.lora.target_modules)
            except CliError as exc:
                lines.append(f"{source}: {exc}")
            else:
                if notes is not None:
                    notes.append(line)
    return lines


def fit_problems(path: str, documents: list[ParsedDocument], model_config: dict[str, Any] | None = None) -> list[str]:
    """`FILE: message` lines for a valid spec whose pod could not hold its trainers."""
    lines = []
    for doc in documents:
        if doc.job is None:
            continue
        short = memory_refusal(doc.job.spec, pod_plan(doc.job.spec, model_config).host)
        if short is not None:
            lines.append(f"{_source(path, documents, doc)}: WontFit: {short}")
    return lines


def volume_problems(path: str, documents: list[ParsedDocument], volumes: Path) -> list[str]:
    """`FILE: field: claim 'C', path 'P': problem` for each input not where the spec says."""
    return [
        f"{_source(path, documents, doc)}: {problem}"
        for doc in documents
        if doc.job is not None
        for problem in path_problems(doc.job.spec, volumes)
    ]


def serving_warnings(path: str, documents: list[ParsedDocument]) -> list[str]:
    """`FILE: warning: ...` for a valid job a server refuses as is (vLLM's LoRA rank limit)."""
    lines = []
    for doc in documents:
        if doc.job is not None and (warning := lora_rank_warning(doc.job.spec.lora.r)):
            lines.append(f"{_source(path, documents, doc)}: warning: {warning}")
    return lines


def server_problems(
    path: str, documents: list[ParsedDocument], args: argparse.Namespace, notes: list[str]
) -> list[str]:
    """`FILE: spec.adapters[0].job: ...` for what the operator would refuse of each ModelServer on
    the cluster; where none is reachable, a note in `notes` says what went unchecked."""
    servers = [doc for doc in documents if doc.server is not None]
    if not servers:
        return []
    from .servers import cluster_problems

    lines = []
    try:
        cluster = kube.connect(args)
        for doc in servers:
            assert doc.server is not None
            target = kube.Cluster(cluster.api, doc.server.metadata.namespace or cluster.namespace)
            found = cluster_problems(target, doc.server.spec)
            lines += [f"{_source(path, documents, doc)}: {problem}" for problem in found]
    except CliError as exc:
        notes.append(f"not checked on a cluster ({exc}): the adapters' jobs and the claims")
    return lines


def run(args: argparse.Namespace) -> int:
    model_config = read_json(Path(args.model_config), "--model-config") if args.model_config else None
    allow_list = read_allow_list(Path(args.values)) if args.values else None
    code = 0
    for path in args.files:
        notes: list[str] = []
        unchecked: list[str] = []
        try:
            documents = parse_file(path, KINDS)
        except ManifestError as exc:
            print(f"{path}: {exc}")
            code = 1
            continue
        problems = spec_problems(path, documents, model_config, notes)
        if allow_list is not None:
            problems += image_problems(path, documents, allow_list)
        if args.volumes:
            problems += volume_problems(path, documents, Path(args.volumes))
        if not problems:
            problems += server_problems(path, documents, args, unchecked)
        if problems:
            code = 1
            for line in problems:
                print(line)
            continue
        short = fit_problems(path, documents, model_config)
        for line in short:
            print(line)
        if short:
            code = code or DOES_NOT_FIT
        elif notes:
            print(f"{path}: valid; family {' | '.join(dict.fromkeys(notes))}")
        else:
            print(f"{path}: valid")
        for line in unchecked:
            print(f"{path}: note: {line}")
        for line in serving_warnings(path, documents):
            print(line)
    return code
