"""`ftjob plan` end to end: the example manifests, overrides, JSON, and bad input."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api import parse_file
from finetune_plan import GIB, choose, lookup
from tests.planning.models import LLAMA_3_8B, LLAMA_33_70B
from tests.support.cli import REPO, assert_one_line_error, ftjob

EXAMPLE_70B = str(REPO / "examples" / "llama-3.3-70b-4xp40.yaml")
EXAMPLE_TINY = str(REPO / "examples" / "tiny-job.yaml")


@pytest.fixture
def config_70b(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_33_70B))
    return str(path)


def test_70b_on_four_p40s_fits_and_prints_every_part(config_70b: str):
    result = ftjob("plan", EXAMPLE_70B, "--model-config", config_70b, "--tokens", "10000000")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for row in (
        "quantised weights",
        "embeddings + head",
        "LoRA + optimizer",
        "activations",
        "temporaries",
        "logits",
        "total",
        "headroom",
    ):
        assert row in out
    assert "GPU3" in out and out.splitlines()[1].startswith("FITS: 4 x Tesla-P40 in fsdp mode, peak")
    assert "parallelism fsdp, 4 processes" in out and "in fsdp mode, loss in chunks of 512 tokens" in out
    assert "tokens/s" in out and "epoch     10,000,000 tokens:" in out


def test_the_plan_names_the_attention_kernel_and_the_longest_sequence_per_mode(config_70b: str):
    """Each mode's longest maxLength on these GPUs, as `finetune_plan.lengths` bisects it."""
    from finetune_plan import Hardware, Recipe, shape_from_config
    from finetune_plan.lengths import longest_per_mode
    from finetune_plan.parallelism import TRAINER_LOSS_CHUNKS

    result = ftjob("plan", EXAMPLE_70B, "--model-config", config_70b)
    assert result.returncode == 0, result.stderr
    assert "attention sdpa_expanded in fp32 (k and v expanded to every head" in result.stdout
    p40 = lookup("Tesla-P40")
    assert p40 is not None
    recipe = Recipe(attention="memory_efficient", lora_dropout=True, offload_inputs=True)
    found = longest_per_mode(shape_from_config(LLAMA_33_70B), recipe, Hardware(4, p40, 22.4), TRAINER_LOSS_CHUNKS)
    line = next(x for x in result.stdout.splitlines() if x.startswith("longest "))
    assert f"fsdp {found['fsdp']}" in line and f"deviceMap {found['device_map']}" in line
    assert "dataParallel none" in line  # a whole 70B per P40 fits no length


def test_the_example_alone_is_planned_from_the_known_model_table():
    """No --model-config: the PVC folder is named after a model the planner knows."""
    result = ftjob("plan", EXAMPLE_70B, cwd=REPO / "examples")
    assert result.returncode == 0, result.stderr
    assert "FITS: 4 x Tesla-P40 in fsdp mode" in result.stdout
    assert "memory    fits on 4 x Tesla-P40 in fsdp mode" in result.stdout
    assert "80 layers" in result.stdout


