"""The README's CLI and Make tables are what `ftjob --help` and the Makefile say: a flag or a
target added without `make crds` fails here, naming the command that fixes it."""

import argparse
from pathlib import Path

import pytest

from finetune_cli import readme_tables
from finetune_cli.main import build_parser

REGENERATE = "run `make crds` (python -m finetune_cli.readme_tables) and commit docs/cli.md"


def _committed() -> str:
    return readme_tables.README.read_text()


def test_readme_tables_are_current() -> None:
    current = _committed()
    assert readme_tables.render_readme(current, readme_tables.MAKEFILE.read_text()) == current, REGENERATE


@pytest.mark.parametrize(
    "flag",
    [
        "`--volumes DIR`",
        "`--gpu-product NAME`",
        "`--fp32-tflops X`",
        "`--max-length L`",
        "`--packing`",
        "`--logs-dir DIR`",
        "`--dry-run`",
        "`-o, --output text\\|json\\|yaml`",
        "`--timeout SECONDS`",
        "`-A, --all-namespaces`",
    ],
)
def test_flags_the_issue_found_missing_are_documented(flag: str) -> None:
    table = _committed().partition(readme_tables.CLI_BEGIN)[2].partition(readme_tables.CLI_END)[0]
    assert flag in table


def test_every_flag_of_every_command_is_in_the_table() -> None:
    table = readme_tables.cli_table()
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                assert f"`ftjob {name}" in table
                for option in sub._actions:
                    for string in option.option_strings:
                        if string not in ("-h", "--help"):
                            assert string in table, f"ftjob {name} {string}"


def test_a_flag_added_without_the_readme_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def with_new_flag() -> argparse.ArgumentParser:
        parser = build_parser()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                action.choices["plan"].add_argument("--brand-new-flag", help="not in the README yet")
        return parser

    monkeypatch.setattr(readme_tables, "build_parser", with_new_flag)
    current = _committed()
    assert readme_tables.render_readme(current, readme_tables.MAKEFILE.read_text()) != current
    assert readme_tables.main(["--check"]) == 1


def test_a_make_target_added_without_the_readme_fails() -> None:
    current = _committed()
    makefile = readme_tables.MAKEFILE.read_text() + "\nnew-target: ## something new\n\ttrue\n"
    rendered = readme_tables.render_readme(current, makefile)
    assert rendered != current
    assert "| `make new-target` | something new |" in rendered


def test_check_names_the_command_that_regenerates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(_committed().replace("`--dry-run`", "`--dry-rum`"))
    monkeypatch.setattr(readme_tables, "README", stale)
    assert readme_tables.main(["--check"]) == 1
    assert "run `make crds`" in capsys.readouterr().err
