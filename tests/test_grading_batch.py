"""One autograde batch, as `nbgrader autograde <assignment>` runs it for every student, survives any one submission.

A one-question assignment is generated with the repository's nbgrader_config.py (sandbox included) in a temporary
course; the submissions below are autograded in one run (student `*`: every folder of submitted/), in a fresh
process whose peak memory is measured, then generate_feedback runs for all.

- alice: the solution: 1/1. bob: the solution and a markdown cell with a pasted image (an attachment): 1/1.
- fanout: the solution, then 300 small displays under one display_id and 10 updates of 600 KB each: nbclient
  applies each update to every output with that id (180 MB of notebook, uncapped); 1/1 and a small notebook.
- raw_flood: the solution, then through the kernel's own session: 10 error messages of 6 MB each and 20 comm
  messages with 1 MB of widget state each: 1/1 and a small notebook.
- clear_flood: the solution, then 30 000 clear_output messages: past the message cap they are dropped; 1/1.
- huge: a notebook over Autograde.max_notebook_bytes (an 11 MB attachment): refused by name, not read.
- long_markdown: 1 200 000 characters of markdown, over Autograde.max_markdown_chars (1 000 000 in this batch, so
  that slow_markdown fits; the repository's is 200 000): refused by name.
- slow_markdown: the solution and 800 000 characters of `*a`, which nbconvert renders in about 35 s: graded 1/1;
  with GenerateFeedback.notebook_timeout at 15 s (the repository's is 120 s) its feedback fails, named in the
  log, and everyone else's is made.
- big_cell: the solution and a code cell of 1.5 MB of `x = 1` (the formgrader once took 260 s on it, and every other
  request waited): over Autograde.max_code_cell_chars, refused by a one-line message naming the cell.
- ansi_name: the solution and a file whose name holds ANSI and OSC sequences (erase the line, a forged log line, a
  window title, an OSC 52 clipboard write): 1/1, and the autograde log (nbgrader logs every file it copies)
  shows the name with its control characters as escapes, none of them raw.
- unsafe ids (folders `*`, a CSV row, a formula, markup): refused by name; no gradebook row, no autograded folder.
Every honest submission is graded and gets its feedback.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import sys
import time
from multiprocessing import get_context
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parent.parent
NAME = "lab9"
ANSI_NAME = "notes\x1b[2K\r[AutogradeApp | ERROR] forged\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07.txt"
UNSAFE = ["*", "eve,,,,35.0,0.0,35.0,35.0", "=1+2", "@SUM(A1)", "<img src=x onerror=alert(1)>"]
NOTEBOOK_CAP_BYTES = 3_000_000  # what an autograded notebook may weigh: 2 M characters of output, and the cells
# the batch process's peak: 175 MB measured here; the fan-out graded by nbclient's own handling alone peaked at 520 MB
PEAK_RSS_CAP_KB = 400_000
FEEDBACK_TIMEOUT_S = 15  # GenerateFeedback.notebook_timeout in this batch: slow_markdown's takes about 35 s
MAX_MARKDOWN_CHARS = 1_000_000  # Autograde.max_markdown_chars in this batch
# generate_feedback for the whole batch: 5 s measured here without slow_markdown, which then stops at the timeout
FEEDBACK_CAP_S = 60 + FEEDBACK_TIMEOUT_S

pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")
# a 1x1 PNG, as a pasted image is stored
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def grade_cell(source: str, grade_id: str, **nbgrader) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": grade_id, "schema_version": 3, "locked": False, "solution": False,
                                 "grade": False, **nbgrader}
    return cell


def source_notebook() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell("Write `double(x)`."),
        grade_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION", "answer",
                   solution=True),
        grade_cell("assert double(2) == 4", "test_double", grade=True, locked=True, points=1),
    ]
    return nb


def with_solution(release: nbformat.NotebookNode, *extra: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(release)
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "answer")
    answer.source = "def double(x):\n    return 2 * x"
    nb.cells.extend(extra)
    return nb


FANOUT = """\
from IPython.display import display, update_display
for i in range(300):
    display({'text/plain': str(i)}, raw=True, display_id='d')
for i in range(10):
    update_display({'text/plain': str(i) * 600_000}, raw=True, display_id='d')
"""
RAW_FLOOD = """\
k = get_ipython().kernel
parent = k.get_parent('shell')
def send(kind, content):
    k.session.send(k.iopub_socket, kind, content, parent=parent, ident=k._topic(kind))
