"""The modes' words live in one table (`finetune_api.modes`): the spec, the planner and the CLI
all translate through it."""

from typing import get_args

from finetune_api import modes
from finetune_api.spec import TrainingSpec


def test_the_spec_takes_exactly_the_tables_words() -> None:
    schema = TrainingSpec.model_json_schema()["properties"]["parallelism"]
    assert tuple(schema["enum"]) == modes.SPEC_WORDS == get_args(modes.Parallelism)


def test_every_mode_goes_to_the_planner_and_back() -> None:
    for mode in modes.MODES:
        assert modes.to_spec(modes.to_planner(mode.spec)) == mode.spec
    assert modes.to_planner("auto") == "auto"
    assert modes.to_spec("cpu") == "cpu"


def test_the_cli_spellings_of_earlier_releases_still_parse() -> None:
    assert modes.parse("data_parallel") == "dataParallel"
    assert modes.parse("device_map") == "deviceMap"
    assert modes.parse("fsdp") == "fsdp"
    assert modes.parse("sharded") is None


def test_one_process_modes_and_autos_choices() -> None:
    assert modes.processes("deviceMap", 4) == 1
    assert modes.processes("fsdp", 4) == 4
    assert modes.auto_choices() == ("data_parallel", "fsdp")
