# Every target is a one-liner; scripts/ holds anything longer.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup demo test lint types contracts unit proto bench clean e2e e2e-cluster demo-cluster chaos dist chart-package controlplane scale mutants

setup:
	@bash scripts/bootstrap.sh

# Only what the demo needs (scripts/bootstrap.sh demo); make test's set-up installs the rest.
demo:
	@bash scripts/bootstrap.sh demo
	@$(PY) -m enflame_gcu.simulation.demo

test: setup lint types contracts unit

lint:
	$(VENV)/bin/ruff check src tests benchmarks && $(VENV)/bin/ruff format --check src tests benchmarks

types:
	$(VENV)/bin/mypy

contracts:
	$(VENV)/bin/lint-imports

unit:
	@ENFLAME_TEST_TMPFS=$${ENFLAME_TEST_TMPFS:-1} ENFLAME_HOST_CHECK=$${ENFLAME_HOST_CHECK:-1} bash scripts/pytest.sh -n auto --dist loadgroup --cov --cov-report=term --durations=30

proto: setup
	$(PY) -m enflame_gcu._proto.regenerate

bench: setup
	@bash scripts/bench.sh $(BENCH)

e2e: setup
	@bash scripts/e2e.sh

# Kubernetes' own control plane with simulated nodes, no kubelet (README, "The control-plane harness").
controlplane: setup
	@bash scripts/controlplane.sh

# Deliberately broken operators, each against the harness test that must catch it; MUTANTS
# names some (default: every one; tests/controlplane/mutants.py --list).
MUTANTS ?=
mutants: setup
	@$(PY) -m tests.controlplane.mutants $(MUTANTS)

# The scheduler, the extender, the operator and the node-state writers at 1,000 and 5,000
# simulated nodes (docs/benchmarks.md); SCALE_ARGS passes options, e.g. SCALE_ARGS="--nodes 200".
SCALE_ARGS ?= --nodes 1000,5000
scale: setup
	@bash scripts/scale.sh $(SCALE_ARGS)

# The real control plane + two simulated GCU nodes (README, "The real-cluster tier").
e2e-cluster: setup
	@bash scripts/e2e-cluster.sh

# A five-minute tour on the real-cluster tier (README, "Quick start"; reuses its cached build).
demo-cluster: setup
	@bash scripts/demo-cluster.sh

# Ten minutes of GCU pods churning under faults on the real-cluster tier (docs/chaos.md);
# CHAOS_ARGS passes options, e.g. CHAOS_ARGS="--minutes 3 --min-faults 15".
CHAOS_ARGS ?= --seed 1 --minutes 10 --min-faults 50 --report chaos-report.json
chaos: setup
	@bash scripts/chaos.sh $(CHAOS_ARGS)

# Release artifacts into dist/ (docs/packaging.md): wheel, sdist, .deb, .rpm, offline bundle.
dist: setup
	@bash scripts/dist.sh

chart-package: setup
	@bash scripts/chart-package.sh

clean:
	rm -rf $(VENV) .venv-helm .pytest_cache .mypy_cache .ruff_cache build dist src/*.egg-info
