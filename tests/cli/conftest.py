"""The cluster commands reuse the operator tests' fixtures: the CRD, an operator process per
namespace running under its own ServiceAccount, and PVC folders holding a tiny model and data."""

from tests.operator.conftest import (  # noqa: F401  (imported fixtures register here)
    finetune_crd,
    jobs,
    operator_kubeconfig,
    start_operator,
    tiny_assets,
    training_volumes,
)