def test_json_has_fits_mode_and_per_gpu_totals(config_70b: str):
    result = ftjob("plan", EXAMPLE_70B, "--model-config", config_70b, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["fits"] is True
    assert (plan["parallelism"], plan["processes"]) == ("fsdp", 4)
    assert len(plan["per_gpu"]) == 4
    assert all(0 < gpu["total_gib"] <= 22.4 for gpu in plan["per_gpu"])


def test_two_gpus_do_not_fit_and_exit_3(config_70b: str):
    result = ftjob("plan", EXAMPLE_70B, "--model-config", config_70b, "--gpus", "2", "--json")
    assert result.returncode == 3
    plan = json.loads(result.stdout)
    assert plan["fits"] is False and plan["shortfall_gib"] > 0
    assert "GiB more than" in plan["message"] and "fits on" in plan["message"]


def test_overrides_change_the_plan(config_70b: str):
    def peak(*extra: str) -> float:
        result = ftjob("plan", EXAMPLE_70B, "--model-config", config_70b, "--mode", "deviceMap", "--json", *extra)
        assert result.returncode in (0, 3), result.stderr
        return max(g["total_gib"] for g in json.loads(result.stdout)["per_gpu"])

    base = peak()
    assert peak("--max-length", "4096") > base
    assert peak("--gradient-checkpointing", "false") > base
    assert peak("--batch-size", "2") > base
    assert peak("--lora-r", "64") > base
    small = json.loads(
        ftjob("plan", EXAMPLE_70B, "--model-config", config_70b, "--gpu-memory-gib", "12", "--json").stdout
    )
    assert small["gpu_memory_gib"] == 12 and small["fits"] is False


def test_reads_config_json_from_the_local_model_volume(tmp_path: Path):
    volumes = tmp_path / "volumes"
    model = volumes / "models" / "meta-llama" / "Llama-3.3-70B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(LLAMA_3_8B))
    data = volumes / "datasets" / "support" / "alpaca.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"instruction": "hi", "output": "hello"}\n' * 1000)
    result = ftjob("plan", EXAMPLE_70B, "--volumes", str(volumes), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["model"]["layers"] == 32  # the 8B config found on the volume, not the 70B name
    assert plan["speed"]["epoch_tokens"] == data.stat().st_size // 4
    assert "estimated from" in plan["tokens_source"]


def test_hub_models_in_the_table_need_no_config(tmp_path: Path):
    body = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    body["spec"]["model"]["source"] = {"hub": {"id": "meta-llama/Meta-Llama-3-8B"}}
    body["spec"]["resources"]["gpus"] = 1
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(body))
    result = ftjob("plan", str(manifest), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["fits"] is True


def test_cpu_job_has_nothing_to_plan():
    result = ftjob("plan", EXAMPLE_TINY, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["parallelism"], plan["processes"], plan["per_gpu"]) == ("dataParallel", 1, [])
    text = ftjob("plan", EXAMPLE_TINY)
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() == (
        f"{EXAMPLE_TINY}: tiny: CPU (spec.resources.gpus is 0): dataParallel, 1 process, no GPU memory to plan "
        "(try --gpus N)\n"
        # batchSize 4 x gradientAccumulation 1 x 1 process
        "effective batch 4 = 4 x 1 x 1 process (batchSize x gradientAccumulation x processes)"
    )


def test_cpu_job_with_processes(tmp_path: Path):
    body = yaml.safe_load(Path(EXAMPLE_TINY).read_text())
    body["spec"]["resources"]["processes"] = 2
    body["spec"]["training"]["parallelism"] = "fsdp"
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(body))
    result = ftjob("plan", str(manifest))
    assert result.returncode == 0, result.stderr
    assert "CPU (spec.resources.gpus is 0): fsdp, 2 processes" in result.stdout
    assert "effective batch 8 = 4 x 1 x 2 processes (batchSize x gradientAccumulation x processes)" in result.stdout


@pytest.mark.parametrize(("spelling", "word"), [("device_map", "deviceMap"), ("data_parallel", "dataParallel")])
def test_old_mode_spellings_still_work(config_70b: str, spelling: str, word: str):
    result = ftjob("plan", EXAMPLE_70B, "--model-config", config_70b, "--mode", spelling, "--gpus", "8", "--json")
    assert result.returncode in (0, 3), result.stderr
    assert json.loads(result.stdout)["parallelism"] == word


def _manifest(tmp_path: Path, gpus: int, parallelism: str, name: str) -> str:
    body = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    body["spec"]["resources"]["gpus"] = gpus
    body["spec"]["training"]["parallelism"] = parallelism
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


@pytest.mark.parametrize(
    ("model", "gpus", "parallelism", "extra"),
    [
        (LLAMA_3_8B, 1, "auto", []),
        (LLAMA_3_8B, 2, "auto", []),
        (LLAMA_3_8B, 4, "fsdp", []),
        (LLAMA_3_8B, 4, "deviceMap", []),
        ({**LLAMA_33_70B, "num_hidden_layers": 40}, 2, "auto", []),
        (LLAMA_33_70B, 4, "auto", []),
        (LLAMA_33_70B, 4, "auto", ["--attention", "materialised"]),
        (LLAMA_33_70B, 2, "auto", []),
        (LLAMA_3_8B, 2, "auto", ["--gpu-product", "NVIDIA-H200"]),
        (LLAMA_3_8B, 0, "fsdp", []),
    ],
)
def test_json_parallelism_and_processes_are_what_the_trainer_chooses(
    tmp_path: Path, model: dict[str, Any], gpus: int, parallelism: str, extra: list[str]
):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(model))
    manifest = _manifest(tmp_path, gpus, parallelism, "job")
    result = ftjob("plan", manifest, "--model-config", str(config), "--json", *extra)
    assert result.returncode in (0, 3), result.stderr
    printed = json.loads(result.stdout)
    job = parse_file(manifest)[0].job
    assert job is not None
    product = lookup(extra[1]) if "--gpu-product" in extra else lookup("Tesla-P40")
    assert product is not None
    trainer = choose(
        job.spec,
        model if gpus else None,
        gpus,
        int(product.memory_gib * GIB) if gpus else None,
        product.name if gpus else None,
        attention=extra[1] if "--attention" in extra else "memory_efficient",
    )
    assert (printed["parallelism"], printed["processes"]) == (trainer.parallelism, trainer.processes)
    assert printed["fits"] is trainer.fits
    assert result.returncode == (0 if trainer.fits else 3)
    if trainer.plan is not None and trainer.plan.speed is not None:
        assert printed["speed"]["tokens_per_second"] == pytest.approx(trainer.plan.speed.tokens_per_second, abs=0.01)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["missing.yaml"], "missing.yaml: no such file"),
        (["{bad}"], "invalid YAML"),
        (["{unknown-model}"], "config.json is not here"),
        ([EXAMPLE_70B, "--model-config", "/nonexistent/config.json"], "no such file"),
        ([EXAMPLE_70B, "--model-config", "{notjson}"], "invalid JSON"),
        ([EXAMPLE_70B, "--model-config", "{incomplete}"], "num_hidden_layers"),
        ([EXAMPLE_70B, "--model-config", "{config}", "--gpu-product", "Radeon-9700"], "unknown product"),
        ([EXAMPLE_70B, "--model-config", "{config}", "--max-length", "0"], "--max-length: must be positive"),
        (
            [EXAMPLE_70B, "--model-config", "{config}", "--gradient-checkpointing", "maybe"],
            "expected true, false or auto",
        ),
        ([EXAMPLE_70B, "--model-config", "{config}", "--mode", "pipeline"], "--mode: expected one of"),
        (["{invalid-spec}"], "spec.lora.r"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, config_70b: str, args: list[str], fragment: str):
    (tmp_path / "bad.yaml").write_text("apiVersion: finetune.dev/v1alpha1\nkind: [unclosed\n")
    (tmp_path / "not.json").write_text("{nope")
    (tmp_path / "incomplete.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    body = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    body["spec"]["lora"]["r"] = 0
    (tmp_path / "invalid.yaml").write_text(yaml.safe_dump(body))
    body["spec"]["lora"]["r"] = 8
    body["spec"]["model"]["source"]["pvc"]["path"] = "my-own/model"
    (tmp_path / "unknown-model.yaml").write_text(yaml.safe_dump(body))
    mapping = {
        "{bad}": str(tmp_path / "bad.yaml"),
        "{notjson}": str(tmp_path / "not.json"),
        "{incomplete}": str(tmp_path / "incomplete.json"),
        "{config}": config_70b,
        "{invalid-spec}": str(tmp_path / "invalid.yaml"),
        "{unknown-model}": str(tmp_path / "unknown-model.yaml"),
    }
    result = ftjob("plan", *[mapping.get(a, a) for a in args], cwd=tmp_path)
    assert_one_line_error(result, fragment)


def test_memory_below_the_pods_host_figure_is_refused_by_plan_and_validate(tmp_path) -> None:
    """The same one-line verdict, exit 3, from both commands; the 70B example (memory unset) passes."""
    job = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    job["spec"]["resources"]["memory"] = "16Gi"  # the plan asks 26Gi: 4 x 5.4 GiB + 10% + 2 GiB
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump(job))
    for command in (["plan", str(short)], ["validate", str(short)]):
        result = ftjob(*command)
        assert result.returncode == 3, (command, result.stdout, result.stderr)
        assert "spec.resources.memory 16.0 GiB is below" in result.stdout
        assert "Traceback" not in result.stderr
    # One verdict: the plan says DOES NOT FIT once, on its first line, and never FITS beside it.
    lines = ftjob("plan", str(short)).stdout.splitlines()
    assert [x for x in lines if x.startswith(("FITS", "DOES NOT FIT"))] == [lines[1]]
    assert ftjob("validate", EXAMPLE_70B).returncode == 0


