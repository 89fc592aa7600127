# Two commands on a fresh machine:  `make course`  and  `make test`.
# Both create .venv from the project's own files when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A CPU build of torch, pinned exactly: a looser requirement lets pip pull a CUDA build of several GB.
TORCH_SPEC ?= torch==2.13.0

.PHONY: course test browser bench gpu-check clean-venv

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[course,gpu,torch,dev]"
	touch $@

# Opens the course in JupyterLab on the simulated GPU (no GPU needed).
course: $(BIN)/.installed
	MINIALLOC_DEVICE=$${MINIALLOC_DEVICE:-sim} $(BIN)/jupyter lab course/

# The whole test suite: lint, then every test (notebooks, nbgrader, a real browser and Binder included).
test: $(BIN)/.installed browser
	$(BIN)/ruff check minialloc quizzes tests bench tools nbgrader_config.py
	$(BIN)/python -m pytest -q

# Benchmarks print figures; they are not tests.
bench: $(BIN)/.installed
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/efficiency.py
	$(BIN)/python bench/serve_sim.py
	$(BIN)/python bench/paging.py
	$(BIN)/python bench/viz_bench.py

clean-venv:
	rm -rf $(VENV)

# The GPU checks on a GPU machine; --dry-run runs their CPU side anywhere (CI runs that through the tests).
gpu-check: $(BIN)/.installed
	PYTHON=$(BIN)/python tools/gpu_check.sh

# Debian's Chromium for tests/test_browser.py (needs root for apt-get: `sudo make browser`). Never `playwright install`.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
	  || { echo "tests/test_browser.py needs Debian's chromium: run 'sudo make browser' once"; exit 1; }
