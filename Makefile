# TauGrid — the two commands that matter are `make run` and `make test` (see README.md).

SHELL := /bin/bash
.DEFAULT_GOAL := help

SYSTEM_PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip --disable-pip-version-check
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --python $(PYTHON) --compile-bytecode
CONSTRAINTS := requirements/constraints.txt
PORT ?= 8000
export PORT

include deploy/cluster/cluster.mk

.PHONY: help run test test-fast test-tools fuzz check-all lint format typecheck migrations-check docs pytest install install-dev install-docs lock bench clean

help:
	@echo "make run    — start the portal on http://127.0.0.1:$(PORT) (embedded default, no services needed)"
	@echo "make test   — lint, type checks, migrations check, the docs and the whole test suite on PostgreSQL"
	@echo "make test-fast — the unit and database tiers only (no services, browser or cluster): the edit-test loop"
	@echo "make docs   — build the manual in docs/ into var/site/ (strict: a broken link or a page missing from the nav fails)"
	@echo "make lock   — refresh $(CONSTRAINTS) from the current environment"

$(PYTHON):
	@$(SYSTEM_PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "TauGrid needs Python 3.11; set SYSTEM_PYTHON=/path/to/python3.11")'
	$(SYSTEM_PYTHON) -m venv $(VENV)

# The venv's packages are installed by uv (itself pinned in the constraints and installed by
# pip): the same pinned set pip would install, from uv's cache outside the checkout
# (~/.cache/uv), in half a minute instead of pip's one and a half. Compiled to bytecode as pip
# does: where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile Django and
# the rest again on each import (the suite ran 1.7 times slower). A plain `pip install .`
# still gives the `tau` client.
$(UV): $(CONSTRAINTS) | $(PYTHON)
	$(PIP) install --quiet -c $(CONSTRAINTS) uv
	@touch $@

# The portal is the `server` extra. Each set is one uv call that installs everything it needs
# and marks the smaller sets done too: `make test` installs once, with the docs' tools.
$(VENV)/.runtime-installed: pyproject.toml $(CONSTRAINTS) | $(UV)
	$(UV_INSTALL) --quiet -c $(CONSTRAINTS) -e '.[server]'
	@touch $@

$(VENV)/.dev-installed: pyproject.toml $(CONSTRAINTS) | $(UV)
	$(UV_INSTALL) --quiet -c $(CONSTRAINTS) -e '.[server,dev]'
	@touch $(VENV)/.runtime-installed $@

# MkDocs and its Material theme for the manual (the `docs` extra).
$(VENV)/.docs-installed: pyproject.toml $(CONSTRAINTS) | $(UV)
	$(UV_INSTALL) --quiet -c $(CONSTRAINTS) -e '.[server,dev,docs]'
	@touch $(VENV)/.runtime-installed $(VENV)/.dev-installed $@

install: $(VENV)/.runtime-installed
install-dev: $(VENV)/.dev-installed
install-docs: $(VENV)/.docs-installed

# Quiet on purpose: runportal prints the address and the demo logins last, once the portal
# answers, so that nothing scrolls them out of sight (errors still show).
run: install
	@echo "Preparing the database and the demo accounts…"
	@$(PYTHON) manage.py migrate --noinput --verbosity 0
	@$(PYTHON) manage.py bootstrap_demo --verbosity 0
	@$(PYTHON) manage.py runportal --port $(PORT)

# The suite's own PostgreSQL and Redis are started (and removed) around everything else.
# The Kubernetes control plane is built (cached; a new machine's longest step) in the lane of
# the tests that need it, beside the others (the pytest target); they start it themselves.
# helm, Dex and SeaweedFS (the S3 store test_services.py starts), which tests in the other lane
# run, are built first (cached; minutes when cold).
test: install-docs test-tools
	$(PYTHON) $(CLUSTER_TOOL) build helm dex weed
	$(PYTHON) deploy/dev/test_services.py run -- $(MAKE) --no-print-directory check-all

# The edit-test loop: the unit and db tiers (tests/tiers.py) without the slow ones, on the
# suite's own PostgreSQL and Redis, spread over every core (pytest-xdist: a database per
# worker); nothing else is built or started.
FAST_TIERS := (unit or db) and not slow
PARALLEL := -n auto --dist loadscope
test-fast: install-dev
	$(PYTHON) deploy/dev/test_services.py run -- $(VENV)/bin/pytest $(PARALLEL) -m "$(FAST_TIERS)" $(PYTEST_ARGS)

# Chromium (Debian) for the browser tests, npm packages of the test OpenID provider.
test-tools:
	$(PYTHON) deploy/dev/test_tools.py

check-all: lint typecheck migrations-check docs pytest

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# mypy's cache is kept outside the checkout, one per checkout path (its entries name their
# files): a fresh clone at the same path (CI's) checks in seconds instead of a minute.
MYPY_CACHE_DIR ?= $(or $(TAUGRID_CACHE_DIR),$(HOME)/.cache/taugrid)/mypy/$(shell printf %s "$(CURDIR)" | sha256sum | cut -c1-16)
typecheck: install-dev
	$(VENV)/bin/mypy --cache-dir "$(MYPY_CACHE_DIR)" .

migrations-check: install-dev
	$(PYTHON) manage.py makemigrations --check --dry-run

# The manual (mkdocs.yml): --strict turns a broken link or anchor and a page missing from the
# nav into a failure. The site lands in var/site/ (open var/site/index.html).
docs: install-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir var/site

# The whole suite in two lanes at once (deploy/dev/test_lanes.py): the control plane's build
# (cached) and then the cluster tier one test at a time; beside them, the fast tiers spread over
# every core, the portal's image build (cached layers: seconds when warm), then the tiers that
# start processes or Chromium and the slow tests over two workers. No test builds anything.
# A pass that PYTEST_ARGS leaves empty (pytest's exit 5) is fine.
# Each pass ends with its 15 slowest tests.
pytest: install-dev
	$(PYTHON) deploy/dev/test_lanes.py --fast "$(FAST_TIERS)" \
		--cluster-build "$(PYTHON) $(CLUSTER_TOOL) build" \
		--others-build "$(PYTHON) deploy/dev/oci_image.py build" -- $(VENV)/bin/pytest --durations=15 $(PYTEST_ARGS)

# A few minutes of fuzzing the tau.yaml checker (not part of make test).
fuzz: install-dev
	$(PYTHON) -m tau.spec.fuzz --seconds 180

# Speed targets, measured on this machine against the suite's own PostgreSQL and Redis.
bench: install-dev
	$(PYTHON) deploy/dev/test_tools.py --bench
	$(PYTHON) deploy/dev/test_services.py run -- $(PYTHON) benchmarks/run.py

lock: install-dev
	$(PIP) freeze --exclude-editable | grep -v '^-e ' > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