def test_with_volumes_a_memory_short_job_gets_one_verdict_not_fits_and_does_not_fit(tmp_path: Path) -> None:
    """`--volumes` plans from the model's own config.json: a plan that fits its GPUs but not the
    pod's host memory says DOES NOT FIT once, where it used to print FITS beside it."""
    volumes = tmp_path / "volumes"
    model = volumes / "models" / "meta-llama" / "Llama-3.3-70B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(LLAMA_3_8B))
    data = volumes / "datasets" / "support" / "alpaca.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"instruction": "hi", "output": "hello"}\n' * 100)
    job = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    job["spec"]["resources"]["memory"] = "1Gi"
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump(job))
    result = ftjob("plan", str(short), "--volumes", str(volumes), "--offline")
    assert result.returncode == 3, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert [x for x in lines if x.startswith(("FITS", "DOES NOT FIT"))] == [lines[1]]
    assert lines[1].startswith("DOES NOT FIT: spec.resources.memory 1.0 GiB is below"), lines[1]
    said = json.loads(ftjob("plan", str(short), "--volumes", str(volumes), "--offline", "--json").stdout)
    assert said["fits"] is False and said["verdict"]["reason"] == "WontFit"


def _batch_manifest(tmp_path: Path, resources: dict[str, Any], parallelism: str, batch: int, accumulation: int) -> str:
    body = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    body["spec"]["resources"].update(resources)
    body["spec"]["training"].update(parallelism=parallelism, batchSize=batch, gradientAccumulation=accumulation)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


