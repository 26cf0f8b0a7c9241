"""GGUF read back by real llama.cpp: the base + LoRA GGUF and the merged GGUF, written by
llama.cpp's own pinned converters (gguf_export.py), give the PEFT model's next-token logits.

llama.cpp runs through llama-cpp-python's bindings over libllama built from the same pinned
sdist (hack/llama_cpp.py builds it once into the cache: minutes the first time), and as the
`llama-server` and `llama-quantize` binaries built from that tree (`python -m hack.llama_cpp
tools`): the gguf-lora and gguf formats' `serve` commands of status.output are run as they are
and answer with the PEFT model's greedy tokens; q4_k_m, quantised by llama-quantize, predicts the
f16 file's next tokens. Token ids go in as Hugging Face's tokenizer makes them, so the comparison
is of the weights, not the tokenizers.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from finetune_trainer.model.tiny_model import make_tiny_model
from finetune_trainer.outputs.gguf_export import CONVERTERS_ENV, convert_lora, convert_model
from finetune_trainer.outputs.merge_stream import merge_folder
from hack import llama_cpp as pinned
from tests.support import steps

# The first run builds libllama (hack/llama_cpp.py; `make test` builds it before pytest starts):
# minutes on two busy cores, beyond the suite's per-test limit.
pytestmark = [pytest.mark.llama_cpp, pytest.mark.timeout(3600)]

PROMPTS = ["What sound does a cow make?", "Give the opposite of the word. hot", "Repeat the colours. red blue"]
# f16 weights against the fp32 model: logits of magnitude ~3 move by a few 1e-3; 0.05 holds
# with room (the measured figure is printed) and is far below the adapter's own effect (> 0.5).
F16_TOLERANCE = 0.05
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def llama() -> Any:
    """The pinned converters on FINETUNE_LLAMA_CPP and `llama_cpp` importable (built once)."""
    with steps.timed("llama.cpp: converters and bindings (built where not cached)"):
        os.environ[CONVERTERS_ENV] = str(pinned.converters())
        folder = str(pinned.python_package())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import llama_cpp

    return llama_cpp


@pytest.fixture(scope="module")
def exported(llama: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model, a trained-looking adapter, and every GGUF the job writes from them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gguf")
    base = make_tiny_model(root / "base", llama_tokenizer=True)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(root / "adapter"))
    merge_folder(base, root / "adapter", root / "merged")
    return {
        "base": base,
        "adapter": root / "adapter",
        "base.gguf": convert_model(base, root / "gguf" / "base-f16.gguf", "f16"),
        "adapter.gguf": convert_lora(root / "adapter", base, root / "gguf" / "adapter-f16.gguf", "f16"),
        "merged.gguf": convert_model(root / "merged", root / "gguf" / "merged-f16.gguf", "f16"),
    }


def _hf_logits(files: dict[str, Path]) -> tuple[list[list[int]], list[torch.Tensor], list[torch.Tensor]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(files["base"]))
    model = AutoModelForCausalLM.from_pretrained(str(files["base"]), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(model, str(files["adapter"])).eval()
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    with torch.no_grad():
        tuned = [peft(torch.tensor([i])).logits[0] for i in ids]
        with peft.disable_adapter():
            plain = [peft(torch.tensor([i])).logits[0] for i in ids]
    return ids, tuned, plain


def _llama_logits(llama: Any, model: Path, lora: Path | None, ids: list[int]) -> torch.Tensor:
    llm = llama.Llama(
        model_path=str(model),
        lora_path=str(lora) if lora else None,
        n_ctx=128,
        n_threads=2,
        logits_all=True,
        verbose=False,
    )
    llm.eval(ids)
    logits = torch.tensor(llm.scores[: len(ids)], dtype=torch.float32)
    llm.close()
    return logits


@pytest.mark.parametrize("form", ["base + lora", "merged"])
def test_llama_cpp_gives_the_peft_models_logits(llama: Any, exported: dict[str, Path], form: str) -> None:
    ids, tuned, plain = _hf_logits(exported)
    worst = 0.0
    for prompt_ids, expected, without in zip(ids, tuned, plain, strict=True):
        if form == "merged":
            got = _llama_logits(llama, exported["merged.gguf"], None, prompt_ids)
        else:
            got = _llama_logits(llama, exported["base.gguf"], exported["adapter.gguf"], prompt_ids)
        assert got.shape == expected.shape
        worst = max(worst, float((got - expected).abs().max()))
        # Greedy decoding agrees at every position, and the adapter's effect is far above the noise.
        assert torch.equal(got.argmax(-1), expected.argmax(-1)), form
        assert float((expected - without).abs().max()) > 10 * F16_TOLERANCE
    print(f"{form}: max |logit difference| llama.cpp f16 vs PEFT fp32 = {worst:.4f}")
    assert worst < F16_TOLERANCE


def test_the_llama_server_command_of_the_status_loads_in_llama_cpp(llama: Any, exported: dict[str, Path]) -> None:
    """What `llama-server -m BASE --lora ADAPTER` loads: the same two files, through the library."""
    from finetune_api.contract import gguf_adapter_file, gguf_base_file

    assert exported["base.gguf"].name == Path(gguf_base_file("f16")).name
    assert exported["adapter.gguf"].name == Path(gguf_adapter_file()).name
    llm = llama.Llama(
        model_path=str(exported["base.gguf"]), lora_path=str(exported["adapter.gguf"]), n_ctx=64, verbose=False
    )
    out = llm.create_completion("What sound does a cow make?", max_tokens=4, temperature=0.0)
    assert out["choices"][0]["text"] is not None
    llm.close()


def _tiny_job(tmp_path: Path, exported: dict[str, Path]) -> Any:
    """A trainer job folder over the exported tiny base and the alpaca sample data."""
    from finetune_trainer.model.tiny_model import write_alpaca
    from tests.trainer.conftest import make_job_dir

    assets = tmp_path / "assets"
    (assets / "models").mkdir(parents=True)
    (assets / "models" / "tiny-llama").symlink_to(exported["base"])
    write_alpaca(assets / "datasets" / "alpaca.jsonl")
    (tmp_path / "job").mkdir()
    return make_job_dir(tmp_path / "job", assets)


def test_a_trained_job_writes_every_format_and_its_gguf_answers_like_its_adapter(
    llama: Any, exported: dict[str, Path], tmp_path: Path
) -> None:
    """The trainer end to end: formats merged, gguf-lora and gguf after a short run, at the paths
    the status names, and llama.cpp's greedy tokens on them are PEFT's on the trained adapter."""
    from finetune_api import contract

    job = _tiny_job(tmp_path, exported)
    job.spec_changes = {
        "training": {"maxSteps": 6},
        "checkpoints": {"everySteps": 6},
        "output": {"formats": ["merged", "gguf-lora", "gguf"], "samples": {"count": 0}},
    }
    run = job.run(timeout=900, env={CONVERTERS_ENV: os.environ[CONVERTERS_ENV]})
    assert run.code == 0, run.stderr[-3000:]
    summary = json.loads((job.output / "summary.json").read_text())
    assert sorted(summary["formats"]) == ["gguf", "gguf-lora", "merged", "peft"]
    assert summary["formats"]["gguf"] == str(job.output / contract.gguf_merged_file("f16"))
    assert summary["formats"]["gguf-lora"] == str(job.output / contract.gguf_adapter_file())
    assert (job.output / contract.gguf_base_file("f16")).is_file()
    assert not (job.output / ".merged-for-gguf").exists()
    ids, tuned, _ = _hf_logits({"base": exported["base"], "adapter": job.output / "adapter"})
    for prompt_ids, expected in zip(ids, tuned, strict=True):
        lora = _llama_logits(
            llama, job.output / contract.gguf_base_file("f16"), job.output / contract.gguf_adapter_file(), prompt_ids
        )
        merged = _llama_logits(llama, job.output / contract.gguf_merged_file("f16"), None, prompt_ids)
        for got in (lora, merged):
            assert torch.equal(got.argmax(-1), expected.argmax(-1))
            assert float((got - expected).abs().max()) < F16_TOLERANCE


# --- llama-server: the status's command, run -------------------------------------------------

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def tools() -> Path:
    """llama-server and llama-quantize built from the pinned sdist's tree (once, into the cache)."""
    with steps.timed("llama.cpp: llama-server and llama-quantize (built where not cached)"):
        return pinned.tools()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status_commands(folder: Path, tools: Path) -> dict[str, list[str]]:
    """Each GGUF format's `serve` exactly as the operator writes it into status.output, with the
    output claim's folder mapped to `folder` and llama-server to the one built here."""
    from finetune_operator.builders import paths
    from finetune_operator.decide import output_status
    from tests.support.specs import OWNER, spec

    job = spec(output={"pvc": {"claimName": "outputs", "path": "runs/a"}, "formats": ["gguf-lora", "gguf"]})
    claim = paths.output_dir(OWNER.name, job)
    commands = {}
    for entry in output_status(OWNER, job)["formats"]:
        if entry["format"] in ("gguf-lora", "gguf"):
            words = shlex.split(entry["serve"])
            assert words[0] == "llama-server" and claim.startswith("/mnt/output/")
            mapped = [str(folder / w[len(claim) + 1 :]) if w.startswith(claim + "/") else w for w in words[1:]]
            commands[entry["format"]] = [str(tools / "llama-server"), *mapped]
    return commands


