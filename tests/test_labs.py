"""The labs through nbgrader's real pipeline: generate_assignment, autograde and the gradebook.

For every lab in labs/source, in a temporary course directory configured by the repository's own
nbgrader_config.py (its root moved to the temporary directory):
- the release holds no solution code and no hidden test;
- the solution notebook, submitted as is, scores full marks;
- the release, submitted as is, scores 0 and is graded in bounded time;
- the release with task 1 solved scores exactly task 1's points, strictly between 0 and full marks;
- plausible wrong answers (off by one at a boundary, an object equal to everything, a class that delegates to
  minialloc's own implementation, a patch of minialloc that makes the reference agree) each lose exactly the
  points of the task they got wrong, and keep the rest;
- labs/student/ holds exactly what generate_assignment makes of labs/source (tools/make_student_labs.py);
and for the first lab, a submission that loops forever is interrupted by the per-cell timeout and scores 0.
Generation and grading run once for the module (about 90 s on two cores); the tests read the results.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "labs" / "source"
LABS = sorted(p.name for p in SOURCE.iterdir() if (p / f"{p.name}.ipynb").is_file())
STUDENTS = ("solution", "release", "partial")
STUDENT_VERSIONS = ROOT / "labs" / "student"  # the releases, committed for self-learners
HANG_TIMEOUT_S = 5  # Execute.timeout for the submission that loops forever (the repo's config says 30)
BLOCK = re.compile(r"^[ \t]*### BEGIN (SOLUTION|HIDDEN TESTS)[ \t]*\n(.*?)^[ \t]*### END \1[ \t]*$", re.S | re.M)
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
# nbgrader's own gradebook code trips SQLAlchemy's session warnings; they say nothing about the labs
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")


def nbgrader_meta(cell: nbformat.NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


def graded_cells(nb: nbformat.NotebookNode) -> dict[str, float]:
    return {m["grade_id"]: float(m["points"]) for m in map(nbgrader_meta, nb.cells) if m.get("grade")}


def task1_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """Task 1's answer cells. Grade ids read task<N>_..., so a task's answers and tests share a prefix."""
    return [c for c in nb.cells if nbgrader_meta(c).get("solution") and is_task1(nbgrader_meta(c)["grade_id"])]


def is_task1(grade_id: str) -> bool:
    return grade_id.startswith("task1_")


@dataclass
class Course:
    root: Path
    db_url: str
    generated: dict[str, dict] = field(default_factory=dict)
    autograded: dict[tuple[str, str], dict] = field(default_factory=dict)
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    scores: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    cell_scores: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)

    def release(self, lab: str) -> nbformat.NotebookNode:
        return nbformat.read(self.root / "release" / lab / f"{lab}.ipynb", as_version=4)

    def submit(self, lab: str, student: str, nb: nbformat.NotebookNode) -> None:
        folder = self.root / "submitted" / student / lab
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / f"{lab}.ipynb")


def partial_submission(source: nbformat.NotebookNode, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The release with task 1's answer cells filled in from the source (markers dropped, as a student writes it)."""
    answers = {nbgrader_meta(c)["grade_id"]: c.source for c in task1_cells(source)}
    assert answers, "every lab has task1_* answer cells"
    for cell in task1_cells(release):
        cell.source = "\n".join(line for line in answers[nbgrader_meta(cell)["grade_id"]].splitlines()
                                if not any(m in line for m in MARKERS))
    return release


# --- Plausible wrong answers: each must lose exactly the points of the task it gets wrong -------------------------

