"""report.html of a real run, opened in a real browser: the trainer trains the tiny model on
learnable data with a held-out split, writes evaluation.json and report.html beside the adapter, and
headless Chromium (Debian's, installed by hack/chromium.py where missing) renders it. The page has
the curves (inlined PNGs), the base-against-tuned table row by row as evaluation.json has it, and
the answers beside the reference; its screenshot is not blank."""

import base64
import io
import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageStat

from finetune_api.layout import EVALUATION_FILE, REPORT_FILE
from finetune_trainer.reporting.report import number
from hack.chromium import HEADLESS_FLAGS, install
from tests.trainer.conftest import JobDir, Run

# Not imported here, but run: the trainer's stack, in a subprocess.
pytestmark = pytest.mark.trainer

WINDOW = (1200, 2400)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> tuple[Path, Run]:
    """One run shared by every test here: 16 steps, a quarter of the data held out, two answers."""
    root = tmp_path_factory.mktemp("report-run")
    (root / "models").symlink_to(tiny_assets / "model")
    (root / "datasets").symlink_to(tiny_assets / "data" / "tiny")
    (root / "outputs").mkdir()
    changes = {
        "dataset": {"evalFraction": 0.25},
        "training": {"maxSteps": 16},
        "checkpoints": {"everySteps": 8, "keep": 2},
        "evaluation": {"generate": {"count": 2, "maxNewTokens": 8}},
        "output": {"samples": {"count": 0}},
    }
    job = JobDir(root, changes)
    run = job.run(timeout=900)
    assert run.code == 0, run.stderr[-3000:]
    return job.output, run


@pytest.fixture(scope="module")
def chromium() -> Path:
    return install()


def browse(chromium: Path, page: Path, profile: Path, *action: str) -> subprocess.CompletedProcess[bytes]:
    command = [str(chromium), *HEADLESS_FLAGS, f"--user-data-dir={profile}", *action, page.as_uri()]
    result = subprocess.run(command, capture_output=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


class Dom(HTMLParser):
    """What the browser's DOM holds: the images' sources, each figure row's cells, the answers' cells."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[str] = []
        self.rows: dict[str, list[str]] = {}
        self.answers: list[str] = []
        self._row: str | None = None
        self._pre: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "img":
            self.images.append(found.get("src") or "")
        if tag == "tr" and found.get("data-figure"):
            self._row = found["data-figure"]
            self.rows[self._row or ""] = []
        if tag == "pre" and "class" not in found:
            self._pre = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        if tag == "pre" and self._pre is not None:
            self.answers.append("".join(self._pre))
            self._pre = None

    def handle_data(self, data: str) -> None:
        if self._pre is not None:
            self._pre.append(data)
        elif self._row is not None and data.strip():
            self.rows[self._row].append(data.strip())


@pytest.fixture(scope="module")
def opened(trained: tuple[Path, Run], chromium: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Dom, Path]:
    output, _ = trained
    folder = tmp_path_factory.mktemp("browser")
    dom = browse(chromium, output / REPORT_FILE, folder / "profile", "--dump-dom").stdout.decode()
    shot = folder / "report.png"
    size = ",".join(str(side) for side in WINDOW)
    browse(chromium, output / REPORT_FILE, folder / "profile", f"--screenshot={shot}", f"--window-size={size}")
    return Dom(dom), shot


def evaluation_of(output: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((output / EVALUATION_FILE).read_text(encoding="utf-8"))
    return loaded


def test_the_run_writes_the_report_beside_the_adapter(trained: tuple[Path, Run]) -> None:
    output, run = trained
    summary = json.loads((output / "summary.json").read_text(encoding="utf-8"))
    assert summary["reportPath"] == str(output / REPORT_FILE)
    assert [e["reportPath"] for e in run.of("done")] == [str(output / REPORT_FILE)]
    page = (output / REPORT_FILE).read_text(encoding="utf-8")
    # Self-contained: no script, no link, every source inlined.
    assert "<script" not in page and "<link" not in page and " href=" not in page
    assert page.count(" src='") == page.count(" src='data:image/png;base64,") > 0


def test_the_page_has_the_curves_as_inlined_pngs(opened: tuple[Dom, Path]) -> None:
    dom, _ = opened
    assert dom.images, "no curve"
    for source in dom.images:
        assert source.startswith("data:image/png;base64,")
        picture = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1])))
        assert picture.format == "PNG" and picture.width >= 500


def test_the_table_is_evaluation_jsons_and_says_the_tuned_loss_is_lower(
    trained: tuple[Path, Run], opened: tuple[Dom, Path]
) -> None:
    output, _ = trained
    dom, _ = opened
    figures = evaluation_of(output)["figures"]
    assert list(dom.rows) == [f["name"] for f in figures]
    for figure in figures:
        assert dom.rows[figure["name"]][1] == number(figure["base"])
        assert number(figure["tuned"]) in dom.rows[figure["name"]][2:4]
    loss = next(f for f in figures if f["name"] == "loss")
    assert loss["tuned"] < loss["base"]  # learnable data: training helped
    assert dom.rows["loss"][-1] == "tuned better"


def test_the_answers_are_evaluation_jsons_beside_the_reference(
    trained: tuple[Path, Run], opened: tuple[Dom, Path]
) -> None:
    output, _ = trained
    dom, _ = opened
    answers = evaluation_of(output)["answers"]
    assert answers
    expected = [answer[key] for answer in answers for key in ("reference", "base", "tuned")]
    assert dom.answers == expected


def test_the_screenshot_is_not_blank(opened: tuple[Dom, Path]) -> None:
    _, shot = opened
    picture = Image.open(shot).convert("L")
    assert picture.size == WINDOW
    spread = ImageStat.Stat(picture).stddev[0]
    inked = sum(count for shade, count in enumerate(picture.histogram()) if shade < 200) / (WINDOW[0] * WINDOW[1])
    assert spread > 20 and inked > 0.02, (spread, inked)