def _lay_out_claim(exported: dict[str, Path], folder: Path) -> Path:
    """The exported files where the job writes them on its output claim (contract's names)."""
    from finetune_api.contract import gguf_adapter_file, gguf_base_file, gguf_merged_file

    for key, name in (
        ("base.gguf", gguf_base_file("f16")),
        ("adapter.gguf", gguf_adapter_file()),
        ("merged.gguf", gguf_merged_file("f16")),
    ):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(exported[key])
    return folder


def _post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return dict(json.loads(response.read()))


def _serve_and_complete(command: list[str], prompts: list[list[int]]) -> list[list[int]]:
    """Run the command on a free local port, wait for /health, ask /completion greedily for each
    prompt (token ids, as Hugging Face's tokenizer made them) and stop the server."""
    port = _free_port()
    args = [*command, "--host", "127.0.0.1", "--port", str(port), "-c", "256", "-t", "1", "-np", "1"]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"llama-server exited {server.returncode}: {server.stderr.read()[-3000:]!r}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "llama-server not healthy within 120 s"
            time.sleep(0.5)
        answers = []
        for ids in prompts:
            out = _post(
                port,
                "/completion",
                {
                    "prompt": ids,
                    "n_predict": NEW_TOKENS,
                    "temperature": 0.0,
                    "top_k": 1,
                    "repeat_penalty": 1.0,
                    "ignore_eos": True,
                    "cache_prompt": False,
                    "return_tokens": True,
                },
            )
            assert out["tokens_evaluated"] == len(ids), out  # the ids as given, no BOS added
            answers.append([int(t) for t in out["tokens"]])
        return answers
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        server.stderr.close()  # type: ignore[union-attr]