LAB1_DELEGATE = '''\
@dataclass(eq=False)
class Block:
    ptr: int
    size: int
    small: bool
    allocated: bool = False
    prev: "Block | None" = None
    next: "Block | None" = None


class BestFitAllocator:
    """No policy at all: every call goes to minialloc's allocator, so every comparison with it agrees."""

    def __init__(self, device: SimulatedGPU) -> None:
        self.device = device
        self._inner = CachingAllocator(device, "")
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

LAB1_PATCHED_REFERENCE = '''\
def round_size(size: int) -> int:
    return max(K_MIN_BLOCK_SIZE, -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    return rounded <= K_SMALL_SIZE


def segment_size(rounded: int) -> int:
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    if rounded > 64 * MiB:
        return rounded  # wrong: big segments are rounded up to 2 MiB too
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


import minialloc.allocator  # noqa: E402

# the reference the old hidden tests imported now agrees (its other parameters keep their defaults)
minialloc.allocator.get_allocation_size = lambda size, *defaults: segment_size(size)
'''

LAB2_ANYTHING = '''\
class _Anything(int):
    """Equal to every number: a visible test comparing with == cannot tell it from the right answer."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = int.__hash__


def tried_to_allocate(request: int) -> int:
    return _Anything(request)
'''

LAB3_DELEGATE = '''\
class MiniExpandableSegment(ExpandableSegment):
    """No policy at all: minialloc's ExpandableSegment does the mapping."""

    def __init__(self, device: SimulatedGPU, page_size: int) -> None:
        super().__init__(device, 0, page_size)
        self.handles = [None] * self.max_pages
'''

LAB4_DELEGATE = '''\
class TinyBlockManager:
    """No policy at all: minialloc's BlockManager does the bookkeeping, read back through properties."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self._inner = BlockManager(num_blocks, block_size, False)

    @property
    def free_queue(self) -> deque:
        return deque(b.block_id for b in self._inner.free_queue)

    @property
    def ref_cnt(self) -> list[int]:
        return [b.ref_cnt for b in self._inner.blocks]

    @property
    def tables(self) -> dict[int, list[int]]:
        return {s: list(st.table) for s, st in self._inner.seqs.items()}

    @property
    def num_tokens(self) -> dict[int, int]:
        return {s: len(st.tokens) for s, st in self._inner.seqs.items()}

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        self._inner.allocate(seq_id, [0] * num_tokens)

    def append_token(self, seq_id: int) -> tuple[int, int] | None:
        return self._inner.append_token(seq_id, 0)

    def fork(self, parent_id: int, child_id: int) -> None:
        self._inner.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        self._inner.free(seq_id)
'''

GUARD_MESSAGE = "runs minialloc's own implementation"

# lab 3, task 1: a free that unmaps the pages wholly inside the freed block, as if free returned memory
LAB3_FREE_UNMAPS = ("            del live[op[1]]\n",
                    "            gone = set(pages_to_unmap(0, page_size, op[1], live.pop(op[1]))) & mapped\n"
                    "            calls, mapped = 2 * len(gone), mapped - gone\n")


@dataclass(frozen=True)
class Wrong:
    """A solution with one answer cell changed: by a replacement of text in it, or by new code for the whole cell."""

    lab: str
    student: str
    answer: str  # the grade_id of the answer cell changed
    lost: tuple[str, ...]  # grade_id prefixes of the test cells that must score 0; every other cell full marks
    old: str = ""  # replaced by `new` in the answer cell; when empty, `new` is the whole cell
    new: str = ""
    message: str = ""  # what the first lost cell's error must say (which test caught it)
    drop: tuple[str, ...] = ()  # grade ids of cells the submission lacks (it was made from an older release)

    def submission(self, source: nbformat.NotebookNode) -> nbformat.NotebookNode:
        nb = copy.deepcopy(source)
        nb.cells = [c for c in nb.cells if nbgrader_meta(c).get("grade_id") not in self.drop]
        if self.drop:
            return nb
        (cell,) = [c for c in nb.cells if nbgrader_meta(c).get("grade_id") == self.answer]
        if self.old:
            assert cell.source.count(self.old) == 1, f"{self.student}: {self.old!r} not in {self.answer}"
            cell.source = cell.source.replace(self.old, self.new)
        else:
            cell.source = self.new
        return nb


WRONG = (
    # issue 23: lab 3's task 1 counts what a trace costs; a free that gives pages back (only a release does), and
    # one cuMemSetAccess per alloc when its new pages are two runs (a free mapped page between two unmapped ones)
    Wrong("lab3_page_mapping", "free_unmaps", "task1_costs", ("task1_",), *LAB3_FREE_UNMAPS,
          "step 2, ('free', 0): page_costs returned (2, 2), the device counted (3, 0)"),
    Wrong("lab3_page_mapping", "one_set_access", "task1_costs", ("task1_",),
          "            runs = sum(1 for i in new if i - 1 not in new)\n", "            runs = 1 if new else 0\n",
          "step 8, ('alloc', 0, 209715200): page_costs returned (11, 19), the device counted (11, 20)"),
    # issue 14: the hidden boundary sizes were 4 MiB away from the boundaries
    Wrong("lab2_fragmentation_oom", "tried_le10", "task2_numbers", ("task2_tried",),
          "    if rounded < 10 * MiB:\n", "    if rounded <= 10 * MiB:\n", "tried_to_allocate(10485"),
    Wrong("lab2_fragmentation_oom", "tried_lt1", "task2_numbers", ("task2_tried",),
          "    if rounded <= 1 * MiB:\n", "    if rounded < 1 * MiB:\n", "tried_to_allocate(104"),
    Wrong("lab2_fragmentation_oom", "anything", "task2_numbers", ("task2_tried",),
          "def tried_to_allocate(request: int) -> int:\n", LAB2_ANYTHING + "\n\ndef _unused(request: int) -> int:\n",
          "AssertionError"),
    # issue 23: the request unrounded (10 MiB - 1 byte is a 10 MiB segment), a copy on write with no free block
    Wrong("lab2_fragmentation_oom", "tried_unrounded", "task2_numbers", ("task2_tried",),
          "    rounded = max(512, -(-request // 512) * 512)\n", "    rounded = request\n",
          "tried_to_allocate(10485759) returned 20971520, expected 10485760"),
    Wrong("lab4_block_table_cow", "cow_unchecked", "task2_manager", ("task2_fork_cow", "task2_random"),
          "        if (full or shared) and not self.free_queue:\n", "        if full and not self.free_queue:\n",
          "step 3 ('append', 2): returned raised IndexError, BlockManager raised OutOfBlocksError"),
    # issue 12: a class that calls the reference instead of implementing the policy scores 0 on that task
    Wrong("lab1_best_fit", "delegate", "task3_allocator", ("task3_", "task4_"), new=LAB1_DELEGATE,
          message=GUARD_MESSAGE),
    Wrong("lab3_page_mapping", "delegate", "task3_segment", ("task3_",), new=LAB3_DELEGATE, message=GUARD_MESSAGE),
    Wrong("lab4_block_table_cow", "delegate", "task2_manager", ("task2_",), new=LAB4_DELEGATE, message=GUARD_MESSAGE),
    # issue 12: hidden tests compare with a fresh copy of minialloc, not the one the student's cells can patch
    # (the wrong rule shows in task 1 and in the big sizes of task 3's traces, where the patched reference agreed)
    Wrong("lab1_best_fit", "patched_reference", "task1_sizes", ("task1_", "task3_trace"), new=LAB1_PATCHED_REFERENCE,
          message="segment_size(21474"),
    # partial work, partial points: tasks 1 to 3 done, the release-and-retry task left as released
    Wrong("lab1_best_fit", "no_retry", "task4_retry", ("task4_",),
          "        try:\n", "        raise NotImplementedError()\n        try:\n",
          "NotImplementedError"),
    # a first test cell whose visible asserts fail must not take the grader's helpers with it: task 2 keeps its
    # points
    Wrong("lab2_fragmentation_oom", "no_fragmentation", "task1_trace", ("task1_",),
          "    trace: list[Event] = []\n",
          "    return [alloc(\"grad\", 2 * GiB)]  # nothing fails\n    trace: list[Event] = []\n",
          "the last one must fail"),
    # a submission made before task 4 existed (no task 4 cells at all) still grades: tasks 1 to 3 in full
    Wrong("lab1_best_fit", "before_task4", "task4_retry", ("task4_",), message="RetryingAllocator",
          drop=("task4_retry", "retry_helpers", "task4_retry_tests")),
    # issue 34: lab 5's decisions, wrong but plausible: sizes read in powers of 1000, a reader of one-line messages
    # only, a container's own process taken for another, the CUDA context counted as a holder, and the message's
    # own suggestion (expandable segments) for every failure
    Wrong("lab5_oom_decisions", "decimal_units", "task1_read", ("task1_",),
          '"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3', '"KiB": 1000, "MiB": 1000 ** 2, "GiB": 1000 ** 3',
          "read_oom's tried is"),
    Wrong("lab5_oom_decisions", "one_line_only", "task1_read", ("task1_wrapped",),
          '    words = " ".join(message.split())\n', "    words = message\n", "read_oom's"),
    Wrong("lab5_oom_decisions", "container_as_other", "task2_decide", ("task2_container",),
          "    if own is None and len(others) == 1 and others[0] >= reserved:\n", "    if False:\n",
          "the holder is 'live tensors'"),
    Wrong("lab5_oom_decisions", "context_counted", "task2_decide", ("task2_",),
          "max(0, own - reserved - CONTEXT_ALLOWANCE)", "max(0, own - reserved)", "decide returned"),
    Wrong("lab5_oom_decisions", "message_hint", "task2_decide", ("task2_",),
          '    reserved = fields["allocated"] + fields["unallocated"]\n',
          '    return "cached blocks", FIXES["cached blocks"]  # what the message suggests\n', "decide returned"),
)


def with_venv_path(env: dict[str, str]) -> dict[str, str]:
    """nbgrader runs the `alembic` script by name: put this interpreter's scripts first on PATH (venv not activated)."""
    return {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])}


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Course]:
    saved_path = os.environ.get("PATH", "")
    os.environ["PATH"] = with_venv_path(dict(os.environ))["PATH"]
    try:
        yield grade_everything(tmp_path_factory.mktemp("course"))
    finally:
        os.environ["PATH"] = saved_path


