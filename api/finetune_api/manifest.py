"""Read FineTuneJob manifests from YAML text, reporting every problem as a `Problem`.

Used by `ftjob validate`, `ftjob submit`, `ftjob run` and `ftjob plan`: one parser, so a file
that validates offline is the file that the API server receives.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .constants import API_VERSION, KIND, SERVER_KIND
from .problems import Problem, problems_from
from .resource import FineTuneJob
from .server_resource import ModelServer


@dataclass
class ParsedDocument:
    index: int
    body: dict[str, Any] | None
    job: FineTuneJob | None = None
    problems: list[Problem] = field(default_factory=list)
    server: ModelServer | None = None


class ManifestError(Exception):
    """A file that cannot be read as YAML at all; the message is one line."""


def load_documents(text: str) -> list[Any]:
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ManifestError(f"{where}invalid YAML: {exc.problem or exc}") from None
    except yaml.reader.ReaderError as exc:
        raise ManifestError(f"character {exc.position + 1}: invalid YAML: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise ManifestError("invalid YAML: " + " ".join(str(exc).split())) from None


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError("no such file") from None
    except IsADirectoryError:
        raise ManifestError("is a directory, expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ManifestError(exc.strerror or str(exc)) from None


def parse_document(body: Any, index: int = 0, kinds: tuple[str, ...] = (KIND,)) -> ParsedDocument:
    """One document: a FineTuneJob, or any of `kinds` (`ftjob validate` takes a ModelServer too)."""
    if not isinstance(body, dict):
        return ParsedDocument(index, None, problems=[Problem("", "expected a mapping (a Kubernetes object)")])
    doc = ParsedDocument(index, body)
    if body.get("apiVersion") != API_VERSION or body.get("kind") not in kinds:
        doc.problems.append(
            Problem(
                "",
                f"expected apiVersion {API_VERSION} and kind {' or '.join(kinds)}, "
                f"got {body.get('apiVersion')!r} / {body.get('kind')!r}",
            )
        )
        return doc
    if body.get("kind") == SERVER_KIND:
        return _server_document(doc, body)
    try:
        doc.job = FineTuneJob.model_validate(body)
    except ValidationError as exc:
        doc.problems.extend(problems_from(exc, FineTuneJob))
    if doc.job is not None and not (doc.job.metadata.name or doc.job.metadata.generate_name):
        doc.problems.append(Problem("metadata.name", "required field is missing"))
        doc.job = None
    return doc


def _server_document(doc: ParsedDocument, body: dict[str, Any]) -> ParsedDocument:
    try:
        doc.server = ModelServer.model_validate(body)
    except ValidationError as exc:
        doc.problems.extend(problems_from(exc, ModelServer))
    if doc.server is not None and not doc.server.metadata.name:
        doc.problems.append(Problem("metadata.name", "required field is missing"))
        doc.server = None
    return doc


def parse_file(path: str | Path, kinds: tuple[str, ...] = (KIND,)) -> list[ParsedDocument]:
    """All documents of a file, each one of `kinds`. Raises ManifestError for unreadable files."""
    docs = load_documents(read_text(path))
    if not docs:
        raise ManifestError("no YAML documents found")
    return [parse_document(body, i, kinds) for i, body in enumerate(docs)]