def _hf_greedy(files: dict[str, Path], steps: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The PEFT model's (fp32) greedy tokens after each prompt, and the base's without the adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(files["base"]))
    model = AutoModelForCausalLM.from_pretrained(str(files["base"]), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(model, str(files["adapter"])).eval()
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]

    def greedy(prompt: list[int]) -> list[int]:
        tokens = list(prompt)
        for _ in range(steps):
            tokens.append(int(peft(torch.tensor([tokens])).logits[0, -1].argmax()))
        return tokens[len(prompt) :]

    with torch.no_grad():
        tuned = [greedy(i) for i in ids]
        with peft.disable_adapter():
            plain = [greedy(i) for i in ids]
    return ids, tuned, plain


def test_the_status_llama_server_commands_answer_as_the_peft_model(
    exported: dict[str, Path], tools: Path, tmp_path: Path
) -> None:
    """The gguf-lora and gguf formats' `serve` commands of status.output, run: llama-server's
    greedy tokens are the PEFT model's (fp32, Hugging Face). The base served without --lora
    answers otherwise, so a lost adapter fails this."""
    commands = _status_commands(_lay_out_claim(exported, tmp_path / "claim"), tools)
    assert set(commands) == {"gguf-lora", "gguf"}
    assert "--lora" in commands["gguf-lora"]
    ids, tuned, plain = _hf_greedy(exported, NEW_TOKENS)
    assert tuned != plain, "the adapter changes the greedy tokens"
    for form, command in commands.items():
        served = _serve_and_complete(command, ids)
        print(f"{form}: llama-server {served} / PEFT {tuned}")
        assert served == tuned, form
    without_lora = commands["gguf-lora"][: commands["gguf-lora"].index("--lora")]
    served = _serve_and_complete(without_lora, ids)
    print(f"base without --lora: llama-server {served} / base {plain}")
    assert served == plain
    assert served != tuned


