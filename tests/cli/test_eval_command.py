"""`ftjob eval` without a cluster: the task folder is read and checked before anything is sent (a
file that does not parse, a key lm-evaluation-harness rejects, a missing data file, a task that is
not a generation task: each refused in one line naming it), and lm-evaluation-harness's own results
become the table, through the loopback relay that sets each run's adapter. The relay forwards here
to a stand-in for llama-server's chat endpoint; on the cluster it is the service proxy and a real
llama-server (tests/operator/test_e2e_serving.py)."""

import argparse
import json
import shutil
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from finetune_cli.errors import CliError
from finetune_cli.eval_claim import ClaimFolder, claim_folder
from finetune_cli.eval_relay import Relay
from finetune_cli.eval_table import Row, document, rows, text
from finetune_cli.eval_tasks import ENV, checked
from finetune_cli.lm_eval_run import columns_of, measure
from tests.support.cli import REPO, assert_one_line_error, ftjob, ftjob_process

EXAMPLE = REPO / "examples" / "eval-tasks"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the command sets for itself, undone after each test (datasets keeps what it read)."""
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the example folder, to break."""
    copy = tmp_path / "tasks"
    shutil.copytree(EXAMPLE, copy)
    return copy


def test_the_example_folder_is_read_with_its_data_files_next_to_the_yamls() -> None:
    tasks = checked(EXAMPLE)
    assert sorted(t.name for t in tasks) == ["colours", "cow_sound"]
    for task in tasks:
        data = Path(task.config["dataset_kwargs"]["data_files"]["test"])
        assert data.is_absolute() and data.parent == EXAMPLE.resolve(), data
        assert task.config["output_type"] == "generate_until"  # from the included template


def test_a_yaml_that_does_not_parse_is_refused_naming_the_file_and_line_before_any_cluster(folder: Path) -> None:
    broken = folder / "cow.yaml"
    broken.write_text(broken.read_text().replace("task: cow_sound", "task: cow_sound\n  answer: [moo"))
    # A kubeconfig that names no cluster: the refusal comes before the command looks for one.
    done = ftjob_process("eval", "pair", "--tasks", str(folder), env={"KUBECONFIG": str(folder / "none")})
    number = broken.read_text().splitlines().index("  answer: [moo") + 1
    line = assert_one_line_error(done)
    assert line.startswith(f"error: {broken}: line {number}: mapping values are not allowed"), line


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (("task: colours", "task: colours\nanswer_key: answer"), "colours.yaml: unknown key 'answer_key' (not a field"),
        (("test: colours.jsonl", "test: colors.jsonl"), "colours.yaml: dataset_kwargs.data_files.test: data file "
         "colors.jsonl not found (read relative to the YAML's folder)"),
        (("include: _answers_template\n", ""), "colours.yaml: no dataset_path: ftjob eval reads tasks offline"),
        (("include: _answers_template", "include: _answer_template"), "colours.yaml: no such file "),
    ],
    ids=["unknown key", "missing data file", "no dataset", "missing include"],
)  # fmt: skip
def test_a_task_lm_eval_would_not_build_is_refused_naming_its_file(
    folder: Path, change: tuple[str, str], said: str
) -> None:
    path = folder / "colours.yaml"
    assert change[0] in path.read_text()
    path.write_text(path.read_text().replace(*change))
    done = ftjob("eval", "pair", "--tasks", str(folder))
    assert_one_line_error(done, f"error: {folder}/{said}")


def test_a_loglikelihood_task_is_refused_naming_it(folder: Path) -> None:
    (folder / "choice.yaml").write_text(
        "include: _answers_template\ntask: cow_choice\noutput_type: multiple_choice\ndoc_to_choice: [moo, baa]\n"
        "doc_to_target: 0\nmetric_list: [{metric: acc}]\ndataset_kwargs: {data_files: {test: cow.jsonl}}\n"
    )
    done = ftjob("eval", "pair", "--tasks", str(folder))
    assert_one_line_error(done, "error: ftjob eval runs generation tasks only", "not: cow_choice (choice.yaml: "
                          "multiple_choice)")  # fmt: skip
    assert "colours" not in done.stderr and "cow_sound" not in done.stderr