def grade_everything(root: Path) -> Course:
    shutil.copytree(SOURCE, root / "source")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    result = Course(root, config.CourseDirectory.db_url)
    api = NbGraderAPI(config=config)
    for lab in LABS:
        result.generated[lab] = api.generate_assignment(lab)
        assert result.generated[lab]["success"], result.generated[lab].get("log")
        source = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
        result.submit(lab, "solution", source)
        result.submit(lab, "release", result.release(lab))
        result.submit(lab, "partial", partial_submission(source, result.release(lab)))
    for wrong in WRONG:
        source = nbformat.read(SOURCE / wrong.lab / f"{wrong.lab}.ipynb", as_version=4)
        result.submit(wrong.lab, wrong.student, wrong.submission(source))
    todo = [(lab, student) for lab in LABS for student in STUDENTS]
    todo += [(wrong.lab, wrong.student) for wrong in WRONG if wrong.lab in LABS]
    for lab, student in todo:
        start = time.monotonic()
        result.autograded[lab, student] = api.autograde(lab, student)
        result.seconds[lab, student] = time.monotonic() - start
    # a submission that never returns: the cell is interrupted after Execute.timeout and the rest still runs
    hang = copy.deepcopy(config)
    hang.Execute.timeout = HANG_TIMEOUT_S
    release = result.release(LABS[0])
    task1_cells(release)[0].source = "while True:\n    pass"
    result.submit(LABS[0], "hang", release)
    start = time.monotonic()
    result.autograded[LABS[0], "hang"] = NbGraderAPI(config=hang).autograde(LABS[0], "hang")
    result.seconds[LABS[0], "hang"] = time.monotonic() - start
    with Gradebook(result.db_url) as gb:
        for lab, student in result.autograded:
            submission = gb.find_submission(lab, student)
            result.scores[lab, student] = (submission.score, submission.max_score)
            notebook = gb.find_submission_notebook(lab, lab, student)
            result.cell_scores[lab, student] = {g.name: g.score for g in notebook.grades}
    return result