@pytest.mark.parametrize(
    ("resources", "parallelism", "batch", "accumulation", "line"),
    [
        # One process per GPU: 2 x 3 x 4 = 24.
        (
            {"gpus": 4},
            "fsdp",
            2,
            3,
            "effective batch 24 = 2 x 3 x 4 processes (batchSize x gradientAccumulation x processes)",
        ),
        (
            {"gpus": 4},
            "dataParallel",
            1,
            8,
            "effective batch 32 = 1 x 8 x 4 processes (batchSize x gradientAccumulation x processes)",
        ),
        # deviceMap drives the 4 GPUs from one process: 1 x 8 x 1 = 8.
        (
            {"gpus": 4},
            "deviceMap",
            1,
            8,
            "effective batch 8 = 1 x 8 x 1 process (batchSize x gradientAccumulation x processes)",
        ),
        # 2 nodes of 4 GPUs: 1 x 8 x 4 x 2 = 64.
        (
            {"gpus": 4, "nodes": 2},
            "fsdp",
            1,
            8,
            "effective batch 64 = 1 x 8 x 4 processes x 2 nodes (batchSize x gradientAccumulation x processes x nodes)",
        ),
    ],
)
def test_the_plan_says_the_effective_batch_and_its_factors(
    tmp_path: Path, resources: dict[str, Any], parallelism: str, batch: int, accumulation: int, line: str
):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_3_8B))
    manifest = _batch_manifest(tmp_path, resources, parallelism, batch, accumulation)
    result = ftjob("plan", manifest, "--model-config", str(config))
    assert result.returncode in (0, 3), result.stderr
    assert line in result.stdout.splitlines()
    printed = ftjob("plan", manifest, "--model-config", str(config), "--json")
    assert json.loads(printed.stdout)["effective_batch"] == int(line.split()[2])


