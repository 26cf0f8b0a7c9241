"""Each fact is written once: where a part of the house needs it, it reads it from its one source.

These tests check that what is derived equals its source, so that a copy written by hand
somewhere again (or a source changed without its readers) fails here.
"""

import argparse
from typing import Any, get_args

import pytest

from finetune_api.multinode import several_nodes
from finetune_api.objectives import dataset_formats
from finetune_api.spec import DATASET_FORMATS, DatasetFormat, DatasetSpec, ResourcesSpec, TrainOn
from finetune_api.status import FineTuneJobStatus
from finetune_cli.main import build_parser
from finetune_operator.status.patch import OWNED_FIELDS
from finetune_trainer.data import formats
from finetune_trainer.data.checks import check_records
from finetune_trainer.data.records import Record
from finetune_trainer.data.tokens import IGNORE, tokenize


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
    assert _choices("check-data", "--format") == tuple(dataset_formats())
    assert set(DATASET_FORMATS) < set(dataset_formats())
    assert _choices("check-data", "--train-on") == get_args(TrainOn)


def test_the_trainer_parses_every_format_of_the_api_and_no_other() -> None:
    assert set(formats.PARSERS) == set(dataset_formats())
    assert not hasattr(formats, "FORMATS")


class CharTokenizer:
    """Each character is a token, BOS is 1 and EOS 0; it takes one text or a list, as a real one does."""

    eos_token_id = 0
    bos_token_id = 1
    bos_token, eos_token = "<s>", "</s>"
    all_special_tokens = ("<s>", "</s>")

    def __call__(
        self, text: str | list[str], add_special_tokens: bool = True, return_offsets_mapping: bool = False
    ) -> dict[str, Any]:
        if isinstance(text, list):
            each = [self(t, add_special_tokens, return_offsets_mapping) for t in text]
            return {key: [e[key] for e in each] for key in each[0]} if each else {"input_ids": []}
        out: dict[str, Any] = {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}
        if return_offsets_mapping:
            out["offset_mapping"] = ([(0, 0)] if add_special_tokens else []) + [(i, i + 1) for i in range(len(text))]
        return out

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        """`role:content` lines, the generation prompt `assistant:`."""
        return "".join(f"{m['role']}:{m['content']}\n" for m in messages) + (
            "assistant:" if add_generation_prompt else ""
        )


def test_the_data_check_counts_the_tokens_the_trainer_trains_on() -> None:
    samples: list[dict[str, Any]] = [
        {"prompt": "ab", "completion": "cde"},
        {"text": "fghi"},
        {"messages": [{"role": "user", "content": "j"}, {"role": "assistant", "content": "k"}]},
    ]
    got = tokenize(samples, CharTokenizer())
    # By hand: BOS + the prompt, then the completion and EOS, loss on those only.
    assert got[0][:3] == ([1, 97, 98, 99, 100, 101, 0], [IGNORE, IGNORE, IGNORE, 99, 100, 101, 0], 3)
    assert got[1][:3] == ([1, 102, 103, 104, 105, 0], [1, 102, 103, 104, 105, 0], 0)
    # A conversation trains the assistant's text only (no special token here to close the turn).
    assert got[2].input_ids == [ord(c) for c in "user:j\nassistant:k\n"]
    assert [label for label in got[2].labels if label != IGNORE] == [ord("k")]
    # In chunks as one by one.
    assert [t for s in samples for t in tokenize([s], CharTokenizer())] == got

    records = [Record(f"line {n}", r) for n, r in enumerate(({"prompt": "ab", "completion": "cde"}, {"text": "fghi"}))]
    report = check_records(records[:1], "completion", tokenizer=CharTokenizer(), max_length=6)
    assert (report.longest, report.over_length) == (7, 1)
    report = check_records(records[1:], "text", tokenizer=CharTokenizer(), max_length=6)
    assert (report.longest, report.over_length) == (6, 0)
    report = check_records(records[:1], "completion", tokenizer=CharTokenizer(), max_length=3)
    assert [p.field for p in report.problems] == ["prompt"]  # the prompt alone is 3 tokens


# The trainer tier's: `datasets` loads pyarrow and pandas, seconds the fast tier does not spend.
@pytest.mark.trainer
def test_the_trainers_split_tokenizes_as_the_data_check_does() -> None:
    """The trainer's split is a `datasets.Dataset`, whose slices are columns, not rows."""
    from datasets import Dataset

    texts = [{"text": "ab"}, {"text": "cde"}]
    assert tokenize(Dataset.from_list(texts), CharTokenizer()) == tokenize(texts, CharTokenizer())


def test_the_operator_owns_every_status_field_of_the_model_but_the_trainers() -> None:
    aliases = [field.alias for field in FineTuneJobStatus.model_fields.values()]
    trainers = ("progress", "lastCheckpoint", "sample", "evaluation", "modelFingerprint")
    assert tuple(a for a in aliases if a not in trainers) == OWNED_FIELDS


def test_a_job_of_several_nodes_is_told_by_one_rule() -> None:
    assert [several_nodes(n) for n in (1, 2, 64)] == [False, True, True]
    assert [ResourcesSpec(nodes=n).multinode for n in (1, 2)] == [False, True]
