"""Throwaway training objectives, each a module of its own that a test writes to a temporary
folder and names in FINETUNE_PLUGINS, with nothing else of the project changed.

`halved` is SFT with the loss scaled by its settings block, `training.halved.factor` (a half
unless set, above 0 and at most 1), and a rule its entry adds to `training` (the scaled loss
scales every step, so factor x learningRate has a floor). `nested` brings a block of the shape
GRPO's will have: a list of rewards, each exactly one of two kinds (a CEL rule and a validator).

Their blocks become fields of the spec when its schema is first built, which a process does once;
so the tests load them as the operator, the CLI and the trainer do, in a fresh process with
FINETUNE_PLUGINS set (`fresh_python`, `plugin_env`), never into the test's own process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.api_cases import ROOT

HALVED = "throwaway_objective"
HALVED_SOURCE = '''"""A throwaway objective: supervised fine-tuning with the loss scaled by training.halved.factor."""

from typing import Annotated

from pydantic import Field

from finetune_api.base import ApiModel
from finetune_api.objectives import Objective, Rule, register


class HalvedSpec(ApiModel):
    factor: Annotated[float, Field(gt=0, le=1)] = Field(default=0.5, description="What the loss is multiplied by.")


FLOOR = "training.halved.factor x training.learningRate must be at least 1e-6 (the scaled loss scales every step)"


def _above_the_floor(training):
    return training.settings_of(HalvedSpec).factor * training.learning_rate >= 1e-6


register(
    Objective(
        name="halved",
        description="SFT with the loss halved (a test's throwaway)",
        dataset_formats={"alpaca": "instruction/input/output"},
        trainer="throwaway_objective:Halved",
        sequences_per_row=2,
        tracked=("spec.training.method", "spec.dataset.format", "spec.training.halved"),
        order=90,
        settings=HalvedSpec,
        rules=(
            Rule(
                f"(has(self.halved) ? self.halved.factor : {HalvedSpec().factor}) * self.learningRate >= 0.000001",
                _above_the_floor,
                FLOOR,
                ".halved.factor",
            ),
        ),
    )
)


def __getattr__(name):
    if name != "Halved":
        raise AttributeError(name)
    from finetune_trainer.objectives.sft import Sft

    class Halved(Sft):
        def configure(self, spec):
            self.factor = spec.training.settings_of(HalvedSpec).factor

        def loss_sum(self, model, head, batch, totals):
            return super().loss_sum(model, head, batch, totals) * self.factor

        def step_metrics(self, loss, trained, sums=()):
            return {"halvedLoss": loss}

    return Halved
'''
FLOOR = "training.halved.factor x training.learningRate must be at least 1e-6 (the scaled loss scales every step)"

NESTED = "nested_objective"
NESTED_SOURCE = '''"""A throwaway objective whose settings are nested: rewards, each exactly one of its kinds."""

from typing import Annotated, Self

from pydantic import ConfigDict, Field, model_validator

from finetune_api.base import ApiModel
from finetune_api.objectives import Objective, register

ONE_KIND = "a reward is exactly one of answer or length"


class AnswerReward(ApiModel):
    pattern: Annotated[str, Field(min_length=1, max_length=256)] = Field(description="What a right answer matches.")


class LengthReward(ApiModel):
    target: Annotated[int, Field(ge=1, le=4096)] = Field(description="The answer's length in tokens.")


class Reward(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "(has(self.answer) ? 1 : 0) + (has(self.length) ? 1 : 0) == 1", "message": ONE_KIND}
            ]
        }
    )

    answer: AnswerReward | None = None
    length: LengthReward | None = None
    weight: Annotated[float, Field(gt=0, le=10)] = Field(default=1.0, description="The reward's weight.")

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.answer is None) == (self.length is None):
            raise ValueError(ONE_KIND)
        return self


class NestedSpec(ApiModel):
    model_config = ConfigDict(title="Nested settings")

    rewards: Annotated[list[Reward], Field(min_length=1, max_length=8)] = Field(
        default_factory=lambda: [Reward(length=LengthReward(target=64))], description="What is rewarded."
    )
    generations: Annotated[int, Field(ge=2, le=64)] = Field(default=4, description="Answers per prompt.")


register(
    Objective(
        name="nested",
        description="a nested settings block (a test's throwaway)",
        dataset_formats={"alpaca": "instruction/input/output"},
        trainer="nested_objective:Nested",
        order=95,
        settings=NestedSpec,
    )
)
'''
ONE_KIND = "a reward is exactly one of answer or length"

SOURCES = {HALVED: HALVED_SOURCE, NESTED: NESTED_SOURCE}


def plugin_env(folder: Path, *modules: str) -> dict[str, str]:
    """Write `modules` to `folder`; the environment a fresh process loads them with."""
    folder.mkdir(parents=True, exist_ok=True)
    for module in modules:
        (folder / f"{module}.py").write_text(SOURCES[module], encoding="utf-8")
    return {"FINETUNE_PLUGINS": ",".join(modules), "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}


def fresh_process(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a new interpreter, in the repository, with `env` added to this one's."""
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def fresh_python(code: str, env: dict[str, str], **values: Any) -> Any:
    """Run `code` in a fresh process, `values` given to it as JSON names; what it prints last, as JSON."""
    given = "".join(f"{name} = json.loads({json.dumps(json.dumps(value))})\n" for name, value in values.items())
    result = fresh_process(["-c", f"import json\n{given}{code}"], env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])
