# The course in two commands: `make run` executes every notebook, `make test` checks everything.
# Both create .venv and install what they need first (`make setup`, idempotent).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup run figures test lint lab sweep clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-r requirements-dev.txt -c constraints.txt
	@touch $@
	@echo "setup: $(VENV) ready ($$($(BIN)/python -c 'import torch; print("torch", torch.__version__)'))"

run: setup  ## execute every notebook headlessly into build/executed/
	@mkdir -p build/executed
	@for nb in $(NOTEBOOKS); do \
		echo "== $$nb"; \
		$(BIN)/papermill --cwd notebooks --no-progress-bar "$$nb" "build/executed/$$(basename $$nb)" || exit 1; \
	done
	@echo "executed notebooks: build/executed/   figures: figures/   results: build/results/"

figures: run

lint: setup
	$(BIN)/ruff check notebooks tests $(wildcard scripts)

test: setup lint
	$(BIN)/python -m pytest

lab: setup
	$(BIN)/jupyter lab notebooks

sweep: setup  ## notebooks 05 and 06 over GPU counts: make sweep COUNTS="1 2 4"
	$(BIN)/python scripts/sweep.py --counts $(or $(COUNTS),1 2 4)

clean:
	rm -rf build .pytest_cache .ruff_cache notebooks/__pycache__ tests/__pycache__ scripts/__pycache__
	find figures -type f ! -name README.md -delete
