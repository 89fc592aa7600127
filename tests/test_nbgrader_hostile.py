"""nbgrader end to end against hostile submissions, for every lab and every graded quiz.

Each assignment gets a temporary course directory configured by its own nbgrader_config.py (root and gradebook
moved there). The real pipeline runs once per assignment: generate_assignment, one submission per student below,
NbGraderAPI.autograde for each, generate_feedback for all, and the CSV export; the tests then read the gradebook,
the autograded notebooks and the timings. Assignments are graded in parallel worker processes (one course each,
so the SQLite gradebooks never see two writers), which keeps the whole file at two to three minutes on two
cores.

Students (what each submission does, and what it must get):
- solution: the instructor's solution (the quiz's is computed for the student's own id): full marks.
- release: the release untouched: 0, in bounded time.
- partial: the first task answered: exactly that task's points.
- hang: the solution, with `while True: pass` after the first answer: that cell times out, every later cell is
  still graded (full marks), and the autograde takes the timeout plus seconds.
- hang_sigint: the same loop after ignoring SIGINT: the grader kills the kernel, the later cells fail, bounded.
- os_exit: the solution, leaving with os._exit(0) at the end of the last answer: the tests before it keep their
  points, the later ones score 0 (nbgrader 0.9.6 alone aborts the student's autograde).
- kill: the release, killing its own kernel with SIGKILL first thing: 0, graded, with feedback.
- sys_exit: the release calling sys.exit() and then quit(): 0.
- showtraceback: the release with IPython's showtraceback silenced (nbgrader's own test_showtraceback_exploit): 0.
- displayhook: the release printing an execute_result before every cell, which nbgrader takes as partial credit
  ahead of the error: 0 (ErrorsFailTests in the config).
- flood: the solution, printing megabytes in one line and in many: output capped, full marks.
- tamper: the release with its test cells edited, deleted, retyped, relabelled, re-pointed and duplicated, an
  answer cell claiming 50 points and a bonus cell: every test restored from the gradebook, 0.
- rebind: the release plus a cell after each locked cell that rebinds what it defined (helpers, imports, the
  quiz's checker and answers dict) to a do-nothing stand-in: 0 once the hidden tests use their own copies
  (xfail while a lab's source is not hardened: see harden(); a hardened copy of each such lab is graded too,
  to show the hardening works before it is applied).
- transformer: the release with an IPython input transformer that wraps every later cell in try/except. Nothing
  inside the kernel can stop that; the grader flags the submission for manual review instead.
Every submission whose student-written code reaches into IPython or the interpreter must be flagged for review;
the solution, release and partial submissions must not be.

`python tests/test_nbgrader_hostile.py harden NOTEBOOK...` rewrites source notebooks so that their hidden tests
use the grader's own copies of the locked cells (see harden()).
"""

from __future__ import annotations

import ast
import copy
import csv
import json
import os
import re
import shutil
import sys
import time
import traceback
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
HANG_TIMEOUT_S = 5  # Execute.timeout for the looping students (the repository's config says 30)
HANG_GRACE_S = 3  # GuardedExecute.interrupt_grace for them
IOPUB_TIMEOUT_S = 4  # nbclient's default wait for the output of an interrupted cell
RELEASE_BUDGET_S = 60  # grading a release whose answers raise at once
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
HIDDEN = re.compile(r"(^[ \t]*### BEGIN HIDDEN TESTS[ \t]*\n)(.*?)(^[ \t]*### END HIDDEN TESTS)", re.S | re.M)
HIDDEN_PREFIX = "_grader_"  # the hardened hidden tests' names for their copies of locked names
# nbgrader's own gradebook code trips SQLAlchemy's session warnings; they say nothing about the submissions
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")


# --- The assignments: one line each ------------------------------------------------------------------------------

def quiz_solution(assignment: str, student: str) -> NotebookNode:
    """The graded quiz's reference answers for `student`: its computed questions depend on the submitter's id."""
    from quizzes.graded import quiz
    from quizzes.graded.build import build_notebook

    return build_notebook(quiz(assignment), student)


