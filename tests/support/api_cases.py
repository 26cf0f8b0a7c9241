"""The tiny example, varied, and the wrong specs both `ftjob validate` and the API server refuse."""

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

TINY = yaml.safe_load((ROOT / "examples" / "tiny-job.yaml").read_text())


def tiny_with(change: dict[str, Any]) -> dict[str, Any]:
    """The tiny example with `change` merged into its spec (None deletes a key)."""
    body = copy.deepcopy(TINY)

    def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
        for key, value in patch.items():
            if value is None:
                target.pop(key, None)
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                merge(target[key], value)
            else:
                target[key] = value

    merge(body["spec"], change)
    return body


# A GRPO job on the tiny example: its prompt data, no held-out split, completions that leave the
# prompt room in its maxLength (128), and a reward (the list is replaced whole by `tiny_with`).
GRPO_REWARD: dict[str, Any] = {"name": "right", "answer": {"field": "answer", "pattern": "answer is (\\d+)"}}


def grpo_with(grpo: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    """The change that makes the tiny example a GRPO job, its block `grpo` merged over one reward."""
    block = {"maxCompletionLength": 16, "rewards": [GRPO_REWARD], **(grpo or {})}
    return {
        "training": {"method": "grpo", "grpo": block, **training},
        "dataset": {"format": "prompt", "evalFraction": None},
    }


def _grpo_held_out(**dataset: Any) -> dict[str, Any]:
    change = grpo_with()
    change["dataset"] = {"format": "prompt", "evalFraction": None, **dataset}
    return change


WRONG_SPECS = [
    ("zero rank", {"lora": {"r": 0}}, "spec.lora.r:"),
    ("rank too big", {"lora": {"r": 257}}, "spec.lora.r:"),
    ("negative learning rate", {"training": {"learningRate": -1e-4}}, "spec.training.learningRate:"),
    ("zero learning rate", {"training": {"learningRate": 0}}, "spec.training.learningRate:"),
    ("negative gpus", {"resources": {"gpus": -1}}, "spec.resources.gpus:"),
    ("zero batch", {"training": {"batchSize": 0}}, "spec.training.batchSize:"),
    ("dropout over one", {"lora": {"dropout": 1.5}}, "spec.lora.dropout:"),
    (
        "both model sources",
        {"model": {"source": {"hub": {"id": "meta-llama/Llama-3.3-70B-Instruct"}}}},
        "spec.model.source: exactly one of pvc, hub or s3",
    ),
    ("no model source", {"model": {"source": {"pvc": None}}}, "spec.model.source: exactly one of pvc, hub or s3"),
    (
        "bf16 on P40",
        {"precision": "bf16", "resources": {"gpus": 4, "gpuProduct": "Tesla-P40"}},
        "precision bf16 is not supported on Tesla-P40",
    ),
    (
        "fp16 on P100",
        {"precision": "fp16", "resources": {"gpus": 1, "gpuProduct": "Tesla-P100-PCIE-16GB"}},
        "precision fp16 is not supported",
    ),
    ("unknown field", {"lora": {"rank": 16}}, "spec.lora.rank: unknown field (did you mean 'r'?)"),
    ("empty targetModules", {"lora": {"targetModules": []}}, "spec.lora.targetModules:"),
    (
        "checkpointing sometimes",
        {"training": {"gradientCheckpointing": "sometimes"}},
        "spec.training.gradientCheckpointing: must be true, false or auto",
    ),
    ("offload yes", {"training": {"activationOffload": "yes"}}, "spec.training.activationOffload: must be true"),
    (
        "offload sometimes",
        {"training": {"activationOffload": "sometimes"}},
        "spec.training.activationOffload: must be true, false, auto or inputs, got 'sometimes'",
    ),
    (
        "inputs where no layer recomputes",
        {"training": {"gradientCheckpointing": False, "activationOffload": "inputs"}},
        "spec.training: training.activationOffload: inputs moves the recomputing layers' inputs, and "
        "gradientCheckpointing: false recomputes none",
    ),
    ("negative keptLayers", {"training": {"keptLayers": -1}}, "spec.training.keptLayers:"),
    (
        "keptLayers with every layer recomputing",
        {"training": {"gradientCheckpointing": True, "keptLayers": 4}},
        "spec.training: training.keptLayers is for gradientCheckpointing: auto (true recomputes every layer, "
        "false keeps every one)",
    ),
    (
        "pairSplit sometimes",
        {"training": {"pairSplit": "sometimes"}},
        "spec.training.pairSplit: must be true, false or auto",
    ),
    (
        "pairSplit with sft",
        {"training": {"pairSplit": True}},
        "spec.training: training.pairSplit: true is not for training.method sft: its rows are not pairs of "
        "sequences to split",
    ),
    ("keep below two", {"checkpoints": {"keep": 1}}, "spec.checkpoints.keep:"),
    ("bad format", {"dataset": {"format": "csv"}}, "spec.dataset.format:"),
    ("bad quantization", {"quantization": {"type": "int3"}}, "spec.quantization.type:"),
    ("epochs and maxSteps", {"training": {"epochs": 1}}, "set either epochs or maxSteps"),
    ("no output", {"output": None}, "spec.output: required field is missing"),
    ("unknown parallelism", {"training": {"parallelism": "pipeline"}}, "spec.training.parallelism:"),
    ("zero processes", {"resources": {"processes": 0}}, "spec.resources.processes:"),
    ("too many processes", {"resources": {"processes": 65}}, "spec.resources.processes:"),
    (
        "processes on GPUs",
        {"resources": {"gpus": 2, "processes": 2}},
        "spec.resources.processes: processes is for CPU pods (gpus: 0)",
    ),
    (
        "deviceMap with processes",
        {"training": {"parallelism": "deviceMap"}, "resources": {"processes": 2}},
        "resources.processes must be 1 with training.parallelism deviceMap",
    ),
    ("zero nodes", {"resources": {"nodes": 0}}, "spec.resources.nodes:"),
    ("too many nodes", {"resources": {"nodes": 65}}, "spec.resources.nodes:"),
    (
        "deviceMap on two nodes",
        {"training": {"parallelism": "deviceMap"}, "resources": {"nodes": 2}},
        "resources.nodes must be 1 with training.parallelism deviceMap",
    ),
    (
        "trainOn for a format without turns",
        {"dataset": {"trainOn": "assistant"}},
        "spec.dataset.trainOn: trainOn is for the conversation formats (messages, sharegpt)",
    ),
    (
        "evalFraction and eval",
        {"dataset": {"eval": {"pvc": {"claimName": "datasets", "path": "tiny/eval.jsonl"}}}},
        "dataset.evalFraction and dataset.eval are exclusive",
    ),
    (
        "eval with two sources",
        {"dataset": {"evalFraction": None, "eval": {"pvc": {"claimName": "d"}, "hub": {"id": "org/data"}}}},
        "spec.dataset.eval: exactly one of pvc, hub or s3 must be set",
    ),
    ("too many generated answers", {"evaluation": {"generate": {"count": 65}}}, "spec.evaluation.generate.count:"),
    (
        "preference method on alpaca",
        {"training": {"method": "dpo"}},
        "dataset.format alpaca is not one training.method dpo reads (preference)",
    ),
    (
        "sft on preference data",
        {"dataset": {"format": "preference"}},
        "dataset.format preference is not one training.method sft reads (alpaca, sharegpt, messages, text, completion)",
    ),
    ("dpo settings with sft", {"training": {"dpo": {"beta": 0.2}}}, "training.dpo is for training.method dpo"),
    (
        "orpo settings with dpo",
        {"training": {"method": "dpo", "orpo": {"beta": 0.2}}, "dataset": {"format": "preference"}},
        "training.orpo is for training.method orpo",
    ),
    (
        "packing with orpo",
        {"training": {"method": "orpo", "packing": True}, "dataset": {"format": "preference"}},
        "training.packing is not for training.method orpo: a pair's answers are scored one sequence each",
    ),
    (
        "zero beta",
        {"training": {"method": "dpo", "dpo": {"beta": 0}}, "dataset": {"format": "preference"}},
        "spec.training.dpo.beta:",
    ),
    (
        "unknown dpo loss",
        {"training": {"method": "dpo", "dpo": {"lossType": "hinge"}}, "dataset": {"format": "preference"}},
        "spec.training.dpo.lossType:",
    ),
    # GRPO: its block's bounds and rules, its rewards, its data and no held-out split.
    (
        "grpo without rewards",
        grpo_with({"rewards": []}),
        "training.grpo.rewards: at least one reward for training.method grpo",
    ),
    (
        "grpo rewards of one name",
        grpo_with({"rewards": [GRPO_REWARD, {"name": "right", "length": {"target": 8}}]}),
        "training.grpo.rewards: each reward's name is its own",
    ),
    (
        "grpo reward of two kinds",
        grpo_with({"rewards": [{**GRPO_REWARD, "length": {"target": 8}}]}),
        "spec.training.grpo.rewards[0]: a reward is exactly one of answer, format, length or http",
    ),
    (
        "grpo reward of no kind",
        grpo_with({"rewards": [{"name": "nothing", "weight": 2}]}),
        "spec.training.grpo.rewards[0]: a reward is exactly one of answer, format, length or http",
    ),
    (
        "grpo reward name with a space",
        grpo_with({"rewards": [{**GRPO_REWARD, "name": "right answer"}]}),
        "spec.training.grpo.rewards[0].name:",
    ),
    (
        "grpo reward url of no service",
        grpo_with({"rewards": [{"name": "judge", "http": {"url": "http://10.0.0.7:8080/score"}}]}),
        "spec.training.grpo.rewards[0].http.url:",
    ),
    (
        "grpo reward pattern not a regular expression",
        grpo_with({"rewards": [{"name": "tidy", "format": {"pattern": "(unclosed"}}]}),
        "spec.training.grpo.rewards[0].format.pattern: not a regular expression",
    ),
    ("grpo group of one", grpo_with({"numGenerations": 1}), "spec.training.grpo.numGenerations:"),
    ("grpo unknown loss", grpo_with({"lossType": "ppo"}), "spec.training.grpo.lossType:"),
    (
        "grpo completion as long as maxLength",
        grpo_with({"maxCompletionLength": 128}),
        "training.grpo.maxCompletionLength must be below training.maxLength",
    ),
    (
        "grpo with evalFraction",
        _grpo_held_out(evalFraction=0.1),
        "dataset.evalFraction is not for training.method grpo: its rewards are what it is measured by",
    ),
    (
        "grpo with a held-out source",
        _grpo_held_out(eval={"pvc": {"claimName": "datasets", "path": "tiny/eval.jsonl"}}),
        "dataset.eval is not for training.method grpo: its rewards are what it is measured by",
    ),
    (
        "packing with grpo",
        grpo_with(packing=True),
        "training.packing is not for training.method grpo: each of its sequences is a prompt and one completion "
        "sampled for it",
    ),
    (
        "grpo on alpaca",
        {**grpo_with(), "dataset": {"format": "alpaca", "evalFraction": None}},
        "dataset.format alpaca is not one training.method grpo reads (prompt)",
    ),
    (
        "grpo settings with sft",
        {"training": {"grpo": {"numGenerations": 4}}},
        "training.grpo is for training.method grpo",
    ),
    (
        "priority without a queue",
        {"placement": {"workloadPriorityClassName": "high"}},
        "workloadPriorityClassName needs queueName",
    ),
    # Object storage: one source, a model is a prefix, the bucket, key, endpoint and output prefix.
    (
        "s3 and pvc model",
        {"model": {"source": {"s3": {"bucket": "models", "key": "tiny/"}}}},
        "spec.model.source: exactly one of pvc, hub or s3",
    ),
    (
        "s3 model as one object",
        {"model": {"source": {"pvc": None, "s3": {"bucket": "models", "key": "tiny/config.json"}}}},
        "a model is a folder: s3.key must be a prefix ending in /",
    ),
    (
        "s3 bucket in capitals",
        {"dataset": {"source": {"pvc": None, "s3": {"bucket": "Data_Sets", "key": "a.jsonl"}}}},
        "spec.dataset.source.s3.bucket:",
    ),
    (
        "s3 key climbing out",
        {"dataset": {"source": {"pvc": None, "s3": {"bucket": "data", "key": "a/../b.jsonl"}}}},
        "spec.dataset.source.s3.key:",
    ),
    (
        "s3 endpoint not http",
        {"dataset": {"source": {"pvc": None, "s3": {"bucket": "data", "key": "a.jsonl", "endpoint": "ftp://x"}}}},
        "spec.dataset.source.s3.endpoint:",
    ),
    (
        "output s3 not a prefix",
        {"output": {"s3": {"bucket": "results", "key": "tiny"}}},
        "spec.output.s3.key:",
    ),
]
