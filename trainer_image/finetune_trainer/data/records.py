"""Raw records with where they came from, so every problem names its line (or row).

JSON Lines is read as bytes line by line: invalid UTF-8 and NUL bytes are found before the
JSON parser sees them, and a bad line never hides the lines after it.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet",)
DATA_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES


@dataclass(frozen=True)
class Record:
    where: str  # "line 12", "record 3", "row 7", prefixed by the file name when a folder holds several
    value: Any = None
    problem: str | None = None  # set when the record could not be read at all


class DataSourceError(Exception):
    """The data cannot be read at all (missing file, unknown layout); one line."""


def _jsonl(path: Path, label: str) -> Iterator[Record]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{label}line {number}"
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            nul = line.find(b"\x00")
            if nul >= 0:
                yield Record(where, problem=f"NUL byte (\\x00) at column {nul + 1}")
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Record(where, problem=f"invalid UTF-8 at column {exc.start + 1}")
                continue
            try:
                yield Record(where, json.loads(text))
            except json.JSONDecodeError as exc:
                yield Record(where, problem=f"invalid JSON at column {exc.colno}: {exc.msg}")


def _json(path: Path, label: str) -> Iterator[Record]:
    data = path.read_bytes()
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        yield Record(f"{label}line {line}", problem="NUL byte (\\x00)")
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        yield Record(f"{label}line {line}", problem="invalid UTF-8")
        return
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        yield Record(f"{label}line {exc.lineno}", problem=f"invalid JSON at column {exc.colno}: {exc.msg}")
        return
    if isinstance(parsed, dict) and isinstance(parsed.get("data"), list):
        parsed = parsed["data"]
    if not isinstance(parsed, list):
        yield Record(f"{label}line 1", problem="expected a JSON array of records (or JSON Lines in a .jsonl file)")
        return
    for number, value in enumerate(parsed, start=1):
        yield Record(f"{label}record {number}", value)


def _parquet(path: Path, label: str) -> Iterator[Record]:
    # pyarrow ships no annotations (its import is untyped).
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        yield Record(f"{label}file", problem=f"not a readable Parquet file: {exc}")
        return
    for number, value in enumerate(table.to_pylist(), start=1):
        yield Record(f"{label}row {number}", value)


def _on_disk_dataset(path: Path, split: str) -> Iterator[Record]:
    from datasets import Dataset, DatasetDict, load_from_disk

    loaded = load_from_disk(str(path))
    if isinstance(loaded, DatasetDict):
        if split not in loaded:
            raise DataSourceError(f"{path}: saved dataset has splits {sorted(loaded)}, not {split!r}")
        loaded = loaded[split]
    assert isinstance(loaded, Dataset)
    for number, value in enumerate(loaded, start=1):
        yield Record(f"row {number}", value)


def _reader(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _jsonl
    if suffix in JSON_SUFFIXES:
        # Many ".json" training files are really JSON Lines; sniff the first character.
        with path.open("rb") as handle:
            head = handle.read(4096).lstrip()
        if head.startswith(b"{") and b"\n{" in head.replace(b"\r\n", b"\n"):
            return _jsonl
        return _json
    if suffix in PARQUET_SUFFIXES:
        return _parquet
    return None


def read_records(path: Path, split: str = "train") -> Iterator[Record]:
    """Every record of a file, a folder of data files, or a `save_to_disk` dataset folder."""
    if not path.exists():
        raise DataSourceError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            yield from _on_disk_dataset(path, split)
            return
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
        if not files:
            raise DataSourceError(f"{path}: folder holds no .jsonl, .json or .parquet files")
        for file in files:
            yield from _reader(file)(file, f"{file.relative_to(path)}: ")
        return
    reader = _reader(path)
    if reader is None:
        raise DataSourceError(f"{path}: unknown file type {path.suffix!r}; use .jsonl, .json or .parquet")
    yield from reader(path, "")