# --- q4_k_m: llama-quantize on the converter's f16 file --------------------------------------

# Q4_K and Q6_K quantise rows in blocks of 256 (QK_K): the default tiny model's 64-wide rows
# would all fall back to q5_0/q8_0, so this model's rows are 256 and 512 wide.
WIDE = {"hidden": 256, "intermediate": 512}
Q4_PROMPTS = [*PROMPTS, "### Instruction:\nName a colour.\n\n### Response:\n"]
# Measured on this random-init model (seeds 0 and 1), q4_k_m against f16 in llama.cpp: logits of
# std 2.3-2.5 move by at most 1.1-1.5 (q8_0: 0.13-0.17), each position's logits correlate with
# the f16's at >= 0.985, and the greedy token differs only where the f16's two best logits lie
# within 0.45 of each other (a random model's predictions are that flat at many positions).
# So: correlation >= 0.98, no logit off by 2 or more, and the same greedy token wherever the
# f16's margin is above 1 (a flip needs the two logits to move 1 apart, beyond every case seen).
Q4_MIN_CORRELATION = 0.98
Q4_MAX_DIFFERENCE = 2.0
Q4_CLEAR_MARGIN = 1.0


def _tensor_types(path: Path) -> set[str]:
    sys.path.insert(0, str(pinned.converters() / "gguf-py"))
    try:
        from gguf import GGUFReader

        return {tensor.tensor_type.name for tensor in GGUFReader(str(path)).tensors}
    finally:
        sys.path.remove(str(pinned.converters() / "gguf-py"))