# --- host memory a node has (issue #39) ---------------------------------------------------------


def _manifest_13b(tmp_path: Path, **training: Any) -> tuple[str, str]:
    """Llama-2-13B (MHA, 40 layers, hidden 5120, vocab 32000), r=64 on all seven linears, dropout
    0.05, 2048 tokens, 4 x P40, no resources.memory."""
    from tests.planning.models import LLAMA_2_13B
    from tests.planning.test_host_budget import ALL_LINEARS

    body = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    body["spec"]["lora"] = {"r": 64, "alpha": 16, "dropout": 0.05, "targetModules": ALL_LINEARS}
    body["spec"]["training"].pop("gradientCheckpointing")
    body["spec"]["training"].update(training)
    manifest, config = tmp_path / "job.yaml", tmp_path / "config.json"
    manifest.write_text(yaml.safe_dump(body))
    config.write_text(json.dumps(LLAMA_2_13B))
    return str(manifest), str(config)


def test_the_host_line_sets_the_pods_figure_against_what_a_node_offers(tmp_path: Path) -> None:
    manifest, config = _manifest_13b(tmp_path)
    result = ftjob("plan", manifest, "--model-config", config)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.strip().startswith("pod "))
    asked = int(line.split()[1].removesuffix("Gi"))
    assert asked <= 4 * 28
    assert f"pod {asked}Gi of the 112 GiB a Tesla-P40 node offers 4 GPUs (4 x 28 GiB, the product's default" in line
    roomy = ftjob("plan", manifest, "--model-config", config, "--host-memory-per-gpu", "64Gi", "--json")
    assert roomy.returncode == 0, roomy.stderr
    plan = json.loads(roomy.stdout)
    assert plan["host_limit"]["gib"] == 256 and asked < int(plan["pod"]["memory"].removesuffix("Gi")) <= 256


def test_nothing_that_fits_a_node_names_the_field_to_change(tmp_path: Path) -> None:
    manifest, config = _manifest_13b(tmp_path, activationOffload=True)
    result = ftjob("plan", manifest, "--model-config", config)
    assert result.returncode == 3, result.stderr
    verdicts = [x for x in result.stdout.splitlines() if x.startswith("DOES NOT FIT")]
    assert len(verdicts) == 1 and "Traceback" not in result.stderr
    assert "set training.activationOffload: auto" in verdicts[0] and "spec.resources.memory" in verdicts[0]
    small = ftjob("plan", EXAMPLE_70B, "--host-memory-per-gpu", "10Gi")
    assert small.returncode == 3
    (verdict,) = [x for x in small.stdout.splitlines() if x.startswith("DOES NOT FIT")]
    assert "lower training.maxLength" in verdict and "spec.resources.memory" in verdict


def test_a_bad_host_memory_per_gpu_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(ftjob("plan", EXAMPLE_70B, "--host-memory-per-gpu", "lots"), "--host-memory-per-gpu")


