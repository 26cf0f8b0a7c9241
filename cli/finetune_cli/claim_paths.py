"""The pre-flight's path check on this machine: `--volumes DIR` holds each claim as DIR/<claimName>/.

`ftjob plan --volumes` and `ftjob validate --volumes` say what the operator's pre-flight Job
would say of the paths (finetune_trainer/launch/input_check.py), in the same words: the claim and the
path in it. The records themselves are `ftjob check-data`'s.
"""

import json
from pathlib import Path

from finetune_api.spec import FineTuneJobSpec, PvcSource


def _where(claim: str, path: str) -> str:
    return f"claim {claim!r}, path {path.strip('/') or '/'!r}"


def _claim_folder(field: str, volumes: Path, claim: str) -> str | None:
    if (volumes / claim).is_dir():
        return None
    return f"{field}: claim {claim!r}: no folder {volumes / claim} (--volumes holds each claim as DIR/<claimName>/)"


def _model(spec: FineTuneJobSpec, volumes: Path) -> str | None:
    source = spec.model.source.pvc
    if source is None:
        return None
    field = "spec.model.source.pvc"
    if (missing := _claim_folder(field, volumes, source.claim_name)) is not None:
        return missing
    folder = volumes / source.claim_name / source.path
    where = _where(source.claim_name, source.path)
    if not folder.exists():
        return f"{field}: {where}: no such folder"
    if not folder.is_dir():
        return f"{field}: {where}: a file, not a model folder"
    config = folder / "config.json"
    if not config.is_file():
        return f"{field}: {where} is not a model folder (no config.json there)"
    try:
        loaded = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{field}: {where}: cannot read the model config: {exc}"
    return None if isinstance(loaded, dict) else f"{field}: {where}: config.json is not a JSON object"


def _data(field: str, source: PvcSource | None, volumes: Path) -> str | None:
    if source is None:
        return None
    if (missing := _claim_folder(field, volumes, source.claim_name)) is not None:
        return missing
    if not (volumes / source.claim_name / source.path).exists():
        return f"{field}: {_where(source.claim_name, source.path)}: no such file or folder"
    return None


def path_problems(spec: FineTuneJobSpec, volumes: Path) -> list[str]:
    """One line per input the pre-flight would refuse; empty when the model, the dataset and the
    held-out source (dataset.eval) are there."""
    held_out = spec.dataset.eval.pvc if spec.dataset.eval is not None else None
    found = (
        _model(spec, volumes),
        _data("spec.dataset", spec.dataset.source.pvc, volumes),
        _data("spec.dataset.eval", held_out, volumes),
    )
    return [p for p in found if p is not None]
