# finetune-operator: every entry point a developer or CI needs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/.cache/cluster/bin:$(PATH)
export PYTHONUNBUFFERED := 1
# Bytecode caches on, where a machine's environment turns them off (PYTHONDONTWRITEBYTECODE):
# without them every test process compiles the project again and pytest rewrites every test
# module again (5 s of CPU per pytest process at collection, measured), and every trainer process
# the tests start recompiles its modules. `__pycache__/` is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

# The pinned sets: the trainer image and CI install from the same files (CI may differ only in
# torch's CUDA flavour: the image takes torch from the cu118 index, CI from the default index).
PINS := trainer_image/requirements.txt operator/requirements.txt cli/requirements.txt tests/requirements.txt
STAMP := $(VENV)/.installed
# The product's layers, bottom up: each folder is a project of its own (its pyproject.toml).
LAYERS := api planner operator cli trainer_image

.PHONY: help dev llama-cpp chromium test test-gpu test-fast lint crds crds-check cluster-up cluster-down demo bench soak images-lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(LAYERS:%=%/pyproject.toml) $(PINS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade 'pip>=24'
	$(PY) -m pip install -q $(addprefix -c ,$(PINS)) $(addprefix -e ./,$(LAYERS)) -e '.[dev]'
	touch $@

dev: $(STAMP) ## create `.venv` with everything the tests need (from nothing)

llama-cpp: $(STAMP) ## llama.cpp of the pinned llama-cpp-python sdist, built once into the cache: its GGUF converters, the bindings the GGUF tests load, llama-server and llama-quantize (the tests call it too)
	$(PY) -m hack.llama_cpp python
	$(PY) -m hack.llama_cpp tools

chromium: $(STAMP) ## Debian's Chromium, where missing (apt-get): the report's browser test opens report.html in it (that test installs it itself too)
	$(PY) -m hack.chromium

# When make began (read as the Makefile is parsed, before any prerequisite is made): the tests'
# runner prints the time spent before it, the venv's install when the pins changed.
MAKE_START := $(shell date +%s)

test: $(STAMP) ## tests it: every test but gpu and soak, in a parallel and a serial phase, each step timed (sets itself up; starts and stops the local control plane)
	$(PY) -m tests.run --since $(MAKE_START) $(PYTEST_ARGS)

# The files holding `gpu` tests (tests/support/tiers.py): only those are collected on a GPU
# machine, whose image has the trainer's packages and not the Kubernetes client.
GPU_TESTS := $(shell grep -l -E 'mark\.gpu|needs_gpu' tests/trainer/test_*.py)
test-gpu: ## (GPU machine) every GPU test in one go; `make test-gpu PY=python3` where the pinned packages are installed already
	$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make test-gpu: no CUDA GPU visible")'
	$(PY) -m pytest -p no:cacheprovider -rA -m gpu $(GPU_TESTS) $(PYTEST_ARGS)

test-fast: $(STAMP) ## the fast tier: no control plane, no trainer, no binary built from source, torch never imported (seconds)
	$(PY) -m pytest -m fast -n 2 $(PYTEST_ARGS)

lint: $(STAMP) ## ruff + `mypy --strict` on every layer: the API, the planner, the operator, the CLI and the trainer
	$(VENV)/bin/ruff check $(LAYERS) tests hack bench
	$(VENV)/bin/ruff format --check $(LAYERS) tests hack bench
	$(VENV)/bin/mypy --strict api/finetune_api planner/finetune_plan operator/finetune_operator cli/finetune_cli trainer_image/finetune_trainer

crds: $(STAMP) ## regenerate `crds/`, the chart's CRD copy, the API reference (docs/api.md) and the CLI and Make tables (docs/cli.md)
	$(PY) -m finetune_api.generate
	$(PY) -m finetune_cli.readme_tables

crds-check: $(STAMP) ## fail when the committed CRDs or the docs' generated blocks differ from the models, the CLI or the Makefile
	$(PY) -m finetune_api.generate --check
	$(PY) -m finetune_cli.readme_tables --check

cluster-up: $(STAMP) ## start the local control plane: etcd, kube-apiserver, controller-manager, scheduler, KWOK GPU nodes, node agent (`python -m hack.cluster kueue-up` adds Kueue; tests start it themselves)
	$(PY) -m hack.cluster up

cluster-down: ## stop everything cluster-up started and remove its state
	@test -x $(PY) && $(PY) -m hack.cluster down || true

demo: $(STAMP) ## runs it: cluster up, Helm install, a tiny job trained with a live progress bar, loss curve PNG
	hack/demo.sh

bench: $(STAMP) ## (GPU machine) the reference recipe vs our trainer; writes `bench/results/*.json`
	$(PY) -m bench.run $(BENCH_ARGS)

soak: $(STAMP) ## long chaos, fuzz and load runs (not in CI)
	$(PY) -m pytest -m soak tests/reliability $(PYTEST_ARGS)

images-lint: $(STAMP) ## hadolint on the three Dockerfiles (operator, trainer, serving)
	$(VENV)/bin/hadolint operator/Dockerfile trainer_image/Dockerfile serving_image/Dockerfile

clean: cluster-down ## remove the venv and caches of this checkout
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