def test_the_first_lines_are_the_verdict_the_whole_jobs_time_and_the_nodes(tmp_path: Path) -> None:
    """The time of the whole job by the planner: maxSteps x the optimizer step, or the epochs over
    --tokens; not known (and said how to know it) where the dataset's size is not."""
    job = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    job["spec"]["training"].pop("epochs", None)
    job["spec"]["training"]["maxSteps"] = 10
    stepped = tmp_path / "steps.yaml"
    stepped.write_text(yaml.safe_dump(job))
    lines = ftjob("plan", str(stepped), "--offline").stdout.splitlines()
    assert lines[1].startswith("FITS: ")
    assert lines[2].startswith("time      about ") and "for the whole job: 10 steps (training.maxSteps) of" in lines[2]
    # The example holds out 2 %: how many rows is not known here, so the time is the training's alone.
    assert lines[2].endswith("not counting the evaluation, at the plan's speed")
    assert lines[3].startswith("evaluation not known yet: held-out examples unknown here")
    assert lines[4] == (
        "nodes     one Tesla-P40 server can hold a pod of 4 GPUs (the planner's figure of 8 GPUs a server) "
        "(not the cluster's nodes: --offline)"
    )
    plan = json.loads(ftjob("plan", str(stepped), "--offline", "--json").stdout)
    step = plan["speed"]["step_seconds"] * job["spec"]["training"]["gradientAccumulation"]
    assert plan["jobSeconds"] == pytest.approx(10 * step, rel=1e-3)
    told = ftjob("plan", EXAMPLE_70B, "--offline", "--tokens", "1000000").stdout.splitlines()
    assert "for the whole job: 1 epoch(s) of 1,000,000 tokens at" in told[2]
    unknown = ftjob("plan", EXAMPLE_70B, "--offline").stdout.splitlines()
    assert unknown[2].startswith("time      not known yet: 1 epoch(s) of a dataset whose size is not known here")
    assert "pass --tokens N, or --volumes DIR where the dataset is" in unknown[2]


def test_more_gpus_than_a_server_holds_is_refused_with_a_split_that_would_fit() -> None:
    result = ftjob("plan", EXAMPLE_70B, "--offline", "--gpus", "16")
    assert result.returncode == 3, result.stdout
    verdict = result.stdout.splitlines()[1]
    assert verdict.startswith("DOES NOT FIT: 16 GPUs per pod: no Tesla-P40 node has more than 8")
    assert "resources.nodes: 2 with gpus: 8 (the same 16 GPUs)" in verdict
    said = json.loads(ftjob("plan", EXAMPLE_70B, "--offline", "--gpus", "16", "--json").stdout)
    assert said["fits"] is False and said["verdict"]["reason"] == "TooManyGpusPerNode"


def test_the_evaluation_has_its_own_line_and_the_whole_jobs_time_includes_it(tmp_path: Path) -> None:
    """With the held-out rows known (--eval-examples, or counted from the data under --volumes), the
    evaluation's line gives each part and the job's time is the training's plus the evaluation's."""
    job = yaml.safe_load(Path(EXAMPLE_70B).read_text())
    job["spec"]["training"].pop("epochs", None)
    job["spec"]["training"]["maxSteps"] = 100
    stepped = tmp_path / "steps.yaml"
    stepped.write_text(yaml.safe_dump(job))
    lines = ftjob("plan", str(stepped), "--offline", "--eval-examples", "40").stdout.splitlines()
    assert (
        lines[2].endswith("10 s each, and the evaluation, at the plan's speed") or ", and the evaluation, " in lines[2]
    )
    assert lines[3].startswith("evaluation about ") and "on 40 held-out examples: base " in lines[3]
    assert "held-out loss at 2 checkpoint(s)" in lines[3] and "4 answer(s) x 2 models" in lines[3]
    plan = json.loads(ftjob("plan", str(stepped), "--offline", "--eval-examples", "40", "--json").stdout)
    evaluation = plan["evaluation"]
    assert evaluation["examples"] == 40 and evaluation["tunedPasses"] == 1 and evaluation["lossPasses"] == 2
    assert plan["jobSeconds"] == pytest.approx(plan["trainingSeconds"] + evaluation["seconds"], abs=0.2)
    parts = evaluation["base"] + evaluation["tuned"] * 3 + evaluation["generation"]
    assert evaluation["seconds"] == pytest.approx(parts, abs=0.3)
    # The held-out rows counted where the data is (here the current folder): 2 % of 500 records.
    data = tmp_path / "volumes" / "datasets" / "support" / "alpaca.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"instruction": "hi", "output": "hello"}\n' * 500)
    counted = ftjob("plan", str(stepped), "--offline", "--json", cwd=tmp_path / "volumes")
    assert json.loads(counted.stdout)["evaluation"]["examples"] == 10
    # Without a held-out split, no evaluation and no line.
    del job["spec"]["dataset"]["evalFraction"]
    stepped.write_text(yaml.safe_dump(job))
    plain = ftjob("plan", str(stepped), "--offline").stdout
    assert (
        "\nevaluation " not in plain
        and json.loads(ftjob("plan", str(stepped), "--offline", "--json").stdout)["evaluation"] is None
    )


