"""Each fact is written once: where a part of the house needs it, it reads it from its one source.

These tests check that what is derived equals its source, so that a copy written by hand
somewhere again (or a source changed without its readers) fails here.
"""

import argparse
from typing import get_args

from finetune_api.spec import DATASET_FORMATS, DatasetFormat, DatasetSpec
from finetune_cli.main import build_parser
from finetune_trainer.data import formats


def _choices(command: str, option: str) -> tuple[str, ...]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in commands.choices[command]._actions if option in a.option_strings)
    return tuple(action.choices or ())


def test_the_dataset_format_table_names_every_format_of_the_api_in_its_order() -> None:
    assert tuple(DATASET_FORMATS) == get_args(DatasetFormat)
    description = DatasetSpec.model_fields["format"].description or ""
    assert all(name in description for name in DATASET_FORMATS)


def test_check_data_offers_the_formats_of_the_api() -> None:
    assert _choices("check-data", "--format") == tuple(DATASET_FORMATS)


def test_the_trainer_parses_every_format_of_the_api_and_no_other() -> None:
    assert set(formats.PARSERS) == set(DATASET_FORMATS)
    assert not hasattr(formats, "FORMATS")
