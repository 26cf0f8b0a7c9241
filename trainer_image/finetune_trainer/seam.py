"""What the CLI may use of the trainer, in one place (`ftjob run`, `check-data --tokenizer`,
`make-tiny-model`).

The CLI never imports the trainer's modules: it loads this one by name through
`finetune_cli.trainer_seam`, so the arrows of the house run one way (trainer -> plan -> API)
and a CLI installed without the trainer extra says so in one line instead of a traceback.
Anything the CLI needs next from the trainer is added here.
"""

from .data.checks import check_records
from .data.records import DataSourceError, read_records
from .launch.entry import main as run_trainer
from .model.tiny_model import make_tiny_model, write_alpaca, write_preference

__all__ = [
    "DataSourceError",
    "check_records",
    "make_tiny_model",
    "read_records",
    "run_trainer",
    "write_alpaca",
    "write_preference",
]