def _grpo_job(tmp_path: Path, **training: Any) -> str:
    """The GRPO example on one P40: 8 completions of 256 tokens to prompts of up to 256 (maxLength 512)."""
    body: dict[str, Any] = yaml.safe_load((REPO / "examples" / "grpo-job.yaml").read_text(encoding="utf-8"))
    spec = body["spec"]
    spec["resources"] = {"gpus": 1, "gpuProduct": "Tesla-P40"}
    spec["training"].update({"maxLength": 512, "batchSize": 1, **training})
    spec["training"] = {key: value for key, value in spec["training"].items() if value is not None}
    spec["training"]["grpo"].update({"numGenerations": 8, "maxCompletionLength": 256})
    job = tmp_path / "grpo.yaml"
    job.write_text(yaml.safe_dump(body), encoding="utf-8")
    return str(job)


def test_a_grpo_job_prints_its_step_and_its_time_in_optimizer_steps(tmp_path: Path):
    """The `grpo` line (the rollouts, their KV cache, the step's seconds by part), the rollouts' row
    of the memory table, and the job's time from maxSteps, or from the prompts on the volume."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_3_8B))
    job = _grpo_job(tmp_path)
    result = ftjob("plan", job, "--model-config", str(config))
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("grpo ")]
    assert line.startswith(
        "grpo      step: rollouts 8 x 256 tokens per prompt (1 prompt of up to 256 tokens a micro-batch), "
        "KV cache 1.00 GiB; generation "
    )
    assert ", scoring " in line and ", per step " in line
    assert any(x.startswith("rollouts (no-grad phase)") for x in result.stdout.splitlines())
    assert "time      about " in result.stdout and "20 steps (training.maxSteps) of " in result.stdout
    plan = json.loads(ftjob("plan", job, "--model-config", str(config), "--json").stdout)
    # 2 (k, v) x 32 layers x 8 kv heads x 128 x 4 bytes, for 8 rows of 512 tokens: 1 GiB.
    assert plan["grpo"]["kvCacheBytes"] == 2 * 32 * 8 * 128 * 4 * 8 * 512 == GIB
    assert plan["grpo"]["stepSeconds"] == pytest.approx(plan["trainingSeconds"] / 20, rel=1e-3)
    assert plan["batch_size"] == 1 and plan["speed"]["rollout_seconds"] > 0

    volumes = tmp_path / "volumes"
    (volumes / "models" / "tiny-llama").mkdir(parents=True)
    (volumes / "models" / "tiny-llama" / "config.json").write_text(json.dumps(LLAMA_3_8B))
    data = volumes / "datasets" / "tiny" / "arithmetic.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n' * 30)
    epochs = _grpo_job(tmp_path, maxSteps=None, epochs=2)
    result = ftjob("plan", epochs, "--volumes", str(volumes))
    assert result.returncode == 0, result.stderr
    assert "for the whole job: 60 optimizer steps (2 epoch(s) of 30 prompts) of " in result.stdout
    assert "epoch tokens estimated" not in result.stdout
