"""The task folder of `ftjob eval`: lm-evaluation-harness task YAMLs and their data files, read and
checked offline before anything is sent to a server.

Each `*.yaml` under the folder is parsed with lm-evaluation-harness's own loader (its `!function`
tag and `include:`), and each task is built as lm-evaluation-harness builds it (its TaskConfig
rejects unknown keys; its dataset is loaded, so a missing data file shows here). lm-evaluation-
harness's own index skips a file it cannot parse without a word; here such a file is refused in
one line naming it (and the line, where the YAML parser gives one). Data files named by a task
(`dataset_kwargs.data_files`, and a local `dataset_path` folder) are read relative to the YAML's
own folder, so a folder can be copied anywhere (or out of a claim) and still read."""

from __future__ import annotations

import copy
import importlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .display import one_line
from .errors import CliError

GENERATION: Final = "generate_until"
# Offline: a task's data come from the folder; nothing is looked up on a hub. Quiet: the command
# says itself what it runs; lm-evaluation-harness's and datasets' bars and notes are left out
# (LMEVAL_LOG_LEVEL, TQDM_DISABLE=0 bring them back).
ENV: Final = {
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
# datasets' builders of local files (`dataset_path: json` with `dataset_kwargs.data_files`).
LOCAL_BUILDERS: Final = frozenset({"json", "csv", "parquet", "text", "arrow"})
INSTALL_HINT: Final = "ftjob eval needs lm-evaluation-harness: pip install 'finetune-cli[eval]'"


@dataclass(frozen=True)
class TaskFile:
    name: str
    path: Path
    config: dict[str, Any]  # the YAML's keys, includes merged, data files made absolute

    def fresh(self) -> dict[str, Any]:
        """A copy to build from: lm-evaluation-harness changes the configs it is given."""
        return copy.deepcopy(self.config)


def lm_eval_module(name: str) -> Any:
    """One of lm-evaluation-harness's modules, imported when first needed (the CLI works without
    the `eval` extra), with the hub switched off before `datasets` reads its settings."""
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    logging.getLogger("lm_eval").setLevel(os.environ.get("LMEVAL_LOG_LEVEL", "").upper() or logging.CRITICAL)
    try:
        module = importlib.import_module(name)
    except ImportError:
        raise CliError(INSTALL_HINT) from None
    _quiet_bars()
    return module


def _quiet_bars() -> None:
    """datasets' bars off (it builds each task's data set from the folder's files), also where
    this process imported datasets before the environment above was set: it reads it once, at
    import (a program calling ftjob in-process, as the tests' workers do)."""
    if os.environ.get("TQDM_DISABLE") == "0":
        return
    import datasets

    datasets.disable_progress_bars()


def _yaml_problem(exc: Exception) -> str:
    """`line N: problem` from PyYAML's marked errors; the message otherwise."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is not None:
        return f"line {mark.line + 1}: {one_line(problem or exc)}"
    return one_line(exc)


def _parse(path: Path, resolve: bool) -> dict[str, Any]:
    """The YAML as lm-evaluation-harness reads it (`include:` merged where `resolve`, and its
    `!function` references imported)."""
    import yaml

    loader = lm_eval_module("lm_eval.tasks._yaml_loader")
    try:
        config = loader.load_yaml(path, resolve_func=resolve, recursive=resolve)
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: {_yaml_problem(exc)}") from None
    except FileNotFoundError as exc:  # what `include:` names
        raise CliError(f"{path}: no such file {exc.filename} (named by include:)") from None
    except Exception as exc:  # a missing include, a `!function` that does not import, a list at the top
        raise CliError(f"{path}: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise CliError(f"{path}: not a task (a YAML mapping with a `task:` key)")
    return config


def _local(folder: Path, value: Any, path: Path, key: str) -> Any:
    """`value` (a data file or a list of them) resolved against the YAML's folder; each must exist."""
    if isinstance(value, list):
        return [_local(folder, item, path, key) for item in value]
    if not isinstance(value, str) or "://" in value:
        return value
    found = folder.resolve() / Path(value).expanduser()
    # datasets takes glob patterns too (`data/*.jsonl`): one file at least must match.
    exists = any(found.parent.glob(found.name)) if any(c in value for c in "*?[") else found.exists()
    if not exists:
        raise CliError(f"{path}: {key}: data file {value} not found (read relative to the YAML's folder)")
    return str(found)


def _with_local_data(config: dict[str, Any], path: Path) -> dict[str, Any]:
    config = copy.deepcopy(config)
    folder = path.parent
    kwargs = config.get("dataset_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    files = kwargs.get("data_files")
    if isinstance(files, dict):
        kwargs["data_files"] = {k: _local(folder, v, path, f"dataset_kwargs.data_files.{k}") for k, v in files.items()}
    elif files is not None:
        kwargs["data_files"] = _local(folder, files, path, "dataset_kwargs.data_files")
    source = config.get("dataset_path")
    if isinstance(source, str) and (folder / source).is_dir():
        config["dataset_path"] = str((folder / source).resolve())
    elif "class" not in config and "custom_dataset" not in config and source not in LOCAL_BUILDERS:
        said = f"dataset_path {source}" if source else "no dataset_path"
        raise CliError(
            f"{path}: {said}: ftjob eval reads tasks offline, from local files (dataset_path: json, csv, parquet "
            "or text with dataset_kwargs.data_files, or a folder next to the YAML)"
        )
    return config


def _included(configs: dict[Path, dict[str, Any]]) -> set[Path]:
    """The files other YAMLs include: templates, not tasks of their own."""
    named: set[Path] = set()
    for path, raw in configs.items():
        includes = raw.get("include") or []
        for include in includes if isinstance(includes, list) else [includes]:
            named.add((path.parent / str(include)).resolve())
    return named


def task_files(folder: Path) -> list[TaskFile]:
    """Every task the folder defines, parsed and with its data files found; one line naming the
    file for the first that is not. Group files are left out (their tasks are files of their own)."""
    if not folder.is_dir():
        raise CliError(f"--tasks {folder}: no such folder")
    paths = sorted(p for p in folder.rglob("*.yaml") if "__pycache__" not in p.parts)
    if not paths:
        raise CliError(f"--tasks {folder}: no task YAML (*.yaml) in it")
    raw = {path: _parse(path, resolve=False) for path in paths}
    templates = _included(raw)
    found: list[TaskFile] = []
    for path in paths:
        if "group" in raw[path] or path.resolve() in templates:
            continue
        if not isinstance(raw[path].get("task"), str):
            raise CliError(f"{path}: not a task: no `task:` name (nor `group:`), and no other YAML includes it")
        config = _with_local_data(_parse(path, resolve=True), path)
        found.append(TaskFile(str(config["task"]), path, config))
    names = [t.name for t in found]
    for task in found:
        if names.count(task.name) > 1:
            others = ", ".join(str(t.path) for t in found if t.name == task.name and t is not task)
            raise CliError(f"{task.path}: task {task.name} is defined again in {others}")
    if not found:
        raise CliError(f"--tasks {folder}: no task in it (only groups or included templates)")
    return found


def _build_problem(exc: Exception) -> str:
    text = one_line(exc)
    marker = "got an unexpected keyword argument "
    if isinstance(exc, TypeError) and marker in text:
        return f"unknown key {text.split(marker, 1)[1]} (not a field of lm-evaluation-harness's task config)"
    return f"{type(exc).__name__}: {text}" if isinstance(exc, KeyError | AttributeError) else text


def output_types(tasks: list[TaskFile]) -> dict[str, str]:
    """Each task built as lm-evaluation-harness builds it (its dataset read from the local files):
    task name -> output type. A task that does not build is refused in one line naming its file."""
    manager = lm_eval_module("lm_eval.tasks").TaskManager(include_defaults=False)
    kinds: dict[str, str] = {}
    for task in tasks:
        try:
            built = manager.load([task.fresh()])["tasks"]
        except Exception as exc:  # lm-evaluation-harness raises what its parts raise: each is one line here
            raise CliError(f"{task.path}: {_build_problem(exc)}") from None
        for name, obj in built.items():
            kinds[name] = str(obj.get_config("output_type") or getattr(obj, "OUTPUT_TYPE", "") or "?")
    return kinds


def checked(folder: Path) -> list[TaskFile]:
    """The folder's tasks, each built; refused in one line unless every one is a generation task."""
    tasks = task_files(folder)
    kinds = output_types(tasks)
    others = [t for t in tasks if kinds.get(t.name) != GENERATION]
    if others:
        named = ", ".join(f"{t.name} ({t.path.name}: {kinds.get(t.name, '?')})" for t in others)
        raise CliError(
            f"ftjob eval runs generation tasks only (output_type: {GENERATION}), the server answering with "
            f"text; not: {named}"
        )
    return tasks
