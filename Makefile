# The two Quick-start commands (`make check`, `make test`) create or refresh .venv and install the pinned set
# first, then tritonkit itself in editable mode with its dev extra. Nothing is installed outside .venv.
#
# The pinned set, inside pyproject.toml's bounds (.ci/run also runs the newest set they allow):
#  - torch from TORCH_SPEC, installed alone so that pip takes the triton that this torch build requires
#    (PyPI's torch 2.13.0 requires triton 3.7.1);
#  - TRITON_SPEC only when the torch build requires no triton (a CPU build, such as a local torch 2.13.0+cpu
#    wheel): the lowest Triton the bounds allow, the one the GPU runs used;
#  - NUMPY_SPEC, the last numpy with wheels for Python 3.10 (triton 3.6's interpreter needs numpy < 2.4).
# Each of them has manylinux x86_64 wheels on PyPI for Python 3.10-3.12.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
NUMPY_SPEC ?= numpy==2.2.6
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# The stamp names the specs, so that `TORCH_SPEC=... make test` reinstalls instead of reusing another set.
STAMP := $(VENV)/.installed-$(shell printf '%s' '$(TORCH_SPEC) $(TRITON_SPEC) $(NUMPY_SPEC)' | cksum | cut -d' ' -f1)

.PHONY: install check test lint format clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)" "$(NUMPY_SPEC)"
	@# `pip show` lists the requirements whose markers hold here: a CUDA build names triton, a CPU build does not.
	@if ! $(PIP) show torch | grep -qE '^Requires:.*\btriton\b'; then \
		echo "$(TORCH_SPEC) requires no triton (a CPU build): adding $(TRITON_SPEC)"; \
		$(PIP) install --quiet "$(TRITON_SPEC)"; \
	fi
	$(PIP) install --quiet -e ".[dev]"
	@rm -f $(VENV)/.installed*
	@touch $(STAMP)
	@$(BIN)/python -c 'import numpy, torch, triton; \
		print(f"Installed in $(VENV): torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}")'
	@echo 'To put tritonkit on your PATH, activate the environment: source $(VENV)/bin/activate'

install: $(STAMP)

check: $(STAMP)
	$(BIN)/tritonkit check

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(STAMP)
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