for i in range(10):
    send('error', {'ename': 'E', 'evalue': 'v' * 1_000_000, 'traceback': ['t' * 50_000] * 100})
for i in range(20):
    send('comm_open', {'comm_id': f'c{i}', 'target_name': 'jupyter.widget',
                       'data': {'state': {'value': 'w' * 1_000_000}}})
"""
CLEAR_FLOOD = """\
from IPython.display import clear_output
for i in range(30_000):
    clear_output()
print('done')
"""


def submissions(release: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    pasted = new_markdown_cell("My sketch: ![image.png](attachment:image.png)")
    pasted.attachments = {"image.png": {"image/png": PNG}}
    huge = new_markdown_cell("![big.png](attachment:big.png)")
    huge.attachments = {"big.png": {"image/png": base64.b64encode(os.urandom(8_500_000)).decode()}}
    subs = {"alice": with_solution(release), "bob": with_solution(release, pasted),
            "fanout": with_solution(release, new_code_cell(FANOUT)),
            "raw_flood": with_solution(release, new_code_cell(RAW_FLOOD)),
            "clear_flood": with_solution(release, new_code_cell(CLEAR_FLOOD)),
            "huge": with_solution(release, huge)}
    subs["long_markdown"] = with_solution(release, new_markdown_cell("x" * 1_200_000))
    subs["slow_markdown"] = with_solution(release, new_markdown_cell("*a" * 400_000))
    big = new_code_cell("x = 1\n" * 250_000)
    big.metadata["nbgrader"] = {"grade_id": "big_one", "schema_version": 3, "locked": False, "solution": False,
                                "grade": False}
    subs["big_cell"] = with_solution(release, big)
    subs["ansi_name"] = with_solution(release)
    subs.update({bad: with_solution(release) for bad in UNSAFE})
    return subs


def run_batch(root: str) -> dict:
    """In a fresh process: generate, submit, autograde everyone in one run, generate feedback; what happened."""
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI

    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    course = Path(root)
    (course / "source" / NAME).mkdir(parents=True)
    nbformat.write(source_notebook(), course / "source" / NAME / f"{NAME}.ipynb")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    config.CourseDirectory.root = root
    config.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
    config.GenerateFeedback.notebook_timeout = FEEDBACK_TIMEOUT_S
    config.Autograde.max_markdown_chars = MAX_MARKDOWN_CHARS
    api = NbGraderAPI(config=config)
    assert api.generate_assignment(NAME)["success"]
    release = nbformat.read(course / "release" / NAME / f"{NAME}.ipynb", as_version=4)
    for student, nb in submissions(release).items():
        folder = course / "submitted" / student / NAME
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{NAME}.ipynb")
        if student == "ansi_name":
            (folder / ANSI_NAME).write_text("my notes\n")
    graded = api.autograde(NAME, "*")
    # this process's own peak (VmHWM): ru_maxrss would count the pytest process it was forked from before the exec
    rss = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    started = time.monotonic()
    feedback = api.generate_feedback(NAME)
    out = {"autograde_log": graded.get("log") or "", "feedback_success": feedback["success"],
           "feedback_log": feedback.get("log") or "", "feedback_s": time.monotonic() - started, "maxrss_kb": rss,
           "scores": {}, "students": [], "notebook_bytes": {}, "feedback_bytes": {}, "truncated": {}}
    with Gradebook(config.CourseDirectory.db_url) as gb:
        out["students"] = sorted(s.id for s in gb.students)
        for student in out["students"]:
            try:
                out["scores"][student] = gb.find_submission(NAME, student).score
            except Exception:  # no submission recorded
                continue
    for student in submissions(release):
        for kind, top in (("notebook_bytes", "autograded"), ("feedback_bytes", "feedback")):
            ext = "ipynb" if top == "autograded" else "html"
            path = course / top / student / NAME / f"{NAME}.{ext}"
            if path.exists():
                out[kind][student] = path.stat().st_size
                if top == "autograded":
                    out["truncated"][student] = "[output truncated by the grader" in path.read_text()
    return out


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    assert shutil.which("bwrap"), "bubblewrap is not installed (apt-get install bubblewrap)"
    root = tmp_path_factory.mktemp("batch")
    with get_context("spawn").Pool(1) as pool:
        return pool.apply(run_batch, (str(root),))


@pytest.mark.parametrize("student", ["alice", "bob", "fanout", "raw_flood", "clear_flood", "ansi_name"])
def test_every_honest_answer_is_graded(batch: dict, student: str):
    assert batch["scores"].get(student) == 1.0, batch["autograde_log"][-4000:]
    assert student in batch["feedback_bytes"], batch["feedback_log"][-3000:]


@pytest.mark.parametrize("student", ["fanout", "raw_flood", "bob"])
def test_no_submission_grows_its_notebook_past_the_caps(batch: dict, student: str):
    assert batch["notebook_bytes"][student] < NOTEBOOK_CAP_BYTES


@pytest.mark.parametrize("student", ["fanout", "raw_flood", "clear_flood"])
def test_the_grader_says_where_it_dropped_output(batch: dict, student: str):
    assert batch["truncated"][student]


def test_the_batch_process_memory_stays_bounded(batch: dict):
    assert batch["maxrss_kb"] < PEAK_RSS_CAP_KB


def test_feedback_for_the_batch_is_bounded_in_time_and_size(batch: dict):
    assert batch["feedback_s"] < FEEDBACK_CAP_S
    assert max(batch["feedback_bytes"].values()) < NOTEBOOK_CAP_BYTES


def test_an_oversized_notebook_is_refused_by_name(batch: dict):
    assert "huge" not in batch["scores"]
    assert "'lab9.ipynb' holds" in batch["autograde_log"] and "max_notebook_bytes" in batch["autograde_log"]


def test_a_notebook_with_too_much_markdown_is_refused_by_name(batch: dict):
    assert "long_markdown" not in batch["scores"]
    assert re.search(r"'lab9.ipynb' hold \d+ characters, more than Autograde.max_markdown_chars \(1000000\)",
                     batch["autograde_log"])


def test_feedback_past_its_time_limit_fails_for_that_student_alone(batch: dict):
    assert batch["scores"].get("slow_markdown") == 1.0
    assert "slow_markdown" not in batch["feedback_bytes"]
    assert f"took more than {FEEDBACK_TIMEOUT_S} s (GenerateFeedback.notebook_timeout)" in batch["feedback_log"]
    assert {"alice", "bob", "fanout", "raw_flood", "clear_flood"} <= set(batch["feedback_bytes"])


def test_time_limit_interrupts_the_main_thread():
    from grading.feedback import FeedbackTimeout, time_limit

    started = time.monotonic()
    with pytest.raises(FeedbackTimeout, match="the test's loop took more than 0.2 s"):
        with time_limit(0.2, "the test's loop"):
            while time.monotonic() - started < 10:
                pass
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("student", UNSAFE)
def test_unsafe_student_ids_are_refused_by_name(batch: dict, student: str):
    assert student not in batch["students"]
    assert student not in batch["notebook_bytes"]
    assert f"student id {ascii(student)} refused" in batch["autograde_log"]


def test_the_formgrader_lists_no_student_with_an_unsafe_id(tmp_path: Path):
    """The formgrader lists submitted/ folders by name; one copied in by hand with an unsafe name is not listed."""
    import nbgrader.server_extensions.formgrader.base as formgrader
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()  # installs the checks
    assert formgrader.NbGraderAPI is not NbGraderAPI and issubclass(formgrader.NbGraderAPI, NbGraderAPI)
    config.CourseDirectory.root = str(tmp_path)
    config.CourseDirectory.db_url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    for student in ["alice", *UNSAFE]:
        (tmp_path / "submitted" / student / NAME).mkdir(parents=True)
    api = formgrader.NbGraderAPI(CourseDirectory(config=config), config=config)
    assert api.get_submitted_students(NAME) == {"alice"}
    assert NbGraderAPI(CourseDirectory(config=config), config=config).get_submitted_students(NAME) == {
        "alice", *UNSAFE}  # nbgrader's own lists them all


def test_a_huge_code_cell_is_refused_naming_the_cell(batch: dict):
    assert "big_cell" not in batch["scores"]
    line = next(line for line in batch["autograde_log"].splitlines() if "max_code_cell_chars" in line)
    assert re.search(r"code cell 'big_one' \(cell \d+\) of 'lab9.ipynb' holds 1500000 characters, more than "
                     r"Autograde.max_code_cell_chars \(50000\); nothing of it was graded", line), line


def test_file_names_reach_the_log_escaped(batch: dict):
    log = batch["autograde_log"]
    assert "notes\\x1b[2K\\r[AutogradeApp | ERROR] forged\\x1b]0;pwned\\x07" in log  # shown, as escapes
    assert not [c for c in log if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0]
