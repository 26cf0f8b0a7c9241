"""The FineTuneJob operator (kopf). `python -m finetune_operator` runs it; importing the package
(or its builders, status logic or API client) registers nothing and needs neither kopf nor a
cluster: the kopf handlers are registered by `finetune_operator.handlers`, which `__main__`
imports."""
