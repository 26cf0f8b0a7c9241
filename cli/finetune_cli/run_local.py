"""`ftjob run FILE.yaml --workdir DIR`: run a FineTuneJob here, with no cluster.

Each PVC claim maps to `DIR/<claimName>/`, exactly as the pod mounts it, and the trainer runs
in this process through the same entry point as in the pod: what works here works there. S3
sources are fetched first, as the fetch Job does, into the object cache claim's folder
(`DIR/finetune-object-cache/`, or `DIR/<objectCache.claimName>/`), with the credentials of the
usual AWS_* variables; a copy whose ETags match is reused. `output.s3` gets the outputs after.
"""

import argparse
import json
from pathlib import Path

from finetune_api import ManifestError, contract, parse_file
from finetune_api.problems import format_problems
from finetune_api.reasons import export_failure
from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import RuntimePaths, TrainerConfig

from .errors import CliError
from .trainer_seam import trainer


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "run",
        help="train a FineTuneJob locally (each PVC claim is DIR/<claimName>/)",
        description="Run a FineTuneJob on this machine with the in-image trainer; rerun to resume "
        "from the last complete checkpoint. No cluster: each PVC claim maps to DIR/<claimName>/.",
    )
    parser.add_argument("file", metavar="FILE.yaml")
    parser.add_argument("--workdir", required=True, metavar="DIR", help="folder holding one sub-folder per claim")
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="training processes to launch, overriding the spec's (for CPU runs: N processes with gloo)",
    )
    parser.set_defaults(handler=run)


def local_paths(name: str, spec: FineTuneJobSpec, workdir: Path) -> RuntimePaths:
    """The pod's paths with each claim at DIR/<claimName>/ instead of its mount."""

    def mount(_role: str, claim: str) -> str:
        return str(workdir / claim)

    return RuntimePaths.model_validate(contract.trainer_paths(name, spec, mount, str(workdir / contract.HUB_CACHE_DIR)))


def local_config(path: str, workdir: Path) -> TrainerConfig:
    try:
        documents = parse_file(path)
    except ManifestError as exc:
        raise CliError(f"{path}: {exc}") from None
    if len(documents) != 1:
        raise CliError(f"{path}: expected one FineTuneJob, found {len(documents)} documents")
    doc = documents[0]
    if doc.job is None:
        raise CliError("; ".join(format_problems(doc.problems, path)))
    name = doc.job.metadata.name or "local"
    return TrainerConfig(
        job_name=name, namespace=None, spec=doc.job.spec, paths=local_paths(name, doc.job.spec, workdir)
    )


def trainer_args(config_path: Path, state: Path, nproc: int | None) -> list[str]:
    """The trainer entry's command line: the pod's, plus `--nproc` when given."""
    argv = ["--config", str(config_path), "--termination-log", str(state / "termination-log")]
    return argv if nproc is None else [*argv, "--nproc", str(nproc)]


def fetch(config_path: Path, termination: Path) -> int:
    """The fetch Job's run here: the S3 sources into the object cache folder; 0, or the exit code
    after printing its one line."""
    argv = ["--config", str(config_path), "--termination-log", str(termination), contract.FETCH_INPUTS_FLAG]
    code: int = trainer("ftjob run").run_trainer(argv)
    said = termination.read_text(encoding="utf-8") if termination.exists() else ""
    termination.unlink(missing_ok=True)
    if code != 0:
        print(f"failed (exit {code}): {said}")
        return code
    copies = contract.said_after(contract.FETCHED_PREFIX, said)
    for copy in copies if isinstance(copies, list) else []:
        print(copy.get("message", ""))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.nproc is not None and args.nproc < 1:
        raise CliError(f"--nproc: must be at least 1, got {args.nproc}")
    workdir = Path(args.workdir).resolve()
    if not workdir.is_dir():
        raise CliError(f"--workdir {args.workdir}: no such folder")
    config = local_config(args.file, workdir)
    state = workdir / ".ftjob" / config.job_name
    state.mkdir(parents=True, exist_ok=True)
    config_path = state / "config.json"
    config_path.write_text(json.dumps(config.model_dump(by_alias=True, exclude_none=True), indent=2), encoding="utf-8")
    termination = state / "termination-log"
    termination.unlink(missing_ok=True)  # an earlier run's words are not this one's
    if contract.uses_objects(config.spec) and (fetched := fetch(config_path, termination)) != 0:
        return fetched
    # Loaded here: `ftjob validate` must not pay for torch.
    code: int = trainer("ftjob run").run_trainer(trainer_args(config_path, state, args.nproc))
    said = termination.read_text(encoding="utf-8") if termination.exists() else ""
    if code == 0:
        unwritten = export_failure(said)
        print(f"done: outputs in {config.paths.output}" + (f"; not written: {unwritten}" if unwritten else ""))
    else:
        print(f"failed (exit {code}): {said}")
    return code
