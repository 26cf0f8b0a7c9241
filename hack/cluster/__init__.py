"""The local Kubernetes control plane for tests and the demo (dev tooling, not product code).

`python -m hack.cluster up` builds (once, cached by version outside the checkout) and starts
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK with fake GPU nodes, a
PVC provisioner and the node agent that runs pods bound to `local-0` as local processes.
`python -m hack.cluster down` stops every process it started, by pid, and removes the state.
`python -m hack.cluster kueue-up` adds Kueue to a running cluster (kueue.py; tests start it
through the `kueue` fixture, and only the tests that need it).
"""
