"""A conversation trains what `trainOn` names, read off the model's own chat template.

Four real templates (Llama 3, Qwen2.5's ChatML, Mistral's [INST], Gemma without a system role)
with tiny tokenizers carrying their special tokens. The expected targets are computed here from
the assistant texts alone (their tokens plus one end-of-turn token per turn), not with the
product's code.
"""

import json
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from finetune_trainer.data.batches import make_rows
from finetune_trainer.data.checks import check_records
from finetune_trainer.data.records import Record
from finetune_trainer.data.tokens import IGNORE, tokenize
from tests.fixtures.chat_templates import DROPS_REASONING, FAMILIES, MISTRAL, Family, family_tokenizer
from tests.support.cli import assert_one_line_error, ftjob

SYSTEM = {"role": "system", "content": "You are a helpful support agent."}
CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris is the capital of France."},
    {"role": "user", "content": "And of Italy?"},
    {"role": "assistant", "content": "Rome is the capital of Italy."},
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[Family, Any]:
    chosen = FAMILIES[request.param]
    return chosen, family_tokenizer(chosen)


def conversation(family: Family) -> list[dict[str, str]]:
    return [SYSTEM, *CHAT] if family.system else list(CHAT)


def expected_targets(family: Family, tokenizer: Any, replies: list[str]) -> list[int]:
    """The assistant texts' own tokens, each followed by the family's end-of-turn token."""
    eot = tokenizer.convert_tokens_to_ids(family.end_of_turn)
    out: list[int] = []
    for reply in replies:
        out += [*tokenizer(reply.strip(), add_special_tokens=False)["input_ids"], eot]
    return out


def targets(tokens: Any) -> list[int]:
    return [label for label in tokens.labels[1:] if label != IGNORE]


def test_both_assistant_turns_are_trained_and_no_user_turn(family: tuple[Family, Any]) -> None:
    chosen, tokenizer = family
    (tokens,) = tokenize([{"messages": conversation(chosen)}], tokenizer, "assistant")
    assert tokens.problem is None
    want = expected_targets(chosen, tokenizer, [CHAT[1]["content"], CHAT[3]["content"]])
    assert targets(tokens) == want
    # trainedTokens: the replies' tokens plus one end-of-turn token per reply.
    replies = (CHAT[1]["content"], CHAT[3]["content"])
    assert len(targets(tokens)) == sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) + 1 for r in replies)
    trained_text = tokenizer.decode(targets(tokens))
    for user in (CHAT[0]["content"], CHAT[2]["content"], SYSTEM["content"]):
        assert user not in trained_text


def test_last_assistant_trains_the_second_turn_only(family: tuple[Family, Any]) -> None:
    chosen, tokenizer = family
    (tokens,) = tokenize([{"messages": conversation(chosen)}], tokenizer, "lastAssistant")
    assert targets(tokens) == expected_targets(chosen, tokenizer, [CHAT[3]["content"]])


def test_all_trains_every_token(family: tuple[Family, Any]) -> None:
    chosen, tokenizer = family
    (tokens,) = tokenize([{"messages": conversation(chosen)}], tokenizer, "all")
    assert tokens.labels == tokens.input_ids
    rendered = tokenizer.apply_chat_template(conversation(chosen), tokenize=False)
    assert tokens.input_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_the_check_counts_what_the_trainer_trains(family: tuple[Family, Any]) -> None:
    chosen, tokenizer = family
    samples = [conversation(chosen), CHAT[:2], CHAT[2:]]
    records = [Record(f"line {n}", {"messages": m}) for n, m in enumerate(samples, start=1)]
    report = check_records(records, "messages", tokenizer=tokenizer, max_length=512)
    assert report.ok, report.problems
    replies = [[CHAT[1]["content"], CHAT[3]["content"]], [CHAT[1]["content"]], [CHAT[3]["content"]]]
    want = [len(expected_targets(chosen, tokenizer, r)) for r in replies]
    assert [c.trained_tokens for c in report.counts] == want
    assert report.trained_tokens == sum(want)
    rows = make_rows([{"messages": m} for m in samples], tokenizer, 512, packing=False)
    assert [r.targets for r in rows] == want
    assert report.tokens == sum(len(r.input_ids) for r in rows)