def test_there_are_four_labs():
    assert len(LABS) >= 4, LABS


def test_repo_config_sets_course_root_and_timeouts():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert Path(config.CourseDirectory.root) == ROOT / "labs"
    assert config.CourseDirectory.source_directory == "source"
    assert config.Execute.timeout == config.ExecutePreprocessor.timeout == 30


@pytest.mark.parametrize("lab", LABS)
def test_source_metadata(lab: str):
    nb = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
    metas = [nbgrader_meta(c) for c in nb.cells if nbgrader_meta(c)]
    assert all(m["schema_version"] == 3 for m in metas)
    ids = [m["grade_id"] for m in metas]
    assert len(ids) == len(set(ids)), "duplicate grade_id"
    points = graded_cells(nb)
    assert points and all(p > 0 for p in points.values())
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade"):
            assert meta["locked"] and "### BEGIN HIDDEN TESTS" in cell.source, f"{meta['grade_id']}: no hidden tests"
        if meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source, meta["grade_id"]
    intro = nb.cells[0].source
    assert f"**{sum(points.values()):g}**" in intro, "the intro states the total points"


@pytest.mark.parametrize("lab", LABS)
def test_release_holds_no_solution_and_no_hidden_test(course: Course, lab: str):
    source = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
    release = course.release(lab)
    source_text = "\n".join(c.source for c in source.cells)
    release_text = "\n".join(c.source for c in release.cells)
    for marker in MARKERS:
        assert marker not in release_text, marker
    blocks = BLOCK.findall(source_text)
    outside = BLOCK.sub("", source_text)
    assert any(kind == "SOLUTION" for kind, _ in blocks) and any(kind == "HIDDEN TESTS" for kind, _ in blocks)
    for kind, body in blocks:
        # sentinels: the block's lines that appear nowhere else in the source notebook
        sentinels = [line.strip() for line in body.splitlines() if len(line.strip()) >= 16]
        sentinels = [s for s in sentinels if s not in outside]
        assert sentinels, f"a {kind} block of {lab} has no line of its own to look for:\n{body}"
        leaked = [s for s in sentinels if s in release_text]
        assert not leaked, f"{kind} leaked into the release of {lab}: {leaked}"
    stubs = sum(c.source.count("raise NotImplementedError()") for c in release.cells if c.cell_type == "code")
    assert stubs == sum(kind == "SOLUTION" for kind, _ in blocks)
    assert all(not c.get("outputs") for c in release.cells if c.cell_type == "code")
    assert graded_cells(release) == graded_cells(source)