def test_a_file_that_is_neither_task_group_nor_included_is_refused(folder: Path) -> None:
    (folder / "notes.yaml").write_text("tsak: typo\n")
    assert_one_line_error(ftjob("eval", "pair", "--tasks", str(folder)), f"{folder}/notes.yaml: not a task")


def test_a_claim_folder_is_named_pvc_claim_path() -> None:
    assert claim_folder("examples/eval-tasks") is None
    assert claim_folder("pvc:datasets/eval/tasks/") == ClaimFolder("datasets", "eval/tasks")
    assert claim_folder("pvc:datasets") == ClaimFolder("datasets", "")
    assert ClaimFolder("datasets", "").shown == "pvc:datasets"
    for wrong in ("pvc:", "pvc:/tasks", "pvc:datasets/../other"):
        with pytest.raises(CliError, match="expected pvc:CLAIM/PATH"):
            claim_folder(wrong)


def test_data_files_may_be_a_pattern_or_a_list_beside_the_yaml(folder: Path) -> None:
    (folder / "data").mkdir()
    shutil.move(folder / "colours.jsonl", folder / "data" / "colours-1.jsonl")
    path = folder / "colours.yaml"
    path.write_text(path.read_text().replace("test: colours.jsonl", "test: [data/colours-*.jsonl, cow.jsonl]"))
    colours = next(t for t in checked(folder) if t.name == "colours")
    assert colours.config["dataset_kwargs"]["data_files"]["test"] == [
        str(folder.resolve() / "data" / "colours-*.jsonl"), str(folder.resolve() / "cow.jsonl")
    ]  # fmt: skip
    path.write_text(path.read_text().replace("data/colours-*", "data/colors-*"))
    assert_one_line_error(ftjob("eval", "pair", "--tasks", str(folder)), "data file data/colors-*.jsonl not found")