def test_packing_keeps_each_samples_mask(family: tuple[Family, Any]) -> None:
    chosen, tokenizer = family
    samples = [{"messages": m} for m in (conversation(chosen), CHAT[:2], CHAT[2:], CHAT[:2])]
    alone = make_rows(samples, tokenizer, 256, packing=False)
    packed = make_rows(samples, tokenizer, 256, packing=True)
    assert len(packed) < len(alone)

    def members(row: Any) -> list[tuple[list[int], list[int]]]:
        starts = [i for i, p in enumerate(row.position_ids) if p == 0] + [len(row.input_ids)]
        return [(row.input_ids[a:b], row.labels[a:b]) for a, b in pairwise(starts)]

    found = sorted((ids, labels[1:]) for row in packed for ids, labels in members(row))
    assert found == sorted((row.input_ids, row.labels[1:]) for row in alone)
    assert sum(r.targets for r in packed) == sum(r.targets for r in alone)


def test_sharegpt_trains_as_the_same_messages_do(family: tuple[Family, Any]) -> None:
    chosen, tokenizer = family
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    shared = {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in conversation(chosen)]}
    as_sharegpt = check_records([Record("line 1", shared)], "sharegpt", tokenizer=tokenizer, max_length=512)
    as_messages = check_records(
        [Record("line 1", {"messages": conversation(chosen)})], "messages", tokenizer=tokenizer, max_length=512
    )
    assert as_sharegpt.counts == as_messages.counts and as_sharegpt.ok


def test_gemma_refuses_a_system_turn_by_line() -> None:
    tokenizer = family_tokenizer(FAMILIES["gemma"])
    records = [Record("line 1", {"messages": CHAT}), Record("line 2", {"messages": [SYSTEM, *CHAT]})]
    report = check_records(records, "messages", tokenizer=tokenizer, max_length=512)
    assert [str(p) for p in report.problems] == [
        "line 2: messages: the model's chat template refused this conversation: System role not supported"
    ]


def thinking(step: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": f"<think>{step}</think>Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."},
    ]


def test_a_template_that_rewrites_earlier_turns_is_named_once_at_its_first_sample() -> None:
    tokenizer = family_tokenizer(FAMILIES["qwen2.5"], DROPS_REASONING)
    records = [
        Record("line 1", {"messages": CHAT}),  # no reasoning block: this one renders alike
        Record("line 2", {"messages": thinking("France is in Europe")}),
        Record("line 3", {"messages": thinking("Paris")}),
    ]
    report = check_records(records, "messages", tokenizer=tokenizer, max_length=512)
    (problem,) = report.problems
    assert str(problem).startswith("line 2: chat_template: the model's chat template does not keep prefixes")
    assert "messages[1]" in str(problem) and "\n" not in str(problem)
    # With every token trained no span is needed, and the same data is fine.
    assert check_records(records, "messages", tokenizer=tokenizer, max_length=512, train_on="all").ok


def test_zero_trained_tokens_is_an_error_and_a_cut_reply_a_warning() -> None:
    tokenizer = family_tokenizer(FAMILIES["qwen2.5"])
    (whole,) = tokenize([{"messages": CHAT}], tokenizer)
    first_reply_end = whole.labels.index(tokenizer.convert_tokens_to_ids("<|im_end|>")) + 1
    records = [Record("line 1", {"messages": CHAT}), Record("line 2", {"messages": CHAT[:2]})]
    # Cut inside the second reply: line 1 keeps part of its targets (a warning), line 2 all of them.
    report = check_records(records, "messages", tokenizer=tokenizer, max_length=len(whole.input_ids) - 3)
    assert report.ok
    (cut,) = [w for w in report.warnings if "cuts the assistant's text" in w]
    assert "line 1 (" in cut and "line 2" not in cut
    # Cut before the first reply: nothing left to learn from.
    short = first_reply_end - len(expected_targets(FAMILIES["qwen2.5"], tokenizer, [CHAT[1]["content"]])) - 1
    report = check_records(records[1:], "messages", tokenizer=tokenizer, max_length=short)
    (problem,) = report.problems
    assert str(problem).startswith(f"line 2: 0 trained tokens: maxLength {short} cuts all ")


