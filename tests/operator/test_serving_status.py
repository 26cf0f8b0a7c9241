"""status.output says what the job writes and how to serve each format (builders/serving.py)."""

import pytest

from finetune_api.formats.peft import lora_rank_warning, vllm_max_lora_rank
from finetune_operator.decide import output_status
from tests.support.specs import OWNER, spec

GGUF_ALL = {"pvc": {"claimName": "outputs", "path": "runs/a"}, "formats": ["gguf", "gguf-lora", "merged"]}


def test_every_format_is_listed_in_order_with_its_claim_path_and_command():
    s = spec(
        model={"source": {"hub": {"id": "org/tiny"}}},
        output={**GGUF_ALL, "ggufType": "q8_0"},
        lora={"r": 32, "alpha": 64, "targetModules": ["q_proj", "v_proj"]},
    )
    out = output_status(OWNER, s)
    shape = (out["baseModel"], out["rank"], out["alpha"], out["targetModules"])
    assert shape == ("org/tiny", 32, 64, ["q_proj", "v_proj"])
    by_format = {f["format"]: f for f in out["formats"]}
    assert list(by_format) == ["peft", "merged", "gguf-lora", "gguf"]
    assert all(f["claimName"] == "outputs" for f in out["formats"])
    root = "/mnt/output/runs/a"
    assert by_format["peft"]["serve"] == (
        f"vllm serve org/tiny --enable-lora --lora-modules tiny={root}/adapter --max-lora-rank 32"
    )
    assert by_format["merged"]["serve"] == f"vllm serve {root}/merged"
    assert by_format["gguf-lora"]["serve"] == (
        f"llama-server -m {root}/gguf/base-q8_0.gguf --lora {root}/gguf/adapter-f16.gguf"
    )
    assert by_format["gguf"]["serve"] == f"llama-server -m {root}/gguf/merged-q8_0.gguf"
    assert out["mergedPath"] == f"{root}/merged"
    assert "--max-lora-rank 32" in out["warning"]


def test_the_public_name_wins_over_the_pvc_folder():
    s = spec(model={"source": {"pvc": {"claimName": "models", "path": "llama"}}, "name": "meta-llama/Llama-3.2-1B"})
    assert output_status(OWNER, s)["baseModel"] == "meta-llama/Llama-3.2-1B"
    folder = spec(model={"source": {"pvc": {"claimName": "models", "path": "llama"}}})
    assert output_status(OWNER, folder)["baseModel"] == "/mnt/model/llama"


@pytest.mark.parametrize(("r", "flag"), [(1, 1), (8, 8), (9, 16), (16, 16), (17, 32), (200, 256), (256, 256)])
def test_max_lora_rank_is_the_smallest_vllm_allows(r: int, flag: int) -> None:
    assert vllm_max_lora_rank(r) == flag
    assert (lora_rank_warning(r) is None) == (r <= 16)