def test_without_lm_eval_the_command_says_to_install_the_extra(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` meets where it is not installed
    monkeypatch.setitem(sys.modules, "lm_eval.tasks", None)
    monkeypatch.setitem(sys.modules, "lm_eval.tasks._yaml_loader", None)
    line = assert_one_line_error(ftjob("eval", "pair", "--tasks", str(folder)))
    assert line == "error: ftjob eval needs lm-evaluation-harness: pip install 'finetune-cli[eval]'"


def test_no_folder_and_no_tasks_are_one_line_each(tmp_path: Path) -> None:
    assert_one_line_error(ftjob("eval", "pair", "--tasks", str(tmp_path / "nope")), "no such folder")
    assert_one_line_error(ftjob("eval", "pair", "--tasks", str(tmp_path)), "no task YAML")


# --- the runs and the table ------------------------------------------------------------------------

ANSWERS = {0: "A cow says moo.", 1: "red, green, blue."}


class StandIn:
    """What the relay forwards, kept, and answered as the cluster test's tiny adapters answer:
    adapter 0 says moo to everything, adapter 1 the colours, the base something else."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def forward(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.sent.append({"path": path, **body})
        lora = body["lora"]
        answer = ANSWERS[lora[0]["id"]] if lora else "I do not know."
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}

    def runs(self, concurrent: int) -> dict[str, dict[str, Any]]:
        tasks = checked(EXAMPLE)
        args = argparse.Namespace(limit=None, concurrent=concurrent)
        runs = {}
        with Relay(self.forward) as relay:
            for column, lora in [
                ("base", []),
                ("moo", [{"id": 0, "scale": 1.0}]),
                ("colours", [{"id": 1, "scale": 1.0}]),
            ]:
                relay.lora = lora
                runs[column] = measure(tasks, relay, "pair", args)
        return runs


def test_each_run_sends_its_adapter_and_the_table_holds_lm_evals_figures() -> None:
    import sacrebleu

    stand_in = StandIn()
    runs = stand_in.runs(concurrent=2)
    sent = stand_in.sent
    assert len(sent) == 12  # 3 runs x 4 questions
    assert {s["path"] for s in sent} == {"v1/chat/completions"}
    assert sorted(json.dumps(s["lora"]) for s in sent) == sorted(
        ["[]"] * 4 + ['[{"id": 0, "scale": 1.0}]'] * 4 + ['[{"id": 1, "scale": 1.0}]'] * 4
    )
    asked = {s["messages"][-1]["content"] for s in sent}
    assert asked == {"What sound does a cow make?", "What does a cow say?", "Repeat the colours. red blue",
                     "Repeat the colours. green red"}  # fmt: skip
    columns = ["base", "moo", "colours"]
    table = rows(columns, runs)
    assert [(r.task, r.metric, r.samples) for r in table] == [
        ("colours", "exact_match", 2), ("colours", "chrf", 2), ("cow_sound", "exact_match", 2), ("cow_sound", "chrf", 2)
    ]  # fmt: skip
    cells = {(r.task, r.metric): r.values for r in table}
    assert cells["cow_sound", "exact_match"] == {"base": 0.0, "moo": 1.0, "colours": 0.0}
    assert cells["colours", "exact_match"] == {"base": 0.0, "moo": 0.0, "colours": 1.0}
    # chrF as sacrebleu scores the same answers against the references (lm-evaluation-harness's corpus chrF).
    for column, said in [("base", "I do not know."), ("moo", ANSWERS[0]), ("colours", ANSWERS[1])]:
        for task, reference in [("cow_sound", ANSWERS[0]), ("colours", ANSWERS[1])]:
            expected = sacrebleu.corpus_chrf([said, said], [[reference, reference]]).score
            assert cells[task, "chrf"][column] == pytest.approx(expected), (task, column)
    assert all(r.higher_is_better is True for r in table)


def test_the_table_reads_as_columns_and_json() -> None:
    table = [
        Row("cow_sound", "exact_match", 2, True, {"base": 0.0, "moo": 1.0, "colours": None}),
        Row("colours", "chrf", 2, None, {"base": 3.78787, "moo": 3.78787, "colours": 100.0}),
    ]
    assert text(["base", "moo", "colours"], table).splitlines() == [
        "TASK        METRIC          N   BASE     moo      colours",
        "cow_sound   exact_match ↑   2   0.0000   1.0000   -",
        "colours     chrf            2   3.7879   3.7879   100.0000",
    ]
    said = document("pair", ["base", "moo", "colours"], {"moo": 0, "colours": 1}, table)
    assert said["columns"] == [{"name": "base"}, {"name": "moo", "adapter": 0}, {"name": "colours", "adapter": 1}]
    assert said["rows"][0] == {"task": "cow_sound", "metric": "exact_match", "samples": 2, "higherIsBetter": True,
                               "values": {"base": 0.0, "moo": 1.0, "colours": None}}  # fmt: skip


def test_lm_eval_result_keys_become_rows_per_filter_without_standard_errors() -> None:
    results = {
        "results": {"t": {"alias": "t", "exact_match,none": 0.5, "exact_match_stderr,none": 0.1,
                          "exact_match,strict": 0.25, "sample_len": 4}},
        "higher_is_better": {"t": {"exact_match": True}},
        "n-samples": {"t": {"original": 8, "effective": 4}},
    }  # fmt: skip
    table = rows(["base", "a"], {"base": results})
    assert [(r.metric, r.samples, r.higher_is_better, r.values) for r in table] == [
        ("exact_match", 4, True, {"base": 0.5, "a": None}),
        ("exact_match (strict)", 4, True, {"base": 0.25, "a": None}),
    ]


def test_the_columns_are_every_adapter_or_the_ones_named() -> None:
    server = {"metadata": {"name": "pair"}, "status": {"adapters": [{"id": 0, "job": "moo"}, {"id": 1, "path": "x"}]}}
    assert columns_of(server, []) == {"moo": 0, "1": 1}
    assert columns_of(server, ["1", "moo", "1"]) == {"1": 1, "moo": 0}
    with pytest.raises(CliError, match="serves no adapter 'baa'"):
        columns_of(server, ["baa"])
    named_base = {"metadata": {"name": "pair"}, "status": {"adapters": [{"id": 0, "job": "base"}]}}
    assert columns_of(named_base, []) == {"base (id 0)": 0}


def test_the_relay_answers_a_failure_of_the_proxy_as_json_and_keeps_the_first() -> None:
    def refuse(path: str, body: dict[str, Any]) -> dict[str, Any]:
        raise CliError(f"service pair-server: HTTP 503: Loading model ({path})")

    with Relay(refuse) as relay:
        request = urllib.request.Request(relay.url("v1/chat/completions"), data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 502
    assert json.loads(refused.value.read()) == {"error": {"message": relay.failure}}
    assert relay.failure == "service pair-server: HTTP 503: Loading model (v1/chat/completions)"