@dataclass(frozen=True)
class Assignment:
    name: str  # the nbgrader assignment id, also the notebook's name
    source_dir: Path  # the course's source folder: source_dir/<name>/<name>.ipynb
    config: Path  # the nbgrader_config.py an instructor grades it with
    solution_for: Callable[[str, str], NotebookNode] | None = None  # (assignment, student) -> solution notebook
    student_names: tuple[str, ...] = ()  # names locked cells bind for the student to fill in (the quiz's answers)
    hardenable: bool = True  # whether harden() applies (the quiz's hidden tests are generated by quizzes.graded)

    @property
    def notebook(self) -> Path:
        return self.source_dir / self.name / f"{self.name}.ipynb"

    def source(self) -> NotebookNode:
        return nbformat.read(self.notebook, as_version=4)

    def solution(self, student: str) -> NotebookNode:
        return self.solution_for(self.name, student) if self.solution_for else self.source()


LABS = sorted(p.name for p in LABS_SOURCE.iterdir() if (p / f"{p.name}.ipynb").is_file())
ASSIGNMENTS = [Assignment(lab, LABS_SOURCE, REPO_CONFIG) for lab in LABS]
QUIZZES = sorted(p.name for p in (QUIZ_DIR / "source").glob("*") if (p / f"{p.name}.ipynb").is_file())
ASSIGNMENTS += [Assignment(quiz, QUIZ_DIR / "source", QUIZ_DIR / "nbgrader_config.py", quiz_solution,
                           student_names=("answers",), hardenable=False) for quiz in QUIZZES]
BY_NAME = {a.name: a for a in ASSIGNMENTS}


# --- Notebook helpers ----------------------------------------------------------------------------------------------

