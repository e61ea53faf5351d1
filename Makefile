# Scalable Topics — developer entry points. Everything runs from the repo's own virtualenv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= .local/run
PYTEST_ARGS ?=
# make test runs pytest on this many xdist workers (README, "How long make test takes");
# PYTEST_ARGS=-n0 runs it serially.
PYTEST_WORKERS ?= 4

.PHONY: install run test test-deps lint typecheck unit bench crds monitoring images deploy clean kube-binaries

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	@touch $(STAMP)

install: $(STAMP)

# The first run builds the Kubernetes binaries (kube-binaries; ~7 min, see README).
# `make run CLUSTER=existing`: the demo on the cluster of $KUBECONFIG instead (CONTEXT=name,
# OPERATOR_IMAGE=…, BROKER_IMAGE=…, OVERLAY=dir; README, "On a cluster of your own").
ifeq ($(CLUSTER),existing)
run: $(STAMP)
	$(BIN)/python -m scalable_topics.cli.main demo --existing-cluster $(if $(CONTEXT),--context '$(CONTEXT)') $(if $(OPERATOR_IMAGE),--operator-image '$(OPERATOR_IMAGE)') $(if $(BROKER_IMAGE),--broker-image '$(BROKER_IMAGE)') $(if $(OVERLAY),--overlay '$(OVERLAY)')
else ifeq ($(CLUSTER),)
run: $(STAMP) kube-binaries
	$(BIN)/python -m scalable_topics.cli.main demo --data-dir $(DATA_DIR)
else
run:
	$(error CLUSTER=$(CLUSTER): the only value is CLUSTER=existing (or none: the local cluster))
endif

lint: $(STAMP)
	$(BIN)/ruff check operator broker-image tests bench
	$(BIN)/ruff format --check operator broker-image tests bench
	$(BIN)/hadolint Dockerfile broker-image/Dockerfile

typecheck: $(STAMP)
	$(BIN)/mypy

# What the tests run from outside, built or fetched once per machine before pytest (a first
# build outlasts a test's timeout): Kubernetes binaries, MinIO, hadoop-aws and Kafka jars,
# promtool. Each reports what it could not get; its tests then say why they skip or fail.
test-deps: $(STAMP)
	$(BIN)/python -m tests.prefetch

# pytest exits 5 when it collected nothing; that is not a failure of the suite. The tests wait
# on real processes far more than they compute, so workers overlap the waits: a module is one
# worker's (its shared fixtures start once), slowest modules first (tests/conftest.py).
test: lint typecheck test-deps
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.run

crds: $(STAMP)
	$(BIN)/python -m scalable_topics.cli.crdgen crds

# The PrometheusRule (manifests/monitoring) from the plain rule file next to the dashboard.
monitoring: $(STAMP)
	$(BIN)/python -m scalable_topics.cli.monitoring docs/dashboards/scalable-topics.rules.yaml manifests/monitoring/prometheusrule.yaml

images: $(STAMP)
	@echo "No container engine on this machine: Dockerfiles are linted here, built by CI/release."
	$(BIN)/hadolint Dockerfile broker-image/Dockerfile

# The real control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kubectl)
# built from its Go modules into ~/.cache/scalable-topics (see README); a no-op once built.
kube-binaries:
	hack/kube/build.sh

deploy:
	kubectl apply -f crds/
	kubectl apply -k manifests/base

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