@pytest.mark.parametrize("lab", LABS)
def test_solution_scores_full_marks(course: Course, lab: str):
    assert course.autograded[lab, "solution"]["success"], course.autograded[lab, "solution"].get("log")
    score, max_score = course.scores[lab, "solution"]
    source = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
    assert max_score == sum(graded_cells(source).values())
    assert score == max_score, course.cell_scores[lab, "solution"]
    graded = nbformat.read(course.root / "autograded" / "solution" / lab / f"{lab}.ipynb", as_version=4)
    errors = [c.id for c in graded.cells if c.cell_type == "code" and any(o.output_type == "error" for o in c.outputs)]
    assert not errors


@pytest.mark.parametrize("lab", LABS)
def test_release_as_is_scores_zero(course: Course, lab: str):
    assert course.autograded[lab, "release"]["success"], course.autograded[lab, "release"].get("log")
    score, max_score = course.scores[lab, "release"]
    assert max_score > 0 and score == 0, course.cell_scores[lab, "release"]


@pytest.mark.parametrize("lab", LABS)
def test_partial_solution_scores_task1_points(course: Course, lab: str):
    assert course.autograded[lab, "partial"]["success"], course.autograded[lab, "partial"].get("log")
    score, max_score = course.scores[lab, "partial"]
    source = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
    task1 = sum(p for gid, p in graded_cells(source).items() if is_task1(gid))
    assert 0 < score < max_score
    assert score == task1, course.cell_scores[lab, "partial"]


@pytest.mark.parametrize("wrong", WRONG, ids=[f"{w.lab}-{w.student}" for w in WRONG])
def test_wrong_answer_loses_exactly_its_task(course: Course, wrong: Wrong):
    """A plausible wrong answer scores 0 on the tests of its task and full marks on every other test."""
    key = (wrong.lab, wrong.student)
    assert course.autograded[key]["success"], course.autograded[key].get("log")
    points = graded_cells(nbformat.read(SOURCE / wrong.lab / f"{wrong.lab}.ipynb", as_version=4))
    lost = {gid for gid in points if gid.startswith(wrong.lost)}
    assert lost, f"{wrong.student}: no test cell starts with {wrong.lost}"
    expected = {gid: 0.0 if gid in lost else p for gid, p in points.items()}
    assert course.cell_scores[key] == expected
    assert course.scores[key] == (sum(expected.values()), sum(points.values()))
    graded = nbformat.read(course.root / "autograded" / wrong.student / wrong.lab / f"{wrong.lab}.ipynb", as_version=4)
    first = next(c for c in graded.cells if nbgrader_meta(c).get("grade_id") in lost)
    errors = [f"{o.ename}: {o.evalue}" for o in first.outputs if o.output_type == "error"]
    assert errors and wrong.message in errors[0], errors


