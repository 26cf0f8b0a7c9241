"""report.html as a pure builder: the base-against-tuned table with the better side marked, the
answers beside the reference as evaluation.json has them, the curves inlined, every value escaped
and nothing that reaches outside the page; without an evaluation, the curves and summary alone."""

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from finetune_api.layout import EVALUATION_FILE, REPORT_FILE
from finetune_trainer.reporting import report

PNG = b"\x89PNG\r\n\x1a\n"


def evaluation_fixture() -> dict[str, Any]:
    """An evaluation.json of the shared schema (docs/evaluation.md)."""
    return {
        "version": 1,
        "method": "sft",
        "step": 30,
        "examples": 6,
        "split": "evalFraction",
        "figures": [
            {"name": "loss", "base": 2.31, "tuned": 1.05, "better": "lower"},
            {"name": "perplexity", "base": 10.07, "tuned": 2.86, "better": "lower"},
            {"name": "rougeL", "base": 0.5, "tuned": 0.25, "better": "higher"},
            {"name": "exactMatch", "base": 0.0, "tuned": 0.0, "better": "higher"},
            {"name": "rewardMargin", "base": None, "tuned": 1.5, "better": "higher"},
        ],
        "perExample": [{"index": 0, "base": 2.4, "tuned": 1.0}, {"index": 1, "base": 1.0, "tuned": 1.5}],
        "answers": [
            {
                "index": 3,
                "prompt": "Say <b>hi</b> & go",
                "reference": "hi <script>x</script>",
                "base": "hm",
                "tuned": "hi",
            }
        ],
        "seconds": {"base": 1.0, "tuned": 1.0, "generation": 2.0},
        "history": [{"step": 10, "figures": {"loss": 1.5, "perplexity": 4.48}}],
    }


class Page(HTMLParser):
    """The parts of a page the tests look at: tags with their attributes, and the text by row."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {key: value or "" for key, value in attrs}
        self.tags.append((tag, attributes))
        if tag == "tr" and "data-figure" in attributes:
            self._row = attributes["data-figure"]
            self.rows[self._row] = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and data.strip():
            self.rows[self._row].append(data.strip())


def build(evaluation: dict[str, Any] | None, pictures: list[report.Picture] | None = None) -> str:
    summary = {"finalStep": 30, "totalSteps": 30, "finalLoss": 0.9, "tokens": 1234, "hardware": {"gpu": "x<y"}}
    settings = {"training": {"learningRate": 0.01, "maxSteps": 30}, "lora": {"r": 8, "useDora": False}}
    return report.report_html("FineTuneJob team/<tiny>", summary, evaluation, pictures or [], settings)


def test_the_table_marks_the_better_side_and_says_how_many_figures_improved() -> None:
    page = Page(build(evaluation_fixture()))
    assert page.rows["loss"][:4] == ["loss", "2.31", "1.05", "✓ better"]
    assert page.rows["rougeL"][:3] == ["rougeL", "0.5", "✓ better"]  # higher is better: the base's 0.5
    assert "equal" in page.rows["exactMatch"] and "✓ better" not in page.rows["exactMatch"]
    assert page.rows["rewardMargin"][1:3] == ["—", "1.5"] and "✓ better" not in page.rows["rewardMargin"]
    assert list(page.rows) == [f["name"] for f in evaluation_fixture()["figures"]]  # display order kept
    text = build(evaluation_fixture())
    assert "The tuned model is better on 2 of 4 figures, the base on 1, equal on 1." in text
    assert "tuned better on 1, base better on 1, equal on 0 of 2" in text
    assert re.search(r"<th>10</th><td class='num'>1.5</td><td class='num'>4.48</td>", text)


def test_answers_are_evaluation_jsons_side_by_side_and_every_value_is_escaped() -> None:
    text = build(evaluation_fixture())
    [answer] = evaluation_fixture()["answers"]
    cells = re.findall(r"<td><pre>(.*?)</pre></td>", text)
    assert cells == ["hi &lt;script&gt;x&lt;/script&gt;", answer["base"], answer["tuned"]]
    assert "Say &lt;b&gt;hi&lt;/b&gt; &amp; go" in text
    assert "<script" not in text and "<b>hi" not in text and "&lt;tiny&gt;" in text
    assert "{&quot;gpu&quot;: &quot;x&lt;y&quot;}" in text  # a summary's mapping, as JSON, escaped


def test_pictures_are_inlined_png_data_and_nothing_reaches_outside_the_page(tmp_path: Path) -> None:
    png = PNG + b"rest-of-a-png"
    page = Page(build(evaluation_fixture(), [report.Picture("loss", png), report.Picture("reward", png)]))
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 2
    assert all(base64.b64decode(src.removeprefix("data:image/png;base64,")) == png for src in images)
    outside = [(tag, a) for tag, a in page.tags if tag in ("script", "link", "iframe") or "href" in a]
    assert not outside
    assert all(attrs["src"].startswith("data:") for tag, attrs in page.tags if "src" in attrs)


def test_without_an_evaluation_the_page_has_the_curves_and_the_summary_alone() -> None:
    text = build(None, [report.Picture("loss", PNG)])
    assert "No evaluation" in text and "Base against tuned" not in text and "<img" in text
    assert "<th>training.learningRate</th><td>0.01</td>" in text and "<th>finalStep</th><td>30</td>" in text
    assert "<th>lora.useDora</th><td>false</td>" in text


def test_write_reads_evaluation_json_and_the_curve_and_tolerates_a_broken_one(tmp_path: Path) -> None:
    (tmp_path / "loss-curve.png").write_bytes(PNG + b"curve")
    settings = {"training": {"learningRate": 0.01}, "resources": {"gpus": 0}}
    path = report.write(tmp_path, {"finalStep": 3}, settings, "FineTuneJob tiny")
    assert path == tmp_path / REPORT_FILE
    text = path.read_text(encoding="utf-8")
    assert "No evaluation" in text and "resources.gpus" not in text and text.count("<img") == 1

    (tmp_path / EVALUATION_FILE).write_text(json.dumps(evaluation_fixture()), encoding="utf-8")
    assert "data-figure='perplexity'" in report.write(tmp_path, {}, settings, "t").read_text()  # type: ignore[union-attr]
    (tmp_path / EVALUATION_FILE).write_text("{not json", encoding="utf-8")
    assert "No evaluation" in report.write(tmp_path, {}, settings, "t").read_text()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("base", "tuned", "better", "side"),
    [
        (2.0, 1.0, "lower", "tuned"),
        (2.0, 1.0, "higher", "base"),
        (1.00001, 1.00002, "lower", "equal"),
        (None, 1.0, "lower", None),
        (float("nan"), 1.0, "lower", None),
    ],
)
def test_the_better_side(base: float | None, tuned: float, better: str, side: str | None) -> None:
    assert report.better_side(base, tuned, better) == side


def test_reward_curves_are_drawn_when_the_run_logged_them() -> None:
    assert report.reward_png({"rewards/margins": {1: 0.1}}, "t") is None  # one point: no curve
    rewards = {"rewards/accuracies": {1: 0.5, 2: 0.75, 3: 1.0}, "rewards/margins": {1: 0.1, 2: 0.5, 3: 0.9}}
    drawn = report.reward_png(rewards, "t")
    assert drawn is not None and drawn[:8] == PNG and len(drawn) > 10_000


def test_the_reward_curves_are_read_from_the_runs_tensorboard_files(tmp_path: Path) -> None:
    """As progress.py logs a preference run's TRL figures (train/rewards/...), beside its loss."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path / "tensorboard"))
    for step in range(1, 5):
        for tag, value in (("train/loss", 1.0 / step), ("train/rewards/margins", 0.2 * step)):
            value_proto = Summary.Value(tag=tag, simple_value=value)
            writer.add_event(Event(wall_time=float(step), step=step, summary=Summary(value=[value_proto])))
        accuracy = Summary.Value(tag="train/rewards/accuracies", simple_value=step / 4)
        writer.add_event(Event(wall_time=float(step), step=step, summary=Summary(value=[accuracy])))
    writer.close()
    rewards = report.read_rewards(tmp_path / "tensorboard")
    assert sorted(rewards) == ["rewards/accuracies", "rewards/margins"]
    assert rewards["rewards/accuracies"] == {1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0}
    assert report.read_rewards(tmp_path / "none") == {}

    (tmp_path / "loss-curve.png").write_bytes(PNG + b"curve")
    page = report.write(tmp_path, {}, {}, "FineTuneJob dpo")
    assert page is not None
    assert re.findall(r"<img alt='([^']*)'", page.read_text()) == [
        "training and eval loss by step (learning rate dashed)",
        "implicit reward by step (accuracy, margin, chosen and rejected)",
    ]