def write_chat(path: Path, conversations: list[list[dict[str, str]]]) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations), encoding="utf-8")
    return path


def test_check_data_cli_reports_tokens_and_trained_tokens(tmp_path: Path) -> None:
    chosen = FAMILIES["llama3"]
    tokenizer = family_tokenizer(chosen, folder=tmp_path / "llama3")
    data = write_chat(tmp_path / "chat.jsonl", [[SYSTEM, *CHAT], CHAT[:2]])
    result = ftjob("check-data", "--format", "messages", "--tokenizer", str(tmp_path / "llama3"), str(data))
    assert result.returncode == 0, result.stdout + result.stderr
    replies = [[CHAT[1]["content"], CHAT[3]["content"]], [CHAT[1]["content"]]]
    trained = sum(len(expected_targets(chosen, tokenizer, r)) for r in replies)
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"{data}: 2 samples OK \(messages\): \d+ tokens, {trained} trained, trainOn assistant", summary
    )

    result = ftjob("check-data", "--format", "messages", "--tokenizer", str(tmp_path / "llama3"), "--json", str(data))
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(o["line"], o["trainedTokens"]) for o in objects] == [
        (1, len(expected_targets(chosen, tokenizer, replies[0]))),
        (2, len(expected_targets(chosen, tokenizer, replies[1]))),
    ]
    assert all(o["tokens"] > o["trainedTokens"] for o in objects)


def test_check_data_cli_names_a_template_that_rewrites_turns_in_one_line(tmp_path: Path) -> None:
    family_tokenizer(FAMILIES["qwen2.5"], DROPS_REASONING, folder=tmp_path / "thinker")
    data = write_chat(tmp_path / "chat.jsonl", [CHAT, thinking("a"), thinking("b")])
    result = ftjob("check-data", "--format", "messages", "--tokenizer", str(tmp_path / "thinker"), str(data))
    assert_one_line_error(
        result, "line 2: chat_template: the model's chat template does not keep prefixes", on_stdout=True
    )


@pytest.mark.trainer
def test_the_trainer_stops_at_its_start_on_a_template_that_rewrites_turns(tmp_path: Path, tiny_assets: Path) -> None:
    from finetune_api.reasons import ExitReason
    from tests.trainer.conftest import JobDir

    tiny = tiny_assets / "models" / "tiny-llama"
    model = tmp_path / "models" / "tiny-llama"
    model.mkdir(parents=True)
    for item in tiny.iterdir():
        if "token" not in item.name and item.suffix != ".jinja":  # the weights and config, not the tokenizer
            (model / item.name).symlink_to(item)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    tokenizer.chat_template = DROPS_REASONING
    tokenizer.save_pretrained(str(model))
    (tmp_path / "datasets").mkdir()
    write_chat(tmp_path / "datasets" / "chat.jsonl", [CHAT, thinking("a")])
    (tmp_path / "outputs").mkdir()
    job = JobDir(tmp_path)
    job.spec_changes = {
        "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "chat.jsonl"}}, "format": "messages"}
    }
    run = job.run()
    assert run.code == ExitReason.InvalidData
    assert "line 2: chat_template: the model's chat template does not keep prefixes" in run.termination
    assert len(run.termination.strip().splitlines()) == 1
    assert "Traceback" not in run.stderr
    assert not run.of("progress")


class SlowTokenizer:
    """What a tokenizer without tokenizer.json looks like to the check: no character offsets."""

    is_fast = False
    chat_template = MISTRAL
    eos_token_id, bos_token_id = 2, 1
    bos_token, eos_token = "<s>", "</s>"
    all_special_tokens = ("<s>", "</s>")


def test_a_slow_tokenizer_is_refused_for_conversations_in_one_line() -> None:
    report = check_records([Record("line 1", {"messages": CHAT})], "messages", tokenizer=SlowTokenizer(), max_length=64)
    (problem,) = report.problems
    assert str(problem).startswith("tokenizer: tokenizer.json: format messages needs a fast tokenizer")
