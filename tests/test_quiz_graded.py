"""The graded quiz with real nbgrader: the source notebook, the release (no answer, no key), autograde, feedback.

One course directory is built for the module (generate_assignment, four submissions, autograde, feedback):
about 20 s, the price of running nbgrader itself rather than trusting it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from nbgrader.nbgraderformat import MetadataValidator
from nbgrader.utils import compute_checksum
from traitlets.config.loader import PyFileConfigLoader

from quizzes import load_bank
from quizzes.certs import keygen, load_credential, verify_credential
from quizzes.certs.gradebook import certify, read_pass_mark, record_pass_mark
from quizzes.graded import GRADED_DIR, QUIZ1, expected
from quizzes.graded.build import SOLUTION_STUDENT, build_notebook, graded_key, notebook_path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = notebook_path(QUIZ1)
SOLUTION_RE = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
HIDDEN_RE = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def _env() -> dict[str, str]:
    """nbgrader in a subprocess: this repository importable, the venv's tools (alembic) on PATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    return env


def _nbgrader(course: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _sources(nb) -> str:
    return "\n".join(cell.source for cell in nb.cells)


# -- the source notebook -------------------------------------------------------------------------------------------

def test_committed_notebook_is_the_build():
    committed = nbformat.read(SOURCE, as_version=4)
    fresh = build_notebook(QUIZ1)
    assert [(c.cell_type, c.source, c.metadata) for c in committed.cells] == \
           [(c.cell_type, c.source, c.metadata) for c in fresh.cells], "run: python -m quizzes build-graded"


def test_source_metadata_is_valid_nbgrader():
    nb = nbformat.read(SOURCE, as_version=4)
    MetadataValidator().validate_nb(nb)
    metas = [c.metadata["nbgrader"] for c in nb.cells if "nbgrader" in c.metadata]
    ids = [m["grade_id"] for m in metas]
    assert len(ids) == len(set(ids))
    tests = [m for m in metas if m["grade"]]
    assert len(tests) == len(QUIZ1.questions) and sum(m["points"] for m in tests) == QUIZ1.max_score == 21
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            assert meta["locked"] and HIDDEN_RE.search(cell.source), meta["grade_id"]
        if meta.get("solution"):
            assert SOLUTION_RE.search(cell.source) and not meta["locked"], meta["grade_id"]


def test_passing_needs_the_computed_questions():
    choice = sum(gq.points for gq in QUIZ1.questions if load_bank()[gq.bank_id].kind != "computed")
    computed_points = sorted(gq.points for gq in QUIZ1.questions if load_bank()[gq.bank_id].kind == "computed")
    assert choice + sum(computed_points[:3]) < QUIZ1.pass_mark * QUIZ1.max_score  # three of five are not enough


def test_graded_letters_match_the_bank():
    bank = load_bank()
    for gq in QUIZ1.questions:
        q = bank[gq.bank_id]
        if q.kind == "single":
            from quizzes.graded.build import shuffled_options

            letter = graded_key(QUIZ1, gq)
            assert dict(shuffled_options(QUIZ1, q))[letter].id == q.answer


def test_solution_notebook_runs_and_passes_every_test(monkeypatch):
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(SOURCE, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(SOURCE.parent)}}
                   ).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert not re.search(r"Tried to allocate \d", printed)  # the scenario cells print questions, never answers


# -- nbgrader end to end -------------------------------------------------------------------------------------------

def _fill_release(release: Path, student: str, answers: dict[str, str]) -> nbformat.NotebookNode:
    """A student's submission: the release with the stub in each answer cell replaced by their code."""
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if gid == "student_id":
            cell.source = cell.source.replace("# YOUR CODE HERE\nraise NotImplementedError()",
                                              f'STUDENT_ID = "{student}"')
        elif gid.endswith("_answer"):
            key = gid.removesuffix("_answer")
            cell.source = cell.source.replace("# YOUR CODE HERE\nraise NotImplementedError()",
                                              f'answers["{key}"] = {answers[key]}')
    return nb


# What a student who reads the notebook's code might try: make every checker say yes.
CHEAT = """import quizzes.graded, quizzes.computed
Q.check_computed = quizzes.graded.check_computed = lambda *args, **kwargs: True
quizzes.graded.expected = lambda *args, **kwargs: 1.0
quizzes.computed.generate = lambda *args, **kwargs: quizzes.computed.Variant({}, 1.0)"""