def test_student_versions_are_up_to_date(course: Course):
    """labs/student/ is what generate_assignment makes of labs/source (`make student-labs` regenerates it)."""
    from tools import make_student_labs as tool
    assert tool.labs() == LABS
    release = course.root / "release"
    assert tool.differences(release, STUDENT_VERSIONS, LABS) == [], "run `make student-labs` and commit labs/student/"
    for lab in LABS:  # the student versions hold no answer: the release's own checks hold for them too
        text = "\n".join(c.source for c in nbformat.read(STUDENT_VERSIONS / lab / f"{lab}.ipynb", as_version=4).cells)
        assert not any(marker in text for marker in MARKERS), lab
    # and the comparison can fail: an answer pasted into a student version is found
    stale = course.root / "stale-student"
    shutil.copytree(STUDENT_VERSIONS, stale)
    nb = nbformat.read(stale / LABS[0] / f"{LABS[0]}.ipynb", as_version=4)
    answer = next(c for c in nb.cells if nbgrader_meta(c).get("solution"))
    answer.source = answer.source.replace("raise NotImplementedError()", "pass")
    nbformat.write(nb, stale / LABS[0] / f"{LABS[0]}.ipynb")
    assert tool.differences(release, stale, LABS) == [f"{LABS[0]}/{LABS[0]}.ipynb"]
    assert tool.main(["--check"]) == 0  # the script's own check, which regenerates on its own, agrees


def test_endless_loop_is_cut_off_and_scores_zero(course: Course):
    lab = LABS[0]
    assert course.autograded[lab, "hang"]["success"], course.autograded[lab, "hang"].get("log")
    assert course.scores[lab, "hang"][0] == 0, course.cell_scores[lab, "hang"]
    graded = nbformat.read(course.root / "autograded" / "hang" / lab / f"{lab}.ipynb", as_version=4)
    looped = task1_cells(graded)[0]
    assert any(o.output_type == "error" and "Timeout" in o.ename for o in looped.outputs), looped.outputs


def test_cli_from_a_clone(tmp_path: Path):
    """`nbgrader generate_assignment` run in a clone's root finds nbgrader_config.py and writes labs/release."""
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    shutil.copytree(SOURCE / LABS[0], tmp_path / "labs" / "source" / LABS[0])
    env = with_venv_path({**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / ".jupyter")})  # no user config
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", LABS[0]], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "labs" / "release" / LABS[0] / f"{LABS[0]}.ipynb").is_file()
    assert (tmp_path / "labs" / "gradebook.db").is_file()


# --- Visible tests: a self-learner without the grader must still see these mistakes --------------------------------

VISIBLE_CATCHES = (
    # the request is rounded to 512 bytes before the segment rules: 10 MiB - 1 byte is a 10 MiB segment
    Wrong("lab2_fragmentation_oom", "tried_unrounded", "task2_numbers", ("task2_tried_tests",),
          "    rounded = max(512, -(-request // 512) * 512)\n", "    rounded = request\n",
          "round the request to 512 bytes first"),
    # a copy on write takes a block too: with none free, append_token must raise MemoryError and change nothing
    Wrong("lab4_block_table_cow", "cow_unchecked", "task2_manager", ("task2_fork_cow_tests",),
          "        if (full or shared) and not self.free_queue:\n", "        if full and not self.free_queue:\n",
          "pop from an empty deque"),
    # a free gives no page back (only empty_cache or the OOM retry does), and a page shared with a live neighbour
    # is mapped already: chapter 3's story in the visible tests shows both
    Wrong("lab3_page_mapping", "free_unmaps", "task1_costs", ("task1_costs_tests",), *LAB3_FREE_UNMAPS,
          "the device saw (3, 0) (free: maps and unmaps nothing"),
    Wrong("lab3_page_mapping", "shared_page_remapped", "task1_costs", ("task1_costs_tests",),
          "            new = {i for i in pages_to_map(0, page_size, offset, size) if i not in mapped}\n",
          "            new = set(pages_to_map(0, page_size, offset, size))\n",
          "step 1, ('alloc', 31457280, 15728640): page_costs says (3, 5)"),
    # the same mistake in the translated labs: the visible tests say it in the lab's language
    Wrong("lab3_page_mapping_vi", "free_unmaps", "task1_costs", ("task1_costs_tests",), *LAB3_FREE_UNMAPS,
          "thiết bị đếm được (3, 0) (free: không ánh xạ cũng không gỡ ánh xạ gì"),
    Wrong("lab3_page_mapping_de", "free_unmaps", "task1_costs", ("task1_costs_tests",), *LAB3_FREE_UNMAPS,
          "das Gerät zählte (3, 0) (free: blendet nichts ein und nichts aus"),
)


