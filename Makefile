# The two quick-start commands: `make demo` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench

$(BIN)/hetpar: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,plot,runtime]'
	touch $(BIN)/hetpar

demo: $(BIN)/hetpar
	$(BIN)/hetpar simulate

lint: $(BIN)/hetpar
	$(BIN)/ruff check hetpar tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: $(BIN)/hetpar
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done
