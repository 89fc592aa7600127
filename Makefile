# Two commands on a fresh machine:  `make course`  and  `make test`.
# Both create .venv from the project's own files when it is missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A CPU build of torch, pinned exactly: a looser requirement lets pip pull a CUDA build of several GB.
TORCH_SPEC ?= torch==2.13.0
# CuPy. Where an NVIDIA driver answers, with the CUDA toolkit's wheels (NVRTC, cuRAND) for the driver's CUDA major;
# elsewhere CuPy alone, enough for the tests without a GPU.
GPU_EXTRA ?= $(shell v=$$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1); \
	if [ -z "$$v" ]; then echo gpu; elif [ "$$v" -ge 13 ]; then echo cuda13; else echo cuda12; fi)
# JupyterLab: on this machine only, unless HOST says otherwise (HOST=0.0.0.0 on a remote GPU instance). Its root is
# the repository, so nbgrader's formgrader sees the course directory labs/; JupyterLab runs as root (containers,
# cloud GPU instances) only when told, so the flag is added for root alone.
HOST ?= 127.0.0.1
PORT ?= 8888
# PATH: nbgrader runs the venv's `alembic` by name when it creates a gradebook, so the venv's bin/ comes first.
LAB := PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --ServerApp.ip=$(HOST) --ServerApp.port=$(PORT) \
	$(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: course grade grade-quiz test check browser bench gpu-check clean-venv student-labs i18n

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[course,$(GPU_EXTRA),torch,dev]"
	touch $@

# Opens the course in JupyterLab on the simulated GPU (no GPU needed).
course: $(BIN)/.installed labs/exchange
	MINIALLOC_DEVICE=$${MINIALLOC_DEVICE:-sim} $(LAB) --LabApp.default_url=/lab/tree/course/00_start_here.ipynb

# The instructor's first command: nbgrader's formgrader on the course directory labs/ (assignments, submissions,
# the gradebook), in the same JupyterLab, with the grader's browser defences (quizzes/grader/browser_guard.py: a
# Content-Security-Policy on the formgrader and on served files, escaped and sanitized formgrader pages). The
# extension is named on the command line, so the instructor's own Jupyter configuration still applies.
GRADE_GUARD := --ServerApp.jpserver_extensions=quizzes.grader.browser_guard=True
grade: $(BIN)/.installed labs/exchange
	$(LAB) $(GRADE_GUARD) --LabApp.default_url=/formgrader

# nbgrader's exchange on this machine (nbgrader_config.py: Exchange.root), shared and sticky as nbgrader wants it;
# release and collect through it also need CourseDirectory.course_id (labs/README.md)
labs/exchange:
	mkdir -p $@ && chmod 3777 $@

# The graded quiz is a course of its own (quizzes/graded/, built by `python -m quizzes build-graded --bank DIR`):
# its formgrader, served from there so nbgrader reads that course's nbgrader_config.py.
grade-quiz: $(BIN)/.installed
	cd quizzes/graded && $(subst $(BIN)/,$(CURDIR)/$(BIN)/,$(LAB)) $(GRADE_GUARD) --LabApp.default_url=/formgrader

# The whole test suite: lint, then every test (notebooks, nbgrader, a real browser and Binder included).
# two workers (pytest-xdist): the notebooks and nbgrader runs keep both cores busy
TEST_WORKERS ?= 2
test: $(BIN)/.installed browser
	$(BIN)/ruff check minialloc quizzes course_i18n tests bench tools nbgrader_config.py
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The quick loop while working: lint every Python file (the notebooks' cells are not modules), then the tests that
# need no notebook, nbgrader, browser or minutes (under a minute on two cores). `make test` is still what CI runs.
CHECK_MARKERS := not notebooks and not nbgrader and not browser and not slow
check: $(BIN)/.installed
	$(BIN)/ruff check --extend-exclude '*.ipynb' .
	$(BIN)/python -m pytest -q -m "$(CHECK_MARKERS)"

# Benchmarks print figures; they are not tests. Every bench/*.py runs, each with the same flags
# (BENCH_FLAGS=--quick for a short run).
BENCH_FLAGS ?=
bench: $(BIN)/.installed
	@for script in bench/*.py; do echo "== $$script"; $(BIN)/python "$$script" $(BENCH_FLAGS) || exit 1; done

# labs/student/: the labs as students get them (nbgrader generate_assignment on labs/source), for self-learners.
# Run it after editing a lab and commit the result; tests/test_labs.py fails while labs/student/ is out of date.
student-labs: $(BIN)/.installed
	$(BIN)/python tools/make_student_labs.py

# The course in Vietnamese and German: update the catalogs course/locale/<lang>/*.po from the English notebooks
# (changed English becomes fuzzy), then write course/vi/ and course/de/ from them. Commit both; `make test` runs
# `python -m course_i18n check` (tests/test_i18n.py), which fails on a stale notebook, an untranslated or fuzzy
# entry, or a glossary violation. Drafts being translated live in course/locale-work/, which the check ignores:
# `$(BIN)/python -m course_i18n --only course --locale-dir course/locale-work extract` updates them.
i18n: $(BIN)/.installed
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

# Debian's Chromium for tests/test_browser.py (needs root for apt-get: `sudo make browser`). Never `playwright install`.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
	  || { echo "tests/test_browser.py needs Debian's chromium: run 'sudo make browser' once"; exit 1; }
