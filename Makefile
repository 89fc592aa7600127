# Two commands on a fresh machine:  `make course`  and  `make test`.
# Each builds the part of .venv it needs, in layers, and a later command completes the venv an earlier one made
# (no layer is rebuilt from scratch; a change to pyproject.toml or this file re-runs pip over the same venv):
#   .installed-course  the course's own stack: JupyterLab, ipywidgets, matplotlib, nbgrader, minialloc and the
#                      quizzes (pip install -e ".[course]"). No torch, no CuPy: without a GPU the chapters skip
#                      their PyTorch cells, and only chapter 5's trace viewer (torch.cuda._memory_viz) runs on a CPU.
#   .installed-gpu     only where an NVIDIA driver answers (nvidia-smi): PyTorch ($(TORCH_SPEC)) and CuPy with the
#                      CUDA toolkit's wheels, so the chapters' PyTorch cells run side by side with minialloc.
#   .installed-test    what the tests need on top: PyTorch (snapshot and _memory_viz round trips), CuPy (the PTX
#                      builds), pytest, Playwright, ruff (the dev extra).
#   tests/interop/node_modules: the independent certificate verifiers (Digital Bazaar's vc and did:web resolver,
#                      DCC's verifier-core), exactly as tests/interop/package-lock.json pins them (npm ci).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# pip's arguments for PyTorch, as written (not quoted): the version minialloc mirrors, pinned exactly. What it
# brings depends on the index. PyPI serves torch==2.13.0 for Linux x86_64 as a CUDA build that pulls NVIDIA's CUDA
# libraries as dependencies: what a GPU instance wants, and what `make test` gets on a Linux laptop unless told
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# (PyTorch's CPU wheels, no NVIDIA libraries). On macOS and Windows, PyPI's torch is a CPU build already.
TORCH_SPEC ?= torch==2.13.0
# The CUDA major of the driver that answers nvidia-smi (12, 13), empty where none does: the choice between the
# light course and the GPU one. `make course CUDA_MAJOR=` installs the light course on a GPU machine too.
ifndef CUDA_MAJOR
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
endif
# CuPy: where a driver answers, with the CUDA toolkit's wheels (NVRTC, cuRAND; pyproject.toml's cuda12/cuda13
# extras) for the driver's CUDA major; elsewhere CuPy alone (the gpu extra), enough for the PTX builds in the tests.
CUPY_EXTRA := $(if $(CUDA_MAJOR),$(if $(filter 0 1 2 3 4 5 6 7 8 9 10 11 12,$(CUDA_MAJOR)),cuda12,cuda13),gpu)
COURSE_STAMP := $(BIN)/.installed-$(if $(CUDA_MAJOR),gpu,course)
TEST_STAMP := $(BIN)/.installed-test
# npm ci: the lock file's exact versions and integrity hashes; --ignore-scripts: no package runs code at install
INTEROP_STAMP := tests/interop/node_modules/.installed
# The editable install puts the repository on sys.path (setuptools' compat mode, a .pth line), not a finder appended
# to sys.meta_path (its default): with the default, a folder named minialloc in the directory Python starts in (a
# clone at ~/minialloc, run from the home) is imported as an empty namespace package before the finder is asked.
EDITABLE := --config-settings editable_mode=compat
# JupyterLab: on this machine only, unless HOST says otherwise (HOST=0.0.0.0 on a remote GPU instance). Its root is
# the repository, so nbgrader's formgrader sees the course directory labs/; JupyterLab runs as root (containers,
# cloud GPU instances) only when told, so the flag is added for root alone.
HOST ?= 127.0.0.1
PORT ?= 8888
# PATH: nbgrader runs the venv's `alembic` by name when it creates a gradebook, so the venv's bin/ comes first.
LAB := PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --ServerApp.ip=$(HOST) --ServerApp.port=$(PORT) \
	$(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: course grade grade-quiz exchange hub test check system-packages bench gpu-check clean-venv student-labs i18n

$(BIN)/.installed-course: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[course]" $(EDITABLE)
	touch $@

# torch first, on its own: the torch extra's looser requirement is then already met and pip changes nothing.
$(BIN)/.installed-gpu: $(BIN)/.installed-course
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[course,torch,$(CUPY_EXTRA)]" $(EDITABLE)
	touch $@

$(TEST_STAMP): $(COURSE_STAMP)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[course,torch,$(CUPY_EXTRA),dev]" $(EDITABLE)
	touch $@

$(INTEROP_STAMP): tests/interop/package.json tests/interop/package-lock.json
	cd tests/interop && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

# Opens the course in JupyterLab on the simulated GPU (no GPU needed). A venv without PyTorch (no driver answered)
# says in one line how to add it: a CPU build, for chapter 5's trace viewer (chapters 1 to 3's PyTorch cells also
# need a GPU).
course: $(COURSE_STAMP)
	@$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" || \
	echo "PyTorch is not installed, so the chapters skip their \
	PyTorch cells; to add it: $(BIN)/python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
	MINIALLOC_DEVICE=$${MINIALLOC_DEVICE:-sim} \
	JUPYTER_CONFIG_PATH="$(CURDIR)/course/jupyter-learner$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(LAB) --LabApp.default_url=/lab/tree/course/00_start_here.ipynb

# The instructor's first command: nbgrader's formgrader on the course directory labs/ (assignments, submissions,
# the gradebook), in the same JupyterLab, with the grader's browser defences (grading/browser_guard.py: a
# Content-Security-Policy on the formgrader and on served files, escaped and sanitized formgrader pages). The
# extension is named on the command line, so the instructor's own Jupyter configuration still applies.
GRADE_GUARD := --ServerApp.jpserver_extensions=grading.browser_guard=True
grade: $(COURSE_STAMP) exchange
	$(LAB) $(GRADE_GUARD) --LabApp.default_url=/formgrader

# nbgrader's exchange on this machine: its default root, outside the course directory (no repository file sets
# Exchange.root: a site's /etc/jupyter/nbgrader_config.py names its own). Made by root, shared and sticky as nbgrader
# wants it; for anyone else a missing one is a one-line hint (grading works without it, release and collect do not).
EXCHANGE ?= /usr/local/share/nbgrader/exchange
exchange:
	@if [ -d "$(EXCHANGE)" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then mkdir -p "$(EXCHANGE)" && chmod 1777 "$(EXCHANGE)"; \
	else echo "nbgrader's exchange $(EXCHANGE) is missing (release and collect need it): run  sudo make exchange"; fi

# The graded quiz is a course of its own (quizzes/graded/, built by `python -m quizzes build-graded --bank DIR`):
# its formgrader, served from there so nbgrader reads that course's nbgrader_config.py.
grade-quiz: $(COURSE_STAMP)
	cd quizzes/graded && $(subst $(BIN)/,$(CURDIR)/$(BIN)/,$(LAB)) $(GRADE_GUARD) --LabApp.default_url=/formgrader

# The class on one machine's JupyterHub (deploy/hub/, docs/jupyterhub.md; tests/test_jupyterhub.py runs it): a venv
# every account can run, so made from the system's Python (a Python under root's home cannot be run by the hub's
# users), with minialloc installed as a package (not editable: no account needs this folder), JupyterHub (the hub
# extra) and the proxy from npm (deploy/hub/package.json, locked), in deploy/hub/node_modules/.
HUB_PYTHON ?= /usr/bin/python3
HUB_VENV ?= .venv-hub
HUB_STAMP := $(HUB_VENV)/bin/.installed-hub
# installed, not editable: the copy is made again whenever a file of the packages changes
HUB_SOURCES := $(shell find minialloc quizzes grading course_i18n -type f -not -path '*/__pycache__/*' 2>/dev/null)
$(HUB_STAMP): pyproject.toml Makefile deploy/hub/package.json deploy/hub/package-lock.json $(HUB_SOURCES)
	test -x $(HUB_VENV)/bin/python || $(HUB_PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/python -m pip install -q --upgrade pip
	$(HUB_VENV)/bin/python -m pip install -q ".[course,hub]"
	cd deploy/hub && npm ci --silent --no-audit --no-fund
	touch $@
hub: $(HUB_STAMP)

# The whole test suite: lint, then every test (notebooks, nbgrader, a real browser and Binder included). The system
# packages come first, so that a machine that lacks them says so before pip's minutes.
# two workers (pytest-xdist): the notebooks and nbgrader runs keep both cores busy
TEST_WORKERS ?= 2
test: system-packages $(TEST_STAMP) $(INTEROP_STAMP) $(HUB_STAMP)
	$(BIN)/ruff check minialloc quizzes grading course_i18n tests bench tools nbgrader_config.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The quick loop while working: lint every Python file (the notebooks' cells are not modules), then the tests that
# need no notebook, nbgrader, browser or minutes (under a minute on two cores). `make test` is still what CI runs.
# On the same workers as `make test` (a file's tests on one worker, its module fixtures built once): one process
# left a core idle for half of the loop. CHECK_WORKERS=0 runs it in one process.
CHECK_MARKERS := not notebooks and not nbgrader and not browser and not slow
CHECK_WORKERS ?= $(TEST_WORKERS)
check: $(TEST_STAMP) $(INTEROP_STAMP)
	$(BIN)/ruff check --extend-exclude '*.ipynb' .
	$(BIN)/python -m pytest -q -m "$(CHECK_MARKERS)" -n $(CHECK_WORKERS) --dist loadgroup

# Benchmarks print figures; they are not tests. Every bench/*.py runs, each with the same flags
# (BENCH_FLAGS=--quick for a short run). They need the course's layer only (minialloc and matplotlib).
BENCH_FLAGS ?=
bench: $(COURSE_STAMP)
	@for script in bench/*.py; do echo "== $$script"; $(BIN)/python "$$script" $(BENCH_FLAGS) || exit 1; done

# labs/student/: the labs as students get them (nbgrader generate_assignment on labs/source), for self-learners.
# Run it after editing a lab and commit the result; tests/test_labs.py fails while labs/student/ is out of date.
student-labs: $(COURSE_STAMP)
	$(BIN)/python tools/make_student_labs.py

# The course in Vietnamese and German: update the catalogs course/locale/<lang>/*.po from the English notebooks
# (changed English becomes fuzzy), then write course/vi/ and course/de/ from them; likewise the code's strings
# (minialloc/locale/, quizzes/locale/: .po updated from the messages() tables, compiled to .mo). Commit both; `make test` runs
# `python -m course_i18n check` (tests/test_i18n.py), which fails on a stale notebook, an untranslated or fuzzy
# entry, or a glossary violation. Drafts being translated live in course/locale-work/, which the check ignores:
# `$(BIN)/python -m course_i18n --only course --locale-dir course/locale-work extract` updates them.
i18n: $(COURSE_STAMP)
	$(BIN)/python -m course_i18n extract
	$(BIN)/python -m course_i18n --only course --locale-dir course/locale-work extract
	$(BIN)/python -m course_i18n --only labs --labs-locale-dir labs/locale-work extract
	$(BIN)/python -m course_i18n build
	$(BIN)/python tools/make_student_labs.py

clean-venv:
	rm -rf $(VENV)

# The GPU checks on a GPU machine; --dry-run runs their CPU side anywhere (CI runs that through the tests).
# It builds nothing: it uses .venv when there is one, else the machine's python3 (GPU_PYTHON=... to choose).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHON=$(GPU_PYTHON) tools/gpu_check.sh

# The Debian packages the tests need: Chromium (tests/test_browser.py; Playwright drives it, never
# `playwright install`), bubblewrap (autograde runs every student kernel under it: the nbgrader tests) and, where
# Debian's python3 lacks ensurepip, python3-venv (the venvs of make and tests/test_binder.py), and PostgreSQL's
# server (tests/test_parallel_grading.py starts one on loopback from its initdb, as a gradebook). As root,
# apt-get installs the missing ones after one package index update; otherwise one line gives the command to run.
# Debian keeps PostgreSQL's initdb off PATH, under its major version
POSTGRES_INITDB ?= /usr/lib/postgresql/*/bin/initdb
system-packages:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	$(PYTHON) -c "import ensurepip" >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	set -- $(POSTGRES_INITDB); [ -x "$$1" ] || missing="$$missing postgresql"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "the tests need Debian's$$missing: run  sudo make system-packages  (apt-get installs them), then \
	make test again"; \
	  exit 1; \
	fi; \
	echo "installing$$missing (apt-get, as root)"; \
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing
