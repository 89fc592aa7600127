"""The labs through nbgrader's real pipeline: generate_assignment, autograde and the gradebook.

For every lab in labs/source, in a temporary course directory configured by the repository's own
nbgrader_config.py (its root moved to the temporary directory):
- the release holds no solution code and no hidden test;
- the solution notebook, submitted as is, scores full marks;
- the release, submitted as is, scores 0 and is graded in bounded time;
- the release with task 1 solved scores exactly task 1's points, strictly between 0 and full marks;
and for the first lab, a submission that loops forever is interrupted by the per-cell timeout and scores 0.
Generation and grading run once for the module (about 40 s on two cores); the tests read the results.
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
RELEASE_BUDGET_S = 120  # grading a release whose answers only raise NotImplementedError must not hang
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
    for lab in LABS:
        for student in STUDENTS:
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
def test_release_as_is_scores_zero_in_bounded_time(course: Course, lab: str):
    assert course.autograded[lab, "release"]["success"], course.autograded[lab, "release"].get("log")
    score, max_score = course.scores[lab, "release"]
    assert max_score > 0 and score == 0, course.cell_scores[lab, "release"]
    assert course.seconds[lab, "release"] < RELEASE_BUDGET_S


@pytest.mark.parametrize("lab", LABS)
def test_partial_solution_scores_task1_points(course: Course, lab: str):
    assert course.autograded[lab, "partial"]["success"], course.autograded[lab, "partial"].get("log")
    score, max_score = course.scores[lab, "partial"]
    source = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4)
    task1 = sum(p for gid, p in graded_cells(source).items() if is_task1(gid))
    assert 0 < score < max_score
    assert score == task1, course.cell_scores[lab, "partial"]


def test_endless_loop_is_cut_off_and_scores_zero(course: Course):
    lab = LABS[0]
    assert course.autograded[lab, "hang"]["success"], course.autograded[lab, "hang"].get("log")
    assert course.scores[lab, "hang"][0] == 0, course.cell_scores[lab, "hang"]
    assert course.seconds[lab, "hang"] < HANG_TIMEOUT_S + 60
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
