"""The FineTuneJob operator (kopf). Importing the package registers its handlers, which is
what `kopf run -m finetune_operator` needs; `python -m finetune_operator` adds flags, JSON
logs, metrics and the liveness endpoint."""

from . import handlers as handlers
