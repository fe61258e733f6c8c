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

# Each step prints one line as it starts and its time when done: the installs are quiet (pip's own output would
# run to hundreds of lines) but take minutes on a first run, torch's download above all.
STEP = @printf '==> %s\n'
TIMED = start=$$(date +%s);
DONE = && echo "    done in $$(( $$(date +%s) - start )) s"

$(STAMP): pyproject.toml Makefile
	$(STEP) "[1/5] creating $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)
	$(STEP) "[2/5] upgrading pip in $(VENV)"
	@$(TIMED) $(PIP) install --quiet --upgrade pip $(DONE)
	$(STEP) "[3/5] installing $(TORCH_SPEC) and $(NUMPY_SPEC) (the largest download: a minute or more the first time)"
	@$(TIMED) $(PIP) install --quiet "$(TORCH_SPEC)" "$(NUMPY_SPEC)" $(DONE)
	@# `pip show` lists the requirements whose markers hold here: a CUDA build names triton, a CPU build does not.
	@if ! $(PIP) show torch | grep -qE '^Requires:.*\btriton\b'; then \
		echo "==> [4/5] $(TORCH_SPEC) requires no triton (a CPU build): adding $(TRITON_SPEC)"; \
		$(TIMED) $(PIP) install --quiet "$(TRITON_SPEC)" $(DONE); \
	else \
		echo "==> [4/5] triton: the one $(TORCH_SPEC) requires, installed with it"; \
	fi
	$(STEP) "[5/5] installing tritonkit (editable) with its dev extra: test, lint, bench, hf and learn packages"
	@$(TIMED) $(PIP) install --quiet -e ".[dev]" $(DONE)
	@rm -f $(VENV)/.installed*
	@touch $(STAMP)
	@$(BIN)/python -c 'import numpy, torch, triton; \
		print(f"Installed in $(VENV): torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}")'
	@echo 'To put tritonkit on your PATH, activate the environment: source $(VENV)/bin/activate'

install: $(STAMP)

check: $(STAMP)
	$(BIN)/tritonkit check

# The interpreter runs one kernel on one core: a worker per core (pytest-xdist) divides the suite's time by the cores.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(STAMP)
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
