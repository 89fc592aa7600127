"""A synthetic class for the parallel grader's test and bench: one small assignment, many kinds of submission.

The assignment (`bigclass`, 3 points) asks for three functions, each with a test cell of one point that holds a
hidden test. A class is a mix of submission kinds: right, partly right, wrong, the release untouched, and hostile
ones that mirror tests/test_nbgrader_hostile.py's students (its s_os_exit, s_kill, s_sys_exit, s_showtraceback,
s_flood, s_tamper, s_skip_tags, s_hang) on this assignment. Each kind's score is known (`EXPECTED`), so a bench or
a test can tell a wrong grade from a slow one; two kinds exist for the parallel grader alone: `stall` (cells that
each stay under the cell timeout, for minutes in all: only a batch's per-student deadline stops it) and `slow`
(the solution after a cell that waits 20 s: time for a test to kill its worker while it runs).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NAME = "bigclass"
TASKS = {  # answer cell id -> (solution body, wrong body, visible test, hidden test)
    "double": ("return 2 * x", "return x + 2", "assert double(2) == 4", "assert double(5) == 10"),
    "square": ("return x * x", "return 2 * x", "assert square(3) == 9", "assert square(-4) == 16"),
    "clamp": ("return max(0, min(x, 10))", "return min(x, 10)", "assert clamp(12) == 10", "assert clamp(-3) == 0"),
}
EXPECTED = {  # kind -> score out of 3
    "right": 3.0, "partial1": 1.0, "partial2": 2.0, "wrong": 0.0, "release": 0.0, "os_exit": 2.0, "kill": 0.0,
    "sys_exit": 0.0, "showtraceback": 0.0, "flood": 3.0, "tamper": 0.0, "skip_tags": 0.0, "hang": 3.0,
    "slow": 3.0,
}
STALL_CELLS = 200  # x 2 s each: 400 s of a notebook no single cell of which reaches a cell timeout


def _cell(source: str, grade_id: str, **nbgrader: object) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": grade_id, "schema_version": 3, "locked": False, "solution": False,
                                 "grade": False, **nbgrader}
    return cell


def source_notebook() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell("Write `double`, `square` and `clamp` (to 0..10).")]
    for name, (solution, _, visible, hidden) in TASKS.items():
        nb.cells.append(_cell(f"def {name}(x):\n    ### BEGIN SOLUTION\n    {solution}\n    ### END SOLUTION",
                              name, solution=True))
        nb.cells.append(_cell(f"{visible}\n### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS", f"test_{name}",
                              grade=True, locked=True, points=1))
    return nb


def write_source(course_root: Path) -> None:
    folder = Path(course_root) / "source" / NAME
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(source_notebook(), folder / f"{NAME}.ipynb")


def _answers(nb: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def _answered(release: nbformat.NotebookNode, right: tuple[str, ...], wrong: tuple[str, ...] = ()):
    nb = copy.deepcopy(release)
    for name, cell in _answers(nb).items():
        if name in right or name in wrong:
            cell.source = f"def {name}(x):\n    {TASKS[name][0] if name in right else TASKS[name][1]}"
    return nb


def submission(kind: str, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """One student's notebook of `kind` (a key of EXPECTED, or `stall`), made from the release."""
    everything = tuple(TASKS)
    if kind in ("right", "release", "partial1", "partial2", "wrong"):
        right = {"right": everything, "partial1": everything[:1], "partial2": everything[:2]}.get(kind, ())
        return _answered(release, right, everything if kind == "wrong" else ())
    nb = _answered(release, everything)
    answers = _answers(nb)
    if kind == "os_exit":  # the kernel leaves in the last answer: the tests before keep their points
        answers["clamp"].source += "\n\nimport os\n\nos._exit(0)\n"
    elif kind == "kill":
        answers["double"].source = "import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)\n"
    elif kind == "sys_exit":
        nb = _answered(release, ())
        a = _answers(nb)
        a["double"].source, a["square"].source = "import sys\n\nsys.exit(0)\n", "quit()\n"
    elif kind == "showtraceback":  # nbgrader's own test_showtraceback_exploit, on an unanswered release
        nb = _answered(release, ())
        _answers(nb)["double"].source = (
            "from IPython.core.interactiveshell import InteractiveShell\n\n\ndef _quiet(*args, **kwargs):\n"
            "    pass\n\n\nInteractiveShell.showtraceback = _quiet\nget_ipython().showtraceback = _quiet\n")
    elif kind == "flood":
        answers["double"].source += "\n\nprint('x' * 2_000_000)\nfor _ in range(5_000):\n    print('y' * 100)\n"
    elif kind == "tamper":  # unanswered, every test cell rewritten to pass and a bonus cell: restored, 0
        nb = _answered(release, ())
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                cell.source = "pass"
                cell.metadata["nbgrader"]["points"] = 100
        nb.cells.append(_cell("pass", "bonus", grade=True, locked=True, points=50))
    elif kind == "skip_tags":
        nb = _answered(release, ())
        for cell in nb.cells:
            cell.metadata["tags"] = ["skip-execution", "raises-exception"]
    elif kind == "hang":  # the first answer loops after its def: that cell times out, every test still passes
        answers["double"].source += "\n\nwhile True:  # never returns\n    pass\n"
    elif kind == "slow":
        nb.cells.insert(1, new_code_cell("import time\n\ntime.sleep(20)\n"))
    elif kind == "stall":
        nb.cells[1:1] = [new_code_cell("import time\n\ntime.sleep(2)\n") for _ in range(STALL_CELLS)]
    else:
        raise ValueError(f"no submission kind {kind!r}: one of {', '.join([*EXPECTED, 'stall'])}")
    return nb


def write_class(course_root: Path, kinds: dict[str, str]) -> None:
    """submitted/<student>/bigclass/bigclass.ipynb (and a timestamp) for each student -> kind; the release must
    exist (generate_assignment)."""
    root = Path(course_root)
    release = nbformat.read(root / "release" / NAME / f"{NAME}.ipynb", as_version=4)
    for student, kind in kinds.items():
        folder = root / "submitted" / student / NAME
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(submission(kind, release), folder / f"{NAME}.ipynb")
        (folder / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")


def class_of(size: int, hostile: bool = True) -> dict[str, str]:
    """`size` students, ids s000.., of kinds cycled so that every kind appears once `size` reaches their number."""
    kinds = [k for k in EXPECTED if k != "slow" and (hostile or k in ("right", "partial1", "partial2", "wrong",
                                                                        "release"))]
    return {f"s{i:03d}": kinds[i % len(kinds)] for i in range(size)}


def venv_path() -> str:
    """PATH with this interpreter's folder first: nbgrader runs `alembic` by name when it makes a gradebook."""
    import sys

    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