def meta(cell: NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


def is_test(cell: NotebookNode) -> bool:
    return bool(meta(cell).get("grade")) and not meta(cell).get("solution")


def is_answer(cell: NotebookNode) -> bool:
    return bool(meta(cell).get("solution"))


def is_locked_helper(cell: NotebookNode) -> bool:
    """A locked code cell that is not a test: setup, helpers. A student cell after it can shadow what it defines."""
    return cell.cell_type == "code" and bool(meta(cell).get("locked")) and not meta(cell).get("grade")


def points(nb: NotebookNode) -> dict[str, float]:
    return {meta(c)["grade_id"]: float(meta(c)["points"]) for c in nb.cells if meta(c).get("grade")}


def group(grade_id: str) -> str:
    """A task's answers and tests share the grade id's first word: task1_sizes / task1_sizes_tests, q01_*."""
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


# --- Locked names, and the hardening of hidden tests ---------------------------------------------------------------

def bound_names(source: str) -> list[str]:
    """Names a cell binds at its top level: imports, functions, classes, assignments."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def shadowable(nb: NotebookNode, student_names: tuple[str, ...] = ()) -> dict[int, list[str]]:
    """Locked helper cell index -> the names it binds that hidden tests must not look up by their public name.

    Names that a test cell or a plain cell binds too (`trace`, `allocator`) are the tests' own variables, bound
    right before use; names the student is meant to fill in (the quiz's `answers`) are the submission itself.
    """
    elsewhere = {name for c in nb.cells if c.cell_type == "code" and not is_locked_helper(c) and not is_answer(c)
                 for name in bound_names(HIDDEN.sub("", c.source))}
    return {i: [n for n in bound_names(c.source) if n not in elsewhere and n not in student_names]
            for i, c in enumerate(nb.cells) if is_locked_helper(c)}


def names_used(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}


def exposed(nb: NotebookNode, student_names: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Test cell grade_id -> public names of locked cells that its hidden tests look up (empty when hardened)."""
    helpers = shadowable(nb, student_names)
    out = {}
    for i, cell in enumerate(nb.cells):
        if is_test(cell):
            defined = {n for j, names in helpers.items() if j < i for n in names}
            used = sorted({n for block in HIDDEN.findall(cell.source) for n in names_used(block[1])} & defined)
            if used:
                out[meta(cell)["grade_id"]] = used
    return out


def rename(code: str, mapping: dict[str, str]) -> str:
    """`code` with every name in `mapping` renamed: loads, stores, defs, classes and the names imports bind."""
    tree = ast.parse(code)
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return offsets[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode())

    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in mapping:
            start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
            if code[start:end] != node.id:  # f-string positions before Python 3.12 can be off: refuse, do not guess
                raise ValueError(f"cannot locate {node.id!r} at line {node.lineno}")
            edits.append((start, end, mapping[node.id]))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in mapping:
            start = at(node.lineno, node.col_offset)
            found = re.compile(rf"(def|class)\s+({re.escape(node.name)})\b").search(code, start)
            edits.append((found.start(2), found.end(2), mapping[node.name]))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [a.asname or a.name.split(".")[0] for a in node.names]
            if any(b in mapping for b in bound):
                if any("." in a.name and not a.asname for a in node.names if isinstance(node, ast.Import)):
                    raise ValueError(f"cannot rename a dotted import at line {node.lineno}")
                statements = []  # one import per name, so that every line stays short
                for alias, b in zip(node.names, bound, strict=True):
                    one = copy.deepcopy(node)
                    one.names = [ast.alias(alias.name, mapping.get(b, alias.asname))]
                    statements.append(ast.unparse(one))
                indent = "\n" + " " * node.col_offset
                edits.append((at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset),
                               indent.join(statements)))
        elif isinstance(node, ast.arg) and node.arg in mapping:
            raise ValueError(f"parameter {node.arg!r} at line {node.lineno} would shadow a renamed name")
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and set(node.names) & set(mapping):
            raise ValueError(f"global/nonlocal of a renamed name at line {node.lineno}")
    for start, end, text in sorted(edits, reverse=True):
        code = code[:start] + text + code[end:]
    return code


PREAMBLE = ("# The grader's own copy of the locked cells above, under hidden names: a student cell that redefines\n"
            "# a helper, an import or a constant cannot change what the hidden tests below run.\n")


def harden(nb: NotebookNode, student_names: tuple[str, ...] = ()) -> NotebookNode:
    """Make hidden tests independent of names a student can rebind.

    The first test cell whose hidden tests look up a name defined by a locked helper cell (setup, helpers) gets a
    hidden block at its top: a copy of the locked cells before it that no earlier test cell copied, every name
    they bind renamed `_grader_<name>` (imports re-imported under that name). At the top, the copy runs even when
    the cell's visible asserts fail, so later cells can rely on it. The hidden tests then use the `_grader_`
    names; the visible tests stay as they are. harden() of a hardened notebook changes nothing.
    """
    nb = copy.deepcopy(nb)
    if exposed(nb, student_names) and HIDDEN_PREFIX in "".join(c.source for c in nb.cells):
        raise ValueError(f"the notebook already uses names starting with {HIDDEN_PREFIX}: pick another prefix")
    helpers = shadowable(nb, student_names)
    bound = {i: bound_names(c.source) for i, c in enumerate(nb.cells) if is_locked_helper(c)}
    copied: set[int] = set()
    for i, cell in enumerate(nb.cells):
        if not is_test(cell):
            continue
        use = {n: HIDDEN_PREFIX + n for j, names in helpers.items() if j < i for n in names}
        if not any(names_used(body) & set(use) for _, body, _ in HIDDEN.findall(cell.source)):
            continue
        cell.source = HIDDEN.sub(lambda m, use=use: m.group(1) + rename(m.group(2), use) + m.group(3), cell.source)
        todo = [j for j in bound if j < i and j not in copied]
        if todo:
            if any(set(bound[j]) & set(student_names) for j in todo):
                raise ValueError("a locked cell binds a name the student fills in: copying it would reset it")
            everything = {n: HIDDEN_PREFIX + n for j in bound if j < i for n in bound[j]}
            copies = "\n".join(rename(nb.cells[j].source.rstrip() + "\n", everything) for j in todo)
            cell.source = f"### BEGIN HIDDEN TESTS\n{PREAMBLE}{copies}### END HIDDEN TESTS\n{cell.source}"
            copied.update(todo)
    return nb


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


@dataclass
class Context:
    assignment: Assignment
    source: NotebookNode  # what generate_assignment read
    release: NotebookNode

    def solution(self, student: str) -> NotebookNode:
        return self.assignment.solution(student)


def release_with(ctx: Context, *sources: str) -> NotebookNode:
    """The release with its first answer cells replaced by `sources`."""
    nb = copy.deepcopy(ctx.release)
    for cell, source in zip([c for c in nb.cells if is_answer(c)], sources, strict=False):
        cell.source = source
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
    first_answer(nb).source += "\n\nwhile True:  # never returns\n    pass\n"
    return nb


def s_hang_sigint(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    first_answer(nb).source += ("\n\nimport signal\n\nsignal.signal(signal.SIGINT, signal.SIG_IGN)  # no interrupt\n"
                                "while True:\n    pass\n")
    return nb


def s_os_exit(ctx: Context, student: str) -> NotebookNode:
    nb = ctx.solution(student)
    last_answer(nb).source += "\n\nimport os\n\nos._exit(0)\n"
    return nb


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
    first_answer(nb).source += (f"\n\nprint('x' * {FLOOD_LINE_CHARS})  # one line of megabytes\n"
                                f"for _ in range({FLOOD_LINES}):\n    print('y' * 100)\n")
    return nb


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
    helpers = shadowable(nb, ())  # the cheat rebinds everything, answers dict included
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


STUDENTS: dict[str, Callable[[Context, str], NotebookNode]] = {
    "solution": s_solution, "release": s_release, "partial": s_partial, "hang": s_hang,
    "hang_sigint": s_hang_sigint, "os_exit": s_os_exit, "kill": s_kill, "sys_exit": s_sys_exit,
    "showtraceback": s_showtraceback, "displayhook": s_displayhook, "flood": s_flood, "tamper": s_tamper,
    "rebind": s_rebind, "transformer": s_transformer,
}
LOOPING = ("hang", "hang_sigint")  # graded with HANG_TIMEOUT_S instead of the repository's 30 s
HARDENED_STUDENTS = ("solution", "rebind")  # what the hardened copy of a lab is graded with
REVIEWED = ("hang_sigint", "os_exit", "kill", "showtraceback", "displayhook", "transformer")  # must be flagged
NOT_REVIEWED = ("solution", "release", "partial", "hang", "flood", "tamper")  # must not be


# --- Grading, in worker processes ------------------------------------------------------------------------------------

@dataclass
class Job:
    assignment: Assignment
    workdir: str
    students: tuple[str, ...]
    hardened: bool = False  # grade harden(source) instead of the committed source


def load_config(assignment: Assignment, root: Path):
    config = PyFileConfigLoader(assignment.config.name, path=str(assignment.config.parent)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    return config


def grade(job: Job) -> dict:
    """Run the whole pipeline for one assignment in its own course directory; return what the tests check."""
    try:
        return _grade(job)
    except Exception:
        return {"crash": traceback.format_exc()}


def _grade(job: Job) -> dict:
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI
    from nbgrader.plugins import CsvExportPlugin

    # nbgrader runs the `alembic` script by name; the venv need not be activated
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    # the grading kernels import minialloc and, for the quiz, the repository's quizzes package
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["MINIALLOC_DEVICE"] = "sim"
    os.environ["MPLBACKEND"] = "Agg"
    a, root = job.assignment, Path(job.workdir)
    name = a.name
    (root / "source").mkdir(parents=True)
    shutil.copytree(a.notebook.parent, root / "source" / name)
    source = a.source()
    if job.hardened:
        source = harden(source, a.student_names)
        nbformat.write(source, root / "source" / name / f"{name}.ipynb")
    config = load_config(a, root)
    api = NbGraderAPI(config=config)
    looping = copy.deepcopy(config)
    looping.Execute.timeout = HANG_TIMEOUT_S
    looping.GuardedExecute.interrupt_grace = HANG_GRACE_S
    looping_api = NbGraderAPI(config=looping)

    start = time.monotonic()
    generated = api.generate_assignment(name)
    out: dict = {"root": str(root), "generate": generated["success"], "generate_s": time.monotonic() - start,
                 "log": {"generate": generated.get("log", "")[-4000:]}, "students": {}}
    if not generated["success"]:
        return out
    release = nbformat.read(root / "release" / name / f"{name}.ipynb", as_version=4)
    ctx = Context(a, source, release)
    if job.hardened:
        ctx.assignment = Assignment(name, root / "source", a.config, None, a.student_names, a.hardenable)
    for student in job.students:
        folder = root / "submitted" / student / name
        folder.mkdir(parents=True)
        nbformat.write(STUDENTS[student](ctx, student), folder / f"{name}.ipynb")
    for student in job.students:
        start = time.monotonic()
        result = (looping_api if student in LOOPING else api).autograde(name, student)
        out["students"][student] = {"success": result["success"], "seconds": time.monotonic() - start}
        out["log"][student] = (result.get("log") or "")[-6000:]
    feedback = api.generate_feedback(name)
    out["feedback"] = feedback["success"]
    with Gradebook(config.CourseDirectory.db_url) as gb:
        for student, record in out["students"].items():
            submission = gb.find_submission(name, student)
            notebook = gb.find_submission_notebook(name, name, student)
            record.update(score=submission.score, max_score=submission.max_score,
                          cells={g.name: g.score for g in notebook.grades},
                          needs_review=any(g.needs_manual_grade for g in notebook.grades))
        CsvExportPlugin(to=str(root / "grades.csv")).export(gb)
    return out


@dataclass
class Results:
    by_job: dict[tuple[str, bool], dict] = field(default_factory=dict)
    seconds: float = 0.0

    def get(self, assignment: str, hardened: bool = False) -> dict:
        out = self.by_job[assignment, hardened]
        assert "crash" not in out, out["crash"]
        assert out["generate"], out["log"]["generate"]
        return out

    def student(self, assignment: str, student: str, hardened: bool = False) -> dict:
        return self.get(assignment, hardened)["students"][student]

    def autograded(self, assignment: str, student: str, hardened: bool = False) -> NotebookNode:
        root = Path(self.get(assignment, hardened)["root"])
        return nbformat.read(root / "autograded" / student / assignment / f"{assignment}.ipynb", as_version=4)


def jobs(tmp: Path) -> list[Job]:
    out = [Job(a, str(tmp / a.name), tuple(STUDENTS)) for a in ASSIGNMENTS]
    out += [Job(a, str(tmp / f"{a.name}-hardened"), HARDENED_STUDENTS, hardened=True)
            for a in ASSIGNMENTS if a.hardenable and exposed(a.source(), a.student_names)]
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    tmp = tmp_path_factory.mktemp("hostile")
    todo = jobs(tmp)
    start = time.monotonic()
    workers = max(1, min(len(todo), os.cpu_count() or 1, 4))
    # spawn, not fork: the workers run kernels and event loops of their own
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        done = dict(zip([(j.assignment.name, j.hardened) for j in todo], pool.map(grade, todo), strict=True))
    yield Results(done, time.monotonic() - start)


# --- Which defences an assignment's own config and source already have ----------------------------------------------

def config_is_hardened(assignment: Assignment) -> bool:
    """Does the assignment's nbgrader config install the grader's preprocessors from nbgrader_config.py?"""
    config = load_config(assignment, Path("/nonexistent"))
    names = [getattr(p, "__name__", str(p)) for p in config.Autograde.get("autograde_preprocessors", [])]
    names += [getattr(p, "__name__", str(p)) for p in config.Autograde.get("sanitize_preprocessors", [])]
    return {"GuardedExecute", "RestoringOverwriteCells", "ErrorsFailTests", "FlagForReview"} <= {
        n.rsplit(".", 1)[-1] for n in names}


def needs_config(assignment: Assignment):
    """xfail the checks that need the repository's grader preprocessors while an assignment's config lacks them."""
    return pytest.mark.xfail(
        not config_is_hardened(assignment), strict=True,
        reason=f"{assignment.config.relative_to(ROOT)} does not load the grader preprocessors of nbgrader_config.py "
               "(add load_subconfig(<repo>/nbgrader_config.py) before its own settings)")


def params(students: tuple[str, ...] = (), config_dependent: bool = False):
    out = []
    for a in ASSIGNMENTS:
        marks = [needs_config(a)] if config_dependent else []
        for s in students or (None,):
            out.append(pytest.param(a.name, s, marks=marks, id=f"{a.name}-{s}" if s else a.name))
    return out


def score(results: Results, assignment: str, student: str, hardened: bool = False) -> tuple[float, float]:
    record = results.student(assignment, student, hardened)
    return record["score"], record["max_score"]


def why(results: Results, assignment: str, student: str, hardened: bool = False) -> str:
    record = results.student(assignment, student, hardened)
    log = results.get(assignment, hardened)["log"].get(student, "")
    return f"{student}: {record}\n--- autograde log (end) ---\n{log[-3000:]}"


def errors(cell: NotebookNode) -> list[str]:
    return [o.get("ename", "") for o in cell.get("outputs", []) if o.output_type == "error"]


def total(assignment: str) -> float:
    return sum(points(BY_NAME[assignment].source()).values())


# --- Tests -----------------------------------------------------------------------------------------------------------

def test_every_lab_and_the_quiz_are_covered():
    assert len(LABS) >= 4 and all(lab in BY_NAME for lab in LABS)
    assert (QUIZ_DIR / "source").is_dir() == bool(QUIZZES) and all(quiz in BY_NAME for quiz in QUIZZES)


def test_repo_config_installs_the_grader_defences():
    config = PyFileConfigLoader(REPO_CONFIG.name, path=str(ROOT)).load_config()
    assert config.Execute.timeout == 30 and config.Execute.interrupt_on_timeout
    assert config.GuardedExecute.notebook_timeout > config.Execute.timeout
    assert 0 < config.GuardedExecute.max_output_chars <= 1_000_000
    assert config_is_hardened(Assignment("lab", LABS_SOURCE, REPO_CONFIG))


def test_whole_file_is_bounded(results: Results):
    # generation and 14 autogrades per assignment, in parallel: the budget that keeps `make test` reasonable
    assert results.seconds < 300, results.seconds


@pytest.mark.parametrize("assignment,student", params())
def test_pipeline_ran_for_everyone(results: Results, assignment: str, student: None):
    out = results.get(assignment)
    assert set(out["students"]) == set(STUDENTS)
    with open(Path(out["root"]) / "grades.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["assignment"] == assignment]
    assert {r["student_id"] for r in rows} == set(STUDENTS)


@pytest.mark.parametrize("assignment,student", params(("solution",)))
def test_solution_scores_full_marks(results: Results, assignment: str, student: str):
    got, max_score = score(results, assignment, student)
    assert max_score == total(assignment) > 0
    assert got == max_score, why(results, assignment, student)
    graded = results.autograded(assignment, student)
    assert not [meta(c).get("grade_id") for c in graded.cells if is_test(c) and errors(c)]


@pytest.mark.parametrize("assignment,student", params(("release",)))
def test_release_scores_zero_in_bounded_time(results: Results, assignment: str, student: str):
    assert score(results, assignment, student) == (0, total(assignment)), why(results, assignment, student)
    assert results.student(assignment, student)["seconds"] < RELEASE_BUDGET_S


@pytest.mark.parametrize("assignment,student", params(("partial",)))
def test_partial_scores_its_task(results: Results, assignment: str, student: str):
    source = BY_NAME[assignment].source()
    task = first_group(source)
    expected = sum(p for gid, p in points(source).items() if group(gid) == task)
    assert 0 < expected < total(assignment)
    assert score(results, assignment, student)[0] == expected, why(results, assignment, student)


@pytest.mark.parametrize("assignment,student", params(("hang",)))
def test_endless_loop_times_out_and_later_cells_are_graded(results: Results, assignment: str, student: str):
    record = results.student(assignment, student)
    assert record["success"], why(results, assignment, student)
    assert score(results, assignment, student) == (total(assignment), total(assignment)), why(
        results, assignment, student)
    graded = results.autograded(assignment, student)
    assert "CellTimeoutError" in errors(first_answer(graded))
    assert record["seconds"] < HANG_TIMEOUT_S + 60


@pytest.mark.parametrize("assignment,student", params(("hang_sigint",), config_dependent=True))
def test_loop_that_ignores_the_interrupt_is_killed_in_bounded_time(results: Results, assignment: str, student: str):
    record = results.student(assignment, student)
    assert record["success"], why(results, assignment, student)
    assert score(results, assignment, student)[0] == 0
    graded = results.autograded(assignment, student)
    hung = first_answer(graded)
    assert "CellTimeoutError" in errors(hung), hung.outputs
    later = graded.cells[graded.cells.index(hung) + 1:]
    assert all("NotRun" in errors(c) for c in later if is_test(c))
    assert record["seconds"] < HANG_TIMEOUT_S + IOPUB_TIMEOUT_S + HANG_GRACE_S + 60


@pytest.mark.parametrize("assignment,student", params(("os_exit", "kill"), config_dependent=True))
def test_dead_kernel_gains_nothing_and_is_graded(results: Results, assignment: str, student: str):
    record = results.student(assignment, student)
    assert record["success"], why(results, assignment, student)
    graded = results.autograded(assignment, student)
    dead = last_answer(graded) if student == "os_exit" else first_answer(graded)
    assert "DeadKernelError" in errors(dead), dead.outputs
    # the tests before the death keep their points, every later one failed without running
    assert score(results, assignment, student)[0] == points_before(graded, dead), why(results, assignment, student)
    later = graded.cells[graded.cells.index(dead) + 1:]
    assert [c for c in later if is_test(c)] and all("NotRun" in errors(c) for c in later if is_test(c))
    root = Path(results.get(assignment)["root"])
    assert (root / "feedback" / student / assignment / f"{assignment}.html").is_file()


@pytest.mark.parametrize("assignment,student", params(("sys_exit", "showtraceback")))
def test_exits_and_silenced_tracebacks_gain_nothing(results: Results, assignment: str, student: str):
    assert results.student(assignment, student)["success"], why(results, assignment, student)
    assert score(results, assignment, student) == (0, total(assignment)), why(results, assignment, student)


@pytest.mark.parametrize("assignment,student", params(("displayhook",), config_dependent=True))
def test_displayed_partial_credit_before_an_error_gains_nothing(results: Results, assignment: str, student: str):
    assert score(results, assignment, student) == (0, total(assignment)), why(results, assignment, student)


@pytest.mark.parametrize("assignment,student", params(("flood",), config_dependent=True))
def test_megabytes_of_output_are_capped_and_graded_normally(results: Results, assignment: str, student: str):
    assert score(results, assignment, student) == (total(assignment), total(assignment)), why(
        results, assignment, student)
    graded = results.autograded(assignment, student)
    text = "".join(o.get("text", "") for o in first_answer(graded).outputs if o.output_type == "stream")
    assert "output truncated by the grader" in text
    assert len(text) < 200_000, len(text)  # the config keeps 100 000 characters per cell
    root = Path(results.get(assignment)["root"])
    path = root / "autograded" / student / assignment / f"{assignment}.ipynb"
    assert path.stat().st_size < 1_000_000, path.stat().st_size


@pytest.mark.parametrize("assignment,student", params(("tamper",), config_dependent=True))
def test_tampered_tests_are_restored_and_gain_nothing(results: Results, assignment: str, student: str):
    record = results.student(assignment, student)
    assert record["success"], why(results, assignment, student)
    assert score(results, assignment, student) == (0, total(assignment)), why(results, assignment, student)
    assert set(record["cells"]) == set(points(BY_NAME[assignment].source())), record["cells"]
    graded = results.autograded(assignment, student)
    source = {meta(c)["grade_id"]: c for c in BY_NAME[assignment].source().cells if is_test(c)}
    for grade_id, original in source.items():
        copies = [c for c in graded.cells if meta(c).get("grade_id") == grade_id]
        assert len(copies) == 1, (grade_id, len(copies))
        restored = copies[0]
        assert restored.cell_type == "code" and restored.source.endswith(original.source), grade_id
        assert errors(restored), f"{grade_id} was not run"  # the release cannot pass a test
    # restored in the instructor's order, each in its place
    assert [meta(c)["grade_id"] for c in graded.cells if meta(c).get("grade_id") in source] == list(source)


@pytest.mark.parametrize("assignment,student", params(("rebind",)))
def test_rebinding_locked_names_gains_nothing(request, results: Results, assignment: str, student: str):
    a = BY_NAME[assignment]
    open_names = exposed(a.source(), a.student_names)
    if open_names:
        # not strict: on some labs every test cell's visible asserts call the student's own (unsolved) code first,
        # so this generic cheat scores nothing there although the hidden tests are exposed
        request.applymarker(pytest.mark.xfail(strict=False, reason=(
            f"{a.notebook.relative_to(ROOT)}: hidden tests look up names a student cell can rebind: {open_names}; "
            f"apply `python tests/test_nbgrader_hostile.py harden {a.notebook.relative_to(ROOT)}`")))
    assert score(results, assignment, student)[0] == 0, why(results, assignment, student)


def test_rebinding_exploit_is_real(results: Results):
    """The cheat must score somewhere it can, or its zero on the hardened copies would prove nothing."""
    open_labs = [a.name for a in ASSIGNMENTS if exposed(a.source(), a.student_names)]
    if not open_labs:
        pytest.skip("every assignment's hidden tests are hardened")
    scored = {name: score(results, name, "rebind")[0] for name in open_labs}
    assert any(v > 0 for v in scored.values()), scored


@pytest.mark.parametrize("assignment", [a.name for a in ASSIGNMENTS if a.hardenable])
def test_hardened_hidden_tests_defeat_rebinding(results: Results, assignment: str):
    a = BY_NAME[assignment]
    if not exposed(a.source(), a.student_names):
        pytest.skip("the committed source is hardened already: test_rebinding_locked_names_gains_nothing covers it")
    hardened = harden(a.source(), a.student_names)
    assert not exposed(hardened, a.student_names)
    assert harden(hardened, a.student_names).cells == hardened.cells  # a second pass changes nothing
    assert score(results, assignment, "solution", hardened=True) == (total(assignment), total(assignment)), why(
        results, assignment, "solution", hardened=True)
    assert score(results, assignment, "rebind", hardened=True)[0] == 0, why(results, assignment, "rebind", True)
    # the copies live in hidden blocks: the students' release holds none of them
    release = Path(results.get(assignment, hardened=True)["root"]) / "release" / assignment / f"{assignment}.ipynb"
    assert HIDDEN_PREFIX not in release.read_text()


@pytest.mark.parametrize("assignment,student", params(REVIEWED, config_dependent=True))
def test_code_that_reaches_into_the_kernel_is_flagged_for_review(results: Results, assignment: str, student: str):
    assert results.student(assignment, student)["needs_review"], why(results, assignment, student)
    assert results.autograded(assignment, student).metadata.get("grader_review")


@pytest.mark.parametrize("assignment,student", params(NOT_REVIEWED))
def test_ordinary_submissions_are_not_flagged(results: Results, assignment: str, student: str):
    assert not results.student(assignment, student)["needs_review"], why(results, assignment, student)


@pytest.mark.parametrize("assignment,student", params(tuple(STUDENTS), config_dependent=True))
def test_every_submission_gets_feedback(results: Results, assignment: str, student: str):
    assert results.student(assignment, student)["success"], why(results, assignment, student)
    root = Path(results.get(assignment)["root"])
    assert (root / "feedback" / student / assignment / f"{assignment}.html").is_file()


# --- Applying the hardening to source notebooks ---------------------------------------------------------------------

def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "harden":
        print("usage: python tests/test_nbgrader_hostile.py harden NOTEBOOK.ipynb...", file=sys.stderr)
        return 2
    for path in map(Path, argv[1:]):
        nb = nbformat.read(path, as_version=4)
        before = exposed(nb)
        hardened = harden(nb)
        nbformat.validate(hardened)
        nbformat.write(hardened, path)
        print(f"{path}: hidden tests no longer look up {json.dumps(before)}" if before else f"{path}: unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
