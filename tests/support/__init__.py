"""Helpers the tests share: no test module imports another, they all import from here.

| module | what it holds |
| --- | --- |
| `harness.py` | the real operator as a subprocess under its own identity, FineTuneJobs, waiting |
| `install.py` | the CRD, the chart's admission policies and claims on the test control plane |
| `specs.py` | small valid FineTuneJob specs and Jobs to vary |
| `bodies.py` | Job and pod bodies as the API server writes them, for the status logic |
| `training.py` | reading what a trained job left: summaries, adapters, trainer events |
| `images.py` | the image allow-list cases the operator and the admission fence must agree on |
| `api_cases.py` | the tiny example and the wrong specs both validators must refuse |
| `helm.py` | rendering the chart |
| `promtool.py` | checking and unit-testing Prometheus rules with the real promtool |
| `cli.py` | running `ftjob` as a user would |
| `pair_split.py` | watching the preference pair split's passes (torch only: the GPU tests use it too) |
"""
