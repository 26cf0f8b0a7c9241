"""`ftjob compare`'s table as a pure builder: only the settings that differ, as dotted paths, then
each figure as base -> tuned side by side, from evaluation.json where it was read, else the status."""

import json
from typing import Any

from finetune_cli.compare import Figure, JobView, compare_table, file_figures, job_view, render_json, render_text


def job(name: str, rate: float, evaluation: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    spec = {
        "model": {"source": {"pvc": {"claimName": "models", "path": "tiny"}}},
        "training": {"learningRate": rate, "maxSteps": 30, **training},
        "lora": {"r": 8, "targetModules": ["q_proj", "v_proj"]},
    }
    return {"metadata": {"name": name}, "spec": spec, "status": {"evaluation": evaluation} if evaluation else {}}


EVALUATION = {"step": 30, "base": {"loss": 2.31, "perplexity": 10.07}, "tuned": {"loss": 1.05, "perplexity": 2.86}}
FILE = {
    "version": 1,
    "step": 30,
    "figures": [
        {"name": "loss", "base": 2.31, "tuned": 2.5, "better": "lower"},
        {"name": "rougeL", "base": 0.1, "tuned": 0.8, "better": "higher"},
        {"name": "rewardMargin", "base": None, "tuned": 1.5, "better": "higher"},
    ],
}


def test_only_differing_settings_then_figures_side_by_side() -> None:
    first = job_view(job("a", 0.01, EVALUATION), None)
    second = job_view(job("b", 1e-9, EVALUATION, seed=7), json.dumps(FILE).encode())
    table = compare_table([first, second])
    assert table.header == ["", "a", "b"]
    assert table.settings == [["training.learningRate", "0.01", "1e-09"], ["training.seed", "-", "7"]]
    rows = {row[0]: row[1:] for row in table.figures}
    assert rows["evaluation"] == ["status", "evaluation.json"]
    assert rows["evaluated at step"] == ["30", "30"]
    assert rows["loss"] == ["2.31 -> 1.05", "2.31 -> 2.5 (worse)"]  # the status knows no direction
    assert rows["perplexity"] == ["10.07 -> 2.86", "-"]
    assert rows["rougeL"] == ["-", "0.1 -> 0.8 (better)"]
    assert rows["rewardMargin"] == ["-", "- -> 1.5"]
    assert list(rows) == ["evaluation", "evaluated at step", "loss", "perplexity", "rougeL", "rewardMargin"]


def test_the_text_table_lines_up_and_says_when_nothing_differs() -> None:
    same = [job_view(job(name, 0.01), None) for name in ("a", "b", "c")]
    text = render_text(compare_table(same))
    assert "(no setting differs)" in text and "evaluation" in text
    assert [line.split()[1:] for line in text.splitlines() if line.startswith("evaluation ")] == [["none"] * 3]
    lines = render_text(compare_table([job_view(job("a", 0.01), None), job_view(job("bb", 0.02), None)])).splitlines()
    assert lines[0].split() == ["SETTING", "a", "bb"] and lines[1].split() == ["training.learningRate", "0.01", "0.02"]
    assert lines[0].index("a") == lines[1].index("0.01")  # columns line up


def test_json_keeps_the_values_and_every_jobs_figures() -> None:
    views = [JobView("a", {"training": {"learningRate": 0.01}}, [Figure("loss", 2.0, 1.0, "lower")], "status", 3)]
    views.append(JobView("b", {"training": {"learningRate": 0.02}}))
    out = json.loads(render_json(views))
    assert out["settings"] == {"training.learningRate": [0.01, 0.02]}
    assert out["jobs"][0]["figures"] == {"loss": {"base": 2.0, "tuned": 1.0, "better": "lower"}}
    assert out["jobs"][1] == {"name": "b", "source": "none", "step": None, "figures": {}}


def test_an_evaluation_json_that_does_not_parse_leaves_the_status() -> None:
    assert file_figures(b"{broken") is None and file_figures(b"[]") is None
    view = job_view(job("a", 0.01, EVALUATION), b"{broken")
    assert view.source == "status" and [f.name for f in view.figures] == ["loss", "perplexity"]
