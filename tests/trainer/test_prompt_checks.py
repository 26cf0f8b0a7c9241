"""GRPO's data (`dataset.format: prompt`) is checked as every format is: each bad record named by
line and field before training, the record's other fields kept for the rewards, each field of
one kind in every record; with a tokenizer, each prompt counted by the trainer's own rule
(`finetune_trainer.data.prompts.prompt_ids`) and one that leaves its completion no room refused.
`ftjob check-data --format prompt` says the same, and passes the example job's data."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_trainer.data.checks import check_records
from finetune_trainer.data.records import Record, read_records
from tests.trainer.test_data_checks import run_cli, write_lines

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_JOB = REPO / "examples" / "grpo-job.yaml"
EXAMPLE_DATA = REPO / "examples" / "data" / "arithmetic.jsonl"
SUM = {"prompt": "What is 2 + 3?", "answer": 5}
USER = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"answer": 4}, "line 2: prompt: missing field"),
        ({"prompt": "   ", "answer": 4}, "line 2: prompt: empty text"),
        ({"prompt": 3, "answer": 4}, "line 2: prompt: expected a string or a non-empty list of messages, got int"),
        (
            {"prompt": [], "answer": 4},
            "line 2: prompt: expected a string or a non-empty list of messages, got an empty",
        ),
        (
            {"prompt": [{"role": "robot", "content": "hi"}], "answer": 4},
            "line 2: prompt[0].role: expected one of assistant, system, tool, user, got 'robot'",
        ),
        ({"prompt": [{"role": "user", "content": ""}], "answer": 4}, "line 2: prompt[0].content: empty text"),
        (
            {"prompt": [*USER, {"role": "assistant", "content": "5"}], "answer": 4},
            "line 2: prompt: the last message is the assistant's: a prompt ends with the turn its completion answers "
            "(user or tool)",
        ),
        ({"prompt": "What is 1 + 3?", "answer": "four"}, "line 2: answer: a string, but line 1's is an integer"),
        ({"prompt": USER, "answer": 4}, "line 2: prompt: messages, but line 1's is a string"),
    ],
)
def test_each_bad_prompt_line_is_named(tmp_path: Path, record: dict[str, Any], expected: str) -> None:
    report = check_records(read_records(write_lines(tmp_path / "d.jsonl", [SUM, record, SUM])), "prompt")
    assert [str(p) for p in report.problems][:1] and str(report.problems[0]).startswith(expected), report.problems
    assert len(report.problems) == 1 and len(report.samples) == 2


def test_a_records_other_fields_are_kept_for_the_rewards() -> None:
    records = [
        Record("line 1", {"prompt": [{"role": "system", "content": "Be brief."}, *USER], "answer": 5, "tags": ["sum"]}),
        Record("line 2", {"prompt": [{"role": "user", "content": "What is 2 - 3?"}], "answer": -1}),
        # A tool's turn is one a completion answers too.
        Record("line 3", {"prompt": [*USER, {"role": "tool", "content": "5"}], "answer": 5, "tags": None}),
    ]
    report = check_records(records, "prompt")
    assert report.ok, report.problems
    assert report.samples[0] == {
        "prompt": [{"role": "system", "content": "Be brief."}, *USER],
        "answer": 5,
        "tags": ["sum"],
    }
    assert report.samples[1]["answer"] == -1 and report.summary()["samples"] == 3


def test_an_integer_field_with_a_fraction_elsewhere_is_refused() -> None:
    """The trainer's table would turn every integer of the field into a number with a fraction,
    which an answer reward does not take."""
    records = [Record("line 1", SUM), Record("line 2", {"prompt": "What is 1 / 2?", "answer": 0.5})]
    (problem,) = check_records(records, "prompt").problems
    assert str(problem) == (
        "line 2: answer: a number with a fraction, but line 1's is an integer: a field holds one kind of value in "
        "every record"
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_assets: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_assets / "models" / "tiny-llama"))


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_prompts_are_counted_as_the_trainer_tokenises_them(tokenizer: Any) -> None:
    from finetune_trainer.data.prompts import prompt_ids

    strings = [Record(f"line {n}", {"prompt": f"What is {n} + 1?", "answer": n + 1}) for n in range(1, 4)]
    chats = [Record(f"line {n}", {"prompt": [{"role": "user", "content": f"What is {n} + 1?"}]}) for n in range(1, 4)]
    for records in (strings, chats):
        report = check_records(records, "prompt", tokenizer=tokenizer, max_length=128, max_completion_length=16)
        assert report.ok and not report.warnings, report.problems
        lengths = [len(prompt_ids(sample, tokenizer)) for sample in report.samples]
        assert [c.tokens for c in report.counts] == lengths and report.trained_tokens == 0
    # A string as `completion`'s prompt is: with the tokenizer's special tokens (BOS).
    said = prompt_ids({"prompt": "What is 1 + 1?"}, tokenizer)
    assert said == list(tokenizer("What is 1 + 1?")["input_ids"]) and said[0] == tokenizer.bos_token_id
    # Messages: the chat template with its generation prompt, a flat list of ints.
    chat = prompt_ids({"prompt": USER}, tokenizer)
    text = tokenizer.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    assert chat == list(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert all(type(i) is int for i in chat)


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_a_prompt_that_leaves_its_completion_no_room_is_refused(tmp_path: Path, tokenizer: Any) -> None:
    long = {"prompt": " ".join(["What is one plus one?"] * 12), "answer": 2}
    path = write_lines(tmp_path / "d.jsonl", [SUM, long, SUM])
    report = check_records(read_records(path), "prompt", tokenizer=tokenizer, max_length=64, max_completion_length=16)
    (problem,) = report.problems
    assert re.fullmatch(
        r"line 2: prompt: \d+ tokens, over the 48 that maxLength 64 leaves beside maxCompletionLength 16: "
        r"shorten it, or raise training.maxLength",
        str(problem),
    ), problem
    assert len(report.samples) == 2 and report.over_length == 1
    # The same prompt with room for it.
    assert check_records(read_records(path), "prompt", tokenizer=tokenizer, max_length=512, max_completion_length=16).ok


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_message_prompts_need_the_models_chat_template(tiny_assets: Path) -> None:
    from transformers import AutoTokenizer

    no_template = AutoTokenizer.from_pretrained(str(tiny_assets / "models" / "tiny-llama"))
    no_template.chat_template = None
    records = [Record("line 1", {"prompt": "What is 2 + 3?"}), Record("line 2", {"prompt": "What is 2 + 4?"})]
    assert check_records(records, "prompt", tokenizer=no_template, max_length=128, max_completion_length=16).ok
    chats = [Record("line 1", {"prompt": USER})]
    report = check_records(chats, "prompt", tokenizer=no_template, max_length=128, max_completion_length=16)
    assert [str(p) for p in report.problems] == [
        "tokenizer: chat_template: format prompt with messages (line 1) needs a chat template and the tokenizer "
        "has none"
    ]


def test_check_data_cli_names_bad_prompts_and_exits_1(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [SUM, {"answer": 3}, {"prompt": "What is 1 + 1?", "answer": "two"}])
    result = run_cli("--format", "prompt", str(path))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{path}: line 2: prompt: missing field",
        f"{path}: line 3: answer: a string, but line 1's is an integer: a field holds one kind of value in every "
        "record",
        f"{path}: 2 problem(s) in 3 records",
    ]
    packed = run_cli("--format", "prompt", "--packing", str(path))
    assert packed.returncode == 1
    assert packed.stderr.strip() == (
        "error: --packing: the methods that read format prompt never pack (each of its sequences is a prompt and "
        "one completion sampled for it)"
    )
    no_room = run_cli("--format", "prompt", "--max-length", "64", "--max-completion-length", "64", str(path))
    assert no_room.returncode == 1 and no_room.stderr.startswith("error: --max-completion-length 64: from 1 to below")


def _example() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE_JOB.read_text())["spec"]
    return spec


def test_the_example_jobs_data_is_what_its_rewards_read() -> None:
    spec = _example()
    assert spec["dataset"]["format"] == "prompt" and spec["dataset"]["source"]["pvc"]["path"].endswith(
        EXAMPLE_DATA.name
    )
    report = check_records(read_records(EXAMPLE_DATA), "prompt")
    assert report.ok and len(report.samples) >= 32, report.problems
    fields = {reward["answer"]["field"] for reward in spec["training"]["grpo"]["rewards"] if "answer" in reward}
    assert fields and all(isinstance(sample[field], int) for sample in report.samples for field in fields)
    # The answer's pattern reads the sentence each prompt asks for.
    (answer,) = (reward["answer"] for reward in spec["training"]["grpo"]["rewards"] if "answer" in reward)
    assert re.search(answer["pattern"], "The answer is -3.").group(1) == "-3"  # type: ignore[union-attr]


@pytest.mark.trainer  # the CLI loads a Hugging Face tokenizer in its subprocess (transformers, torch)
def test_check_data_cli_passes_the_example_with_its_jobs_lengths(tiny_assets: Path) -> None:
    training = _example()["training"]
    length, completion = str(training["maxLength"]), str(training["grpo"]["maxCompletionLength"])
    model = str(tiny_assets / "models" / "tiny-llama")
    args = ("--format", "prompt", "--tokenizer", model, "--max-length", length, "--max-completion-length", completion)
    result = run_cli(*args, str(EXAMPLE_DATA))
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = result.stdout.splitlines()
    found = re.fullmatch(
        rf"{EXAMPLE_DATA}: (\d+) prompts OK \(prompt\): (\d+) prompt tokens, the longest (\d+) "
        rf"\(maxLength {length} leaves (\d+) beside maxCompletionLength {completion}\)",
        line,
    )
    assert found is not None, line
    prompts, tokens, longest, room = (int(n) for n in found.groups())
    assert prompts == len(EXAMPLE_DATA.read_text().splitlines()) and 0 < longest <= room < tokens
