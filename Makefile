# The two Quick-start commands (`make check`, `make test`) create or refresh .venv and install
# everything first: the CPU build of torch, the pinned Triton, numpy below 2.3 (Triton 3.6's
# interpreter breaks on newer numpy) and tritonkit itself in editable mode.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: check test lint format clean browser-deps

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" "$(TRITON_SPEC)" "numpy<2.3"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

check: $(STAMP)
	$(BIN)/tritonkit check

test: $(STAMP) browser-deps
	$(BIN)/python -m pytest

# The index's browser test drives Debian's Chromium through chromedriver; `make test` installs them when
# missing (apt-get, as root).
browser-deps:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(STAMP)
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