def test_q4_k_m_loads_in_llama_cpp_and_predicts_the_f16_models_next_tokens(
    llama: Any, tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    from finetune_trainer.outputs.gguf_export import QUANTIZE_ENV

    monkeypatch.setenv(QUANTIZE_ENV, str(tools / "llama-quantize"))
    model = make_tiny_model(tmp_path / "wide", llama_tokenizer=True, **WIDE)
    f16 = convert_model(model, tmp_path / "gguf" / "merged-f16.gguf", "f16")
    q4 = convert_model(model, tmp_path / "gguf" / "merged-q4_k_m.gguf", "q4_k_m")
    assert sorted(p.name for p in q4.parent.iterdir()) == ["merged-f16.gguf", "merged-q4_k_m.gguf"], "f16 left over"
    assert {"Q4_K", "Q6_K"} <= _tensor_types(q4), _tensor_types(q4)
    assert q4.stat().st_size < f16.stat().st_size / 2
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    worst, lowest, clear, agree, positions = 0.0, 1.0, 0, 0, 0
    for prompt in Q4_PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        full = _llama_logits(llama, f16, None, ids)
        quantised = _llama_logits(llama, q4, None, ids)
        worst = max(worst, float((quantised - full).abs().max()))
        for got, expected in zip(quantised, full, strict=True):
            lowest = min(lowest, float(torch.corrcoef(torch.stack([got, expected]))[0, 1]))
            best, second = expected.topk(2).values.tolist()
            same = int(got.argmax()) == int(expected.argmax())
            agree += same
            positions += 1
            if best - second > Q4_CLEAR_MARGIN:
                clear += 1
                assert same, f"{prompt!r}: q4_k_m's greedy token is not the f16's (margin {best - second:.3f})"
    print(
        f"q4_k_m vs f16: max |logit difference| {worst:.4f}, lowest correlation {lowest:.4f}, "
        f"greedy token agrees at {agree}/{positions} positions ({clear} with a clear margin)"
    )
    assert worst < Q4_MAX_DIFFERENCE
    assert lowest >= Q4_MIN_CORRELATION
    assert clear >= 5, "enough positions with a clear greedy token to compare"


def test_q4_k_m_without_llama_quantize_fails_in_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from finetune_trainer.outputs.gguf_export import QUANTIZE_ENV, GgufError, check_tools

    monkeypatch.setenv(QUANTIZE_ENV, str(tmp_path / "nowhere" / "llama-quantize"))
    with pytest.raises(GgufError) as named:
        convert_model(tmp_path, tmp_path / "merged-q4_k_m.gguf", "q4_k_m")
    assert "llama-quantize" in str(named.value) and "\n" not in str(named.value)
    monkeypatch.delenv(QUANTIZE_ENV)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(CONVERTERS_ENV, str(pinned.converters()))
    with pytest.raises(GgufError, match=r"^llama-quantize is missing") as missing:
        check_tools("q4_k_m")
    assert "\n" not in str(missing.value)
    check_tools("f16")  # the converters alone


def test_a_q4_k_m_job_without_llama_quantize_fails_before_training_in_one_line(
    tiny_assets: Path, tmp_path: Path
) -> None:
    from tests.trainer.conftest import make_job_dir

    job = make_job_dir(tmp_path, tiny_assets)
    job.spec_changes = {"output": {"formats": ["gguf"], "ggufType": "q4_k_m"}}
    missing = tmp_path / "nowhere" / "llama-quantize"
    run = job.run(timeout=300, env={CONVERTERS_ENV: str(pinned.converters()), "FINETUNE_LLAMA_QUANTIZE": str(missing)})
    assert run.code == 10, run.stderr[-3000:]  # InvalidConfig: not retried
    assert run.termination.startswith(f"InvalidConfig: spec.output.ggufType: llama-quantize is not at {missing}")
    assert "\n" not in run.termination.strip()
    assert not run.of("progress"), "failed before training"


def test_a_q4_k_m_job_writes_its_gguf_files_through_llama_quantize(
    llama: Any, tools: Path, exported: dict[str, Path], tmp_path: Path
) -> None:
    """The trainer end to end with ggufType q4_k_m: the base and merged GGUF at the status's
    paths, quantised (the tiny model's 64-wide rows take llama-quantize's fallback types), no f16
    left beside them, and llama.cpp loads them with the f16 adapter."""
    from finetune_api import contract

    job = _tiny_job(tmp_path, exported)
    job.spec_changes = {
        "training": {"maxSteps": 2},
        "checkpoints": {"everySteps": 2},
        "output": {"formats": ["gguf-lora", "gguf"], "ggufType": "q4_k_m", "samples": {"count": 0}},
    }
    env = {CONVERTERS_ENV: os.environ[CONVERTERS_ENV], "FINETUNE_LLAMA_QUANTIZE": str(tools / "llama-quantize")}
    run = job.run(timeout=900, env=env)
    assert run.code == 0, run.stderr[-3000:]
    summary = json.loads((job.output / "summary.json").read_text())
    assert summary["formats"]["gguf"] == str(job.output / contract.gguf_merged_file("q4_k_m"))
    base, merged = job.output / contract.gguf_base_file("q4_k_m"), job.output / contract.gguf_merged_file("q4_k_m")
    assert sorted(p.name for p in (job.output / contract.GGUF_DIR).iterdir()) == sorted(
        [base.name, merged.name, Path(contract.gguf_adapter_file()).name]
    )
    assert _tensor_types(merged) - {"F32", "F16"}, "quantised"
    ids = [1, 5, 9, 13]
    for model, lora in ((base, job.output / contract.gguf_adapter_file()), (merged, None)):
        assert torch.isfinite(_llama_logits(llama, model, lora, ids)).all()
