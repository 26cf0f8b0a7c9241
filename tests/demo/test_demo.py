"""The demo's own parts that run without a cluster: the script parses, the loss curve reads
what the trainer writes (its JSON progress lines, or a checkpoint's trainer_state.json)."""

import json
import subprocess
from pathlib import Path

from hack.demo import loss_curve
from tests.support.helm import REPO

PROGRESS = [
    "2026-11-30 01:58:00,000 INFO finetune_trainer: starting",
    '{"event":"progress","step":1,"totalSteps":3,"loss":7.0}',
    '{"event":"progress","step":2,"totalSteps":3,"loss":6.0}',
    '{"event":"checkpoint","step":2,"path":"/mnt/output/tiny/checkpoints/checkpoint-2"}',
    # A retried attempt resumes at step 2 and logs it again: the later value wins.
    '{"event":"progress","step":2,"totalSteps":3,"loss":5.5}',
    '{"event":"progress","step":3,"totalSteps":3,"loss":"NaN"}',
    '{"event":"progress","step":3,"totalSteps":3,"loss":5.0}',
]


def test_demo_script_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "hack" / "demo.sh")], check=True)


def test_loss_points_come_from_progress_lines(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text("\n".join(PROGRESS) + "\n")
    assert loss_curve.collect([log]) == {1: 7.0, 2: 5.5, 3: 5.0}


def test_loss_points_fall_back_to_the_newest_checkpoint_state(tmp_path: Path) -> None:
    for step, history in ((10, [1.0]), (20, [1.0, 0.5])):
        folder = tmp_path / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        entries = [{"step": i + 1, "loss": loss} for i, loss in enumerate(history)]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": [*entries, {"step": 2, "eval_loss": 9}]}))
    assert loss_curve.collect([tmp_path]) == {1: 1.0, 2: 0.5}


def test_plot_writes_a_png_and_too_few_points_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text("\n".join(PROGRESS) + "\n")
    out = tmp_path / "adapter-side" / "loss-curve.png"
    assert loss_curve.main([str(out), str(log)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.log"
    empty.write_text("no progress here\n")
    assert loss_curve.main([str(tmp_path / "none.png"), str(empty)]) == 1
    assert not (tmp_path / "none.png").exists()
