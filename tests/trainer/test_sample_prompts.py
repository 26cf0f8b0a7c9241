"""Which prompts output.samples answers, and what status.sample holds of them (samples.py)."""

from pathlib import Path

from finetune_trainer.outputs.samples import STATUS_CHARS, choose_prompts, prompt_of, status_sample


class Template:
    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_a_conversation_is_asked_up_to_its_last_assistant_turn() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "bye"},
    ]
    assert prompt_of({"messages": messages}, Template()) == "<user>hi<assistant>hello<user>and?<assistant>"
    assert prompt_of({"prompt": "p", "completion": "c"}, Template()) == "p"
    assert prompt_of({"text": "plain"}, Template()) is None


def test_prompts_come_from_the_spec_else_eval_then_train() -> None:
    evals, train = [{"prompt": "e1"}], [{"text": "t"}, {"prompt": "t1"}, {"prompt": "t2"}]
    assert choose_prompts([], 2, [evals, train], Template()) == ["e1", "t1"]
    assert choose_prompts([], 3, [None, train], Template()) == ["t1", "t2"]
    assert choose_prompts(["mine"], 3, [evals, train], Template()) == ["mine"]
    assert choose_prompts(["a", "b"], 0, [evals], Template()) == ["a", "b"]


def test_the_status_holds_the_first_answer_cut_short(tmp_path: Path) -> None:
    rows = [{"prompt": "q", "answer": "x" * 1000, "baseAnswer": "y"}, {"prompt": "r", "answer": "z", "baseAnswer": ""}]
    sample = status_sample(rows, tmp_path / "samples.jsonl")
    assert sample["prompt"] == "q" and sample["baseAnswer"] == "y"
    assert len(sample["answer"]) == STATUS_CHARS and sample["answer"].endswith("\u2026")