def _right_answers(student: str) -> dict[str, str]:
    out = {}
    for gq in QUIZ1.questions:
        if load_bank()[gq.bank_id].kind == "computed":
            out[gq.key] = repr(expected("quiz1", gq.key, student))
        else:
            key = graded_key(QUIZ1, gq)
            out[gq.key] = repr(key) if isinstance(key, str) else repr(sorted(key)).replace("[", "{").replace("]", "}")
    return out


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(GRADED_DIR / "source", root / "source")
    # the quizzes' own nbgrader_config.py (and through it the repository's), with this folder as the course
    (root / "nbgrader_config.py").write_text(
        f"c = get_config()  # noqa: F821\nload_subconfig({str(GRADED_DIR / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(root)!r}\n", encoding="utf-8")
    _nbgrader(root, "generate_assignment", "quiz1")  # the real command, as an instructor runs it
    release = root / "release" / "quiz1" / "quiz1.ipynb"
    submissions = {
        # a student who did the work for their own id
        "nguyen": _fill_release(release, "nguyen", _right_answers("nguyen")),
        # the choice questions right, every number wrong
        "weak": _fill_release(release, "weak", {**_right_answers("weak"),
                                                **{k: "1" for k in ("q07", "q08", "q09", "q10", "q11")}}),
        # a copy of nguyen's notebook, id and all, submitted by someone else
        "copier": _fill_release(release, "nguyen", _right_answers("nguyen")),
        # wrong numbers, and code that replaces the checkers before the tests run
        "cheater": _fill_release(release, "cheater", {**_right_answers("cheater"), **{k: "1" for k in (
            "q08", "q09", "q10", "q11")}, "q07": "1\n" + CHEAT}),
    }
    for student, nb in submissions.items():
        folder = root / "submitted" / student / "quiz1"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "quiz1.ipynb")
    # autograde and feedback through nbgrader's Python API: the same converters, without paying nbgrader's
    # start-up time once per command; the kernels it starts inherit this environment
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in _env().items():
            mp.setenv(key, value)
        api = NbGraderAPI(config=config)
        for student in submissions:
            result = api.autograde("quiz1", student, force=True, create=True)
            assert result["success"], result["log"]
        result = api.generate_feedback("quiz1", "weak", force=True)
        assert result["success"], result["log"]
    return root


def test_release_has_no_answer_and_no_key(course: Path):
    release = nbformat.read(course / "release" / "quiz1" / "quiz1.ipynb", as_version=4)
    raw = (course / "release" / "quiz1" / "quiz1.ipynb").read_text(encoding="utf-8")
    text = _sources(release)
    source = nbformat.read(SOURCE, as_version=4)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "check_computed", "PRIVATE KEY"):
        assert marker not in raw, marker
    for cell in source.cells:
        for block in SOLUTION_RE.findall(cell.source) + HIDDEN_RE.findall(cell.source):
            for line in filter(None, (x.strip() for x in block.splitlines())):
                assert line not in text, f"leaked into the release: {line}"
    bank = load_bank()
    for gq in QUIZ1.questions:
        q = bank[gq.bank_id]
        for lang in ("en", "vi", "de"):
            assert q.explanation[lang] not in raw, f"{gq.key}: explanation ({lang}) in the release"
        if q.kind == "computed":
            value = expected("quiz1", gq.key, SOLUTION_STUDENT)
            assert f'answers["{gq.key}"] = {value:g}' not in text
            continue
        key = graded_key(QUIZ1, gq)
        for letter in [key] if isinstance(key, str) else sorted(key):
            for form in (f'== "{letter}"', f"== '{letter}'", f'answers["{gq.key}"] = "{letter}"'):
                assert form not in text, f"{gq.key}: {form}"
    stubs = [c for c in release.cells if c.cell_type == "code" and "raise NotImplementedError()" in c.source]
    assert len(stubs) == len(QUIZ1.questions) + 1  # every answer cell and the student id cell


def test_release_checksums_do_not_encode_the_key(course: Path):
    """nbgrader's checksums in the release are of the cleared cells: brute-forcing them finds no letter."""
    release = nbformat.read(course / "release" / "quiz1" / "quiz1.ipynb", as_version=4)
    checked = 0
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if "checksum" in meta:
            assert compute_checksum(cell) == meta["checksum"], meta["grade_id"]
            checked += 1
    assert checked >= len(QUIZ1.questions)


def test_autograde_scores(course: Path):
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission("quiz1", s).score for s in ("nguyen", "weak", "copier", "cheater")}
        assert gb.find_assignment("quiz1").max_score == 21
    assert scores["nguyen"] == 21
    assert scores["weak"] == 6  # the choice points only
    assert scores["copier"] == 6  # graded against the copier's own numbers, not nguyen's
    assert scores["cheater"] == 6  # the hidden tests reload the checkers the notebook replaced


def test_feedback_shows_no_key(course: Path):
    html = (course / "feedback" / "weak" / "quiz1" / "quiz1.html").read_text(encoding="utf-8")
    assert "check_computed" not in html and "HIDDEN TESTS" not in html
    assert "AssertionError" in html  # the failures are reported, without the line that holds the key


def test_pass_mark_in_the_gradebook_and_certify(course: Path, tmp_path: Path):
    db = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        for student in ("nguyen", "weak", "copier", "cheater"):
            gb.update_or_create_student(student, email=f"{student}@example.org", first_name=student.title())
    assert read_pass_mark(db, "quiz1") is None
    record_pass_mark(db, "quiz1", QUIZ1.pass_mark)
    assert read_pass_mark(db, "quiz1") == 0.8
    key, _, _ = keygen(tmp_path / "keys")
    outcomes = {o.student: o for o in certify(db, "quiz1", key, tmp_path / "out")}
    assert {s for s, o in outcomes.items() if o.status == "certified"} == {"nguyen"}
    assert outcomes["copier"].status == outcomes["weak"].status == outcomes["cheater"].status == "below pass mark"
    verified = verify_credential(load_credential(outcomes["nguyen"].files[0]))
    assert "21 of 21 points" in verified.narrative and "80%" in verified.narrative
    assert json.dumps(load_credential(outcomes["nguyen"].files[0])).count("nguyen@example.org") == 0
