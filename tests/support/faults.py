"""The environment that puts the tests' faults into a trainer process: the one place a test asks
for them, whether it starts the trainer itself (`JobDir.run`), through the launcher's ranks (they
inherit it) or through the operator (the node agent's ConfigMap, `training.trainer_hooks`).

`FINETUNE_FAULTS` names tests/support/trainer_faults.py, which finetune_trainer/faults.py installs
as the process starts, and PYTHONPATH finds this checkout's `tests` package from any working
folder; the `FINETUNE_TEST_*` switches say what it does (trainer_faults.SWITCHES).
"""

from __future__ import annotations

import os
from pathlib import Path

from finetune_trainer.faults import FAULTS_ENV
from tests.support import trainer_faults

REPO = Path(__file__).resolve().parents[2]
MODULE = trainer_faults.__name__


def faults_env(**switches: str) -> dict[str, str]:
    """`FINETUNE_FAULTS`, PYTHONPATH and the given `FINETUNE_TEST_*` switches, for a trainer's
    environment; a name the plugin does not read is a mistake of the test's, said at once."""
    unknown = sorted(set(switches) - set(trainer_faults.SWITCHES))
    assert not unknown, f"not a trainer fault switch: {unknown} (tests/support/trainer_faults.py)"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {FAULTS_ENV: MODULE, "PYTHONPATH": path, **switches}
