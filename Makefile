# The course in two commands: `make run` executes every notebook, `make test` checks everything.
# Both create .venv and install what they need first (`make setup`, idempotent). `make help`
# lists every target with what it does (from the `##` comment after its name).
PYTHON ?= python3
# make compat sets VENV to .venv-torch-<version> for the targets its tests start (make lab, html)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
MODULES   := $(wildcard notebooks/*.py)
EXECUTED  := $(NOTEBOOKS:notebooks/%=build/executed/%)
export PYTHONDONTWRITEBYTECODE := 1

# make lab: JupyterLab on 127.0.0.1, as root too (containers and cloud VMs run as root).
LAB_DIR  ?= notebooks
LAB_PORT ?= 8888
LAB_ARGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
# Kernels with encrypted sockets, as jupyter advises: the kernel manager provisions CurveZMQ keys,
# and no kernel warns that it runs over TCP without encryption (scripts/execute.py says more;
# KERNELS there is the same setting for make run, make test and make sweep).
LAB_KERNELS := --KernelManager.transport_encryption=auto
# make html: the static site, from executed notebooks (reused when newer than their sources).
SITE_DIR ?= build/site
# make test-fast: what needs no notebook run, no browser and no emulated hosts.
FAST := not notebook and not browser and not cluster

.DEFAULT_GOAL := help
.PHONY: help setup run figures test test-fast lint lab sweep html colab export compat clean

help:  ## this list
	@echo 'make <target>: the course'"'"'s commands (README.md says more)'
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z][a-z-]*:[^#]*## / {printf "  %-10s %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

setup: $(STAMP)  ## create .venv and install the pinned requirements (idempotent)

# uv installs the pinned set in about 10 s where pip takes about 110 s on 2 cores. uv does not
# read pip's configuration, so the wheel folders pip is told about (PIP_FIND_LINKS or pip.conf's
# find-links, where a machine keeps its CPU-only torch) are handed on. If uv fails, pip does it.
# --compile-bytecode, as pip does by default: with PYTHONDONTWRITEBYTECODE (above) nothing else
# writes .pyc files, and without them every process compiles torch anew (import torch and
# torch._dynamo: 12 s instead of 5 s here, paid by every kernel and worker the tests start).
$(STAMP): requirements.txt requirements-dev.txt constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check uv -c constraints.txt
	@links="$${PIP_FIND_LINKS:-$$($(BIN)/python -m pip config get global.find-links 2>/dev/null)}"; \
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements-dev.txt -c constraints.txt \
		$$(for l in $$links; do printf -- '--find-links %s ' "$$l"; done) \
	|| $(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-r requirements-dev.txt -c constraints.txt
	@touch $@
	@echo "setup: $(VENV) ready ($$($(BIN)/python -c 'import torch; print("torch", torch.__version__)'))"

build/executed/%.ipynb: notebooks/%.ipynb $(MODULES) | $(STAMP)
	@mkdir -p build/executed build/partial
	@echo "== $<"
	@$(BIN)/python scripts/execute.py --cwd notebooks $< build/partial/$*.ipynb
	@mv build/partial/$*.ipynb $@

run: setup  ## execute every notebook headlessly into build/executed/
	@rm -f $(EXECUTED)
	@$(MAKE) --no-print-directory $(EXECUTED)
	@echo "executed notebooks: build/executed/   figures: figures/   results: build/results/"

figures: run  ## the figures in figures/ (they come from running the notebooks)

html: $(EXECUTED)  ## the executed course as a book (Sphinx): build/site/index.html
	$(BIN)/python scripts/site.py --out $(SITE_DIR)

lint: setup  ## ruff over notebooks, tests and scripts
	$(BIN)/ruff check notebooks tests scripts

test: setup lint  ## everything CI runs: lint, unit tests, every notebook, browser, cluster
	$(BIN)/python -m pytest

test-fast: setup lint  ## lint, unit and hygiene tests: no notebook run, browser or cluster
	$(BIN)/python -m pytest -m '$(FAST)'

lab: setup  ## JupyterLab on the notebooks: make lab [LAB_PORT=8888] [LAB_ARGS=--no-browser]
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$(LAB_PORT) $(ROOT_FLAG) $(LAB_KERNELS) $(LAB_ARGS) \
		$(LAB_DIR)

colab: setup  ## rewrite every notebook's Colab badge and install cell from pyproject.toml
	$(BIN)/python scripts/colab.py

export: setup  ## rewrite the modules' blocks of taught code from the notebooks' `#@save` cells
	$(BIN)/python scripts/export.py

sweep: setup  ## notebooks over GPU counts: make sweep COUNTS="1 2 3 4"
	$(BIN)/python scripts/sweep.py --counts $(or $(COUNTS),1 2 4)

compat: setup  ## notebooks and tests on another torch: make compat TORCH=2.15.0 [ALL=1]
	@test -n "$(TORCH)" || { echo 'make compat needs TORCH=<version>, e.g. make compat TORCH=2.15.0' >&2; exit 2; }
	$(BIN)/python scripts/compat.py --torch '$(TORCH)' --python $(PYTHON) $(if $(ALL),--all)

clean:  ## remove what the others wrote (not .venv, nor make compat's .venv-torch-*)
	rm -rf build .pytest_cache .ruff_cache notebooks/__pycache__ tests/__pycache__ scripts/__pycache__
	find figures -type f ! -name README.md -delete
