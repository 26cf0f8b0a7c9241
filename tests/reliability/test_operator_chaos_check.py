"""The operator chaos check judged on the committed soak records, and shown to fail on each fault
it exists to catch (a record of a run that went wrong, made by changing one field of a real one).

No cluster: `check` reads only the result a chaos run wrote.
"""

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.test_operator_chaos import check, kill_modes

RELIABILITY = Path(__file__).resolve().parents[2] / "bench" / "results" / "reliability"
RECORDS = sorted(RELIABILITY.glob("*-operator-chaos-*.json"))


def _record(path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(path.read_text())
    # Records written before the run reported its mix of kill modes: the mix is the log's.
    result.setdefault("kill_modes", kill_modes(result["kill_log"]))
    return result


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_committed_records_pass(path: Path) -> None:
    check(_record(path))


def test_kill_modes_counted_from_the_log() -> None:
    """Hand count of the 2026-12-01 record's log: 20 kills, ten of them hooked; the hook fired in
    four (ServiceAccount once, Job three times), the rest were SIGKILLed."""
    result = _record(RECORDS[-1])
    assert RECORDS[-1].name.startswith("2026-12-01")
    assert kill_modes(result["kill_log"]) == {"sigkill": 16, "hook_exit": 4}


def _planted(fault: str) -> dict[str, Any]:
    result = copy.deepcopy(_record(RECORDS[-1]))
    if fault == "an Event said twice":
        result["events_said_twice"] = 1
    elif fault == "mix misreported":
        result["kill_modes"] = {"sigkill": 10, "hook_exit": 10}
    elif fault == "operator died by itself":
        unhooked = next(k for k in result["kill_log"] if k["hook"] is None)
        unhooked["exited"] = 1
    elif fault == "hooked run crashed otherwise":
        hooked = next(k for k in result["kill_log"] if k["hook"] is not None)
        hooked["exited"] = 139
    return result


@pytest.mark.parametrize(
    "fault", ["an Event said twice", "mix misreported", "operator died by itself", "hooked run crashed otherwise"]
)
def test_check_fails_on_planted_fault(fault: str) -> None:
    with pytest.raises(AssertionError):
        check(_planted(fault))
