"""`ftjob validate` warns of vLLM's LoRA rank limit; `ftjob status` prints how to serve the result."""

from pathlib import Path

import yaml

from finetune_cli.jobs import describe
from finetune_operator.decide import output_status
from tests.support.cli import REPO, ftjob
from tests.support.specs import OWNER, spec

EXAMPLE_TINY = REPO / "examples" / "tiny-job.yaml"


def _job(tmp_path: Path, r: int) -> str:
    body = yaml.safe_load(EXAMPLE_TINY.read_text())
    body["spec"].setdefault("lora", {})["r"] = r
    path = tmp_path / f"job-{r}.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_validate_warns_above_rank_16_naming_max_lora_rank(tmp_path: Path) -> None:
    high = ftjob("validate", _job(tmp_path, 48))
    assert high.returncode == 0, (high.stdout, high.stderr)
    warning = [line for line in high.stdout.splitlines() if ": warning: " in line]
    assert len(warning) == 1 and "--max-lora-rank 64" in warning[0], high.stdout
    low = ftjob("validate", _job(tmp_path, 16))
    assert low.returncode == 0 and "warning" not in low.stdout, low.stdout


def test_status_prints_base_rank_and_a_command_per_format() -> None:
    s = spec(model={"source": {"hub": {"id": "org/tiny"}}}, output={"formats": ["gguf-lora"]}, lora={"r": 32})
    job = {
        "metadata": {"name": "tiny", "namespace": "team-a"},
        "spec": {},
        "status": {
            "phase": "Succeeded",
            "output": output_status(OWNER, s),
            "sample": {"prompt": "Say hi", "answer": "hi there"},
        },
    }
    text = describe(job)
    assert "Adapter:     base org/tiny, rank 32, alpha 16" in text, text
    assert "Serve peft:  vllm serve org/tiny --enable-lora --lora-modules tiny=" in text, text
    assert "Serve gguf-lora: llama-server -m /mnt/output/" in text, text
    assert "--max-lora-rank 32" in text
    assert "Sample:      'Say hi' -> 'hi there'" in text