def run_visible_tests(nb: nbformat.NotebookNode, upto: str) -> None:
    """Run the notebook's code cells in one namespace, hidden tests dropped, up to and including cell `upto`.
    The lab's setup cell sets minialloc's language (minialloc.lang.set_lang): it is put back afterwards, so the
    tests that run later in this process speak as before."""
    import minialloc.lang

    namespace: dict = {"__name__": "__main__"}
    with minialloc.lang.using(minialloc.lang.get_lang()):
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            visible = BLOCK.sub(lambda m: m.group(0) if m.group(1) == "SOLUTION" else "", cell.source)
            exec(compile(visible, f"cell {nbgrader_meta(cell).get('grade_id', '')}", "exec"), namespace)
            if nbgrader_meta(cell).get("grade_id") == upto:
                return
    raise AssertionError(f"no cell {upto}")


@pytest.mark.parametrize("wrong", VISIBLE_CATCHES, ids=[f"{w.lab}-{w.student}" for w in VISIBLE_CATCHES])
def test_visible_tests_catch_the_mistake(wrong: Wrong):
    """The solution passes the visible tests of the cell; the wrong answer fails them, with the expected message."""
    source = nbformat.read(SOURCE / wrong.lab / f"{wrong.lab}.ipynb", as_version=4)
    (cell,) = wrong.lost
    run_visible_tests(source, cell)
    with pytest.raises(Exception, match=re.escape(wrong.message)):
        run_visible_tests(wrong.submission(source), cell)


# The same mistakes in the translated labs: the visible tests, byte-identical to the English ones, say so in the
# lab's language (their words come from the setup cell's MESSAGES table)
NO_FRAGMENTATION = next(w for w in WRONG if w.student == "no_fragmentation")
RETRY_NEVER_FAILS = Wrong("lab1_best_fit", "retry_never_fails", "task4_retry", ("task4_retry_tests",),
                          "            return super().malloc(size)  # a second refusal is the out-of-memory error\n",
                          "            try:\n                return super().malloc(size)\n"
                          "            except DeviceOutOfMemory:\n                return 0\n")
TRANSLATED_CATCHES = (
    (VISIBLE_CATCHES[0], "task2_tried_tests", "vi", "hãy làm tròn yêu cầu lên bội số của 512 byte trước"),
    (VISIBLE_CATCHES[0], "task2_tried_tests", "de", "runden Sie die Anforderung zuerst auf ein Vielfaches von 512"),
    (NO_FRAGMENTATION, "task1_trace_tests", "vi", "mọi sự kiện đều thành công: sự kiện cuối cùng phải thất bại"),
    (NO_FRAGMENTATION, "task1_trace_tests", "de", "alle Ereignisse sind gelungen, doch das letzte muss scheitern"),
    (RETRY_NEVER_FAILS, "task4_retry_tests", "vi", "malloc(8 MiB) lẽ ra phải báo MemoryError: chỉ còn 4 MiB"),
    (RETRY_NEVER_FAILS, "task4_retry_tests", "de", "malloc(8 MiB) hätte MemoryError auslösen müssen"),
)


@pytest.mark.parametrize("wrong, cell, lang, message", TRANSLATED_CATCHES,
                         ids=[f"{w.lab}_{lang}-{w.student}" for w, _, lang, _ in TRANSLATED_CATCHES])
def test_visible_tests_catch_the_mistake_in_the_labs_language(wrong: Wrong, cell: str, lang: str, message: str):
    from course_i18n.english_scan import english_sentences

    lab = f"{wrong.lab}_{lang}"
    source = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
    run_visible_tests(source, cell)
    with pytest.raises(AssertionError) as caught:
        run_visible_tests(wrong.submission(source), cell)
    said = str(caught.value)
    assert message in said and english_sentences(said) == [], said
