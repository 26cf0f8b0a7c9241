"""The demo cluster's tests reuse the operator tests' fixtures: the CRD and an operator process per
namespace running under its own ServiceAccount (the chart's RBAC)."""

from tests.operator.conftest import (  # noqa: F401  (imported fixtures register here)
    finetune_crd,
    jobs,
    operator,
    operator_kubeconfig,
    start_operator,
)
