# The two quick-start commands: `make demo` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# written last: an install that fails half-way (after pip has created bin/hetpar) is redone
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench

$(BIN)/hetpar: $(STAMP)

# the demo needs hetpar alone (numpy, tqdm); the tests add torch, the framework oracles and Ray
CORE := $(VENV)/.core

$(CORE): pyproject.toml Makefile
	rm -f $(CORE)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(CORE)

$(STAMP): $(CORE) tests/torchtitan-0.3.0.txt
	rm -f $(STAMP)
	$(BIN)/pip install -q -e '.[dev,plot,runtime,oracle,ray]'
	@# DeepSpeed (test oracle) is an sdist whose build imports torch: build it against the
	@# venv's pinned CPU torch; build isolation would fetch an unpinned multi-GB CUDA torch
	$(BIN)/pip install -q setuptools wheel
	$(BIN)/pip install -q --no-build-isolation 'deepspeed==0.19.8'
	@# torchtitan 0.3.0 (test oracle) and what its config parser imports, pinned, --no-deps:
	@# its declared datasets<4.8 would move transformers and huggingface_hub back (the file says why)
	$(BIN)/pip install -q --no-deps -r tests/torchtitan-0.3.0.txt
	$(BIN)/python -c "import torch, sys; v = torch.__version__; \
	  sys.exit(0 if v.startswith('2.13.0') else 'torch changed to ' + v)"
	touch $(STAMP)

demo: $(CORE)
	$(BIN)/hetpar simulate

lint: $(STAMP)
	$(BIN)/ruff check hetpar tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done
