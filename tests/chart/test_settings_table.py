"""The chart holds to the operator's table of settings (finetune_operator.settings.SETTINGS).

Read from the chart's text, no helm: the operator container's env in templates/deployment.yaml
passes exactly the table's variables that name chart values, each from the values the table
names (through the helpers it includes, whose `$variables` are followed back to `.Values`), and
no value the table does not name; what it passes from the downward API is a variable of the
table too. Every value the table names is documented in values.yaml (a `# --` comment, or one on
each value under it) and declared in values.schema.json. `test_render.py` checks what the
operator reads of the rendered env.
"""

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from finetune_operator.settings import SETTINGS, Setting
from tests.support.helm import CHART

DEPLOYMENT = CHART / "templates" / "deployment.yaml"
HELPERS = CHART / "templates" / "_helpers.tpl"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
FROM_VALUES = [row for row in SETTINGS.values() if row.chart]

_VALUES_REF = re.compile(r"\.Values\.([A-Za-z_][\w.]*\w)")
_VARIABLE_REF = re.compile(r"\$(\w+)((?:\.\w+)*)")
_ASSIGNED = re.compile(r"\$(\w+)\s*:?=\s*(\.Values(?:\.\w+)+|\$\w+(?:\.\w+)*)")
_INCLUDE = re.compile(r'include\s+"([\w.-]+)"')
_DEFINE = re.compile(r'{{-?\s*define\s+"([\w.-]+)"')


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None  # the template expression of `value:`; None for `valueFrom:`


def operator_env() -> list[EnvVar]:
    """The operator container's env entries, in the template's order (extraEnv aside)."""
    lines = DEPLOYMENT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "env:")
    found: list[EnvVar] = []
    for i in range(start + 1, len(lines)):
        line = lines[i].strip()
        if line.startswith("ports:"):
            break
        if match := re.fullmatch(r"- name: (\w+)", line):
            following = lines[i + 1].strip()
            value = following.removeprefix("value: ") if following.startswith("value: ") else None
            found.append(EnvVar(match.group(1), value))
    return found


def defines() -> dict[str, str]:
    """The helpers' named templates, each with its text up to the next one."""
    text = HELPERS.read_text()
    starts = list(_DEFINE.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return {m.group(1): text[m.end() : end] for m, end in zip(starts, ends, strict=True)}


def _values_refs(text: str) -> set[str]:
    """The `.Values` paths `text` reads, directly or through `$variables` assigned from them."""
    variables: dict[str, str] = {}
    for name, source in _ASSIGNED.findall(text):
        if source.startswith(".Values."):
            variables[name] = source.removeprefix(".Values.")
        elif (base := _VARIABLE_REF.fullmatch(source)) and base.group(1) in variables:
            variables[name] = variables[base.group(1)] + base.group(2)
    refs = set(_VALUES_REF.findall(text))
    refs |= {variables[name] + rest for name, rest in _VARIABLE_REF.findall(text) if name in variables}
    return refs


def reads(expression: str, helpers: dict[str, str], seen: frozenset[str] = frozenset()) -> set[str]:
    """The values an expression reads, through every helper it includes."""
    found = _values_refs(expression)
    for name in _INCLUDE.findall(expression):
        if name in helpers and name not in seen:
            found |= reads(helpers[name], helpers, seen | {name})
    return found


def _under(ref: str, path: str) -> bool:
    return ref == path or ref.startswith(path + ".")


def test_the_walk_sees_the_wiring() -> None:
    """A walk that found nothing would pass everything: it must see known env entries and reads."""
    env = {e.name: e for e in operator_env()}
    assert env["FINETUNE_TRAINER_IMAGE"].value is not None and env["POD_NAMESPACE"].value is None
    helpers = defines()
    assert "finetune-operator.trainerNetwork" in helpers
    network = reads(env["FINETUNE_TRAINER_NETWORK"].value or "", helpers)
    assert {"trainer.networkPolicy.enabled", "trainer.networkPolicy.multiNode.collectivePorts.port"} <= network
    assert "watch.excludedNamespaces" in reads(env["FINETUNE_NAMESPACES"].value or "", helpers)


def test_the_chart_passes_exactly_the_tables_variables() -> None:
    env = operator_env()
    from_values = [e.name for e in env if e.value is not None]
    assert len(from_values) == len(set(from_values)), "a variable is set twice"
    assert set(from_values) == {row.env for row in FROM_VALUES}
    # The downward API's (the pod's name and namespace) are the table's too, fed by no value.
    table = {name for row in SETTINGS.values() if not row.chart for name in (row.env, row.fallback) if name}
    assert {e.name for e in env if e.value is None} <= table


@pytest.mark.parametrize("row", FROM_VALUES, ids=lambda row: row.env)
def test_each_variable_comes_from_the_values_the_table_names(row: Setting) -> None:
    [entry] = [e for e in operator_env() if e.name == row.env]
    assert entry.value is not None
    direct = _values_refs(entry.value)
    everything = reads(entry.value, defines())
    unnamed = {ref for ref in direct if not any(_under(ref, path) for path in row.chart)}
    assert not unnamed, f"{row.env} reads {sorted(unnamed)}, which the table does not name"
    unread = {path for path in row.chart if not any(_under(ref, path) for ref in everything)}
    assert not unread, f"{row.env} does not read {sorted(unread)}, which the table names"


def values_docs() -> dict[str, bool]:
    """Each key path of values.yaml, and whether a `# --` comment stands right above it."""
    paths: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in VALUES.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        match = re.match(r"(\s*)([A-Za-z_]\w*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            paths[".".join(key for _, key in stack)] = any(c.startswith("# --") for c in comment)
        comment = []
    return paths


def documented(path: str, docs: dict[str, bool]) -> bool:
    """Its own `# --` comment, or one on each value under it."""
    children = [p for p in docs if p.startswith(path + ".") and "." not in p[len(path) + 1 :]]
    return docs.get(path, False) or (bool(children) and all(documented(c, docs) for c in children))


def schema_at(path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = json.loads(SCHEMA.read_text())
    for key in path.split("."):
        node = ((node or {}).get("properties") or {}).get(key)
    return node


def _chart_paths() -> Iterator[str]:
    for row in FROM_VALUES:
        yield from row.chart


@pytest.mark.parametrize("path", sorted(set(_chart_paths())))
def test_each_value_the_table_names_is_documented_and_in_the_schema(path: str) -> None:
    docs = values_docs()
    assert path in docs, f"values.yaml has no {path}"
    assert documented(path, docs), f"values.yaml: {path} has no `# --` comment"
    assert schema_at(path) is not None, f"values.schema.json declares no {path}"


def test_the_values_walk_sees_the_comments() -> None:
    docs = values_docs()
    assert docs["trainer.image"] and docs["leaderElection.leaseDuration"]
    assert not docs["trainer.networkPolicy"] and documented("trainer.networkPolicy", docs)
    assert not documented("guardrails.nothingHere", docs) and not docs["guardrails"]
