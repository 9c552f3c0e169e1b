# The two commands of the README. Each one creates .venv and installs what it
# needs, so both work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: async GRPO on the default tiny causal LM (built offline on the
# first start). Kill it at any moment and run it again: it resumes.
run: $(STAMP)
	$(VENV)/bin/rollvault run --config src/rollvault/configs/grpo_addition.yaml

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest
