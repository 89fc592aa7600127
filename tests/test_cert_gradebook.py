"""`certify` and `passmark` on a gradebook built with nbgrader's own API: who gets a credential, and why not."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from quizzes.certs import CertError, identity_matches, keygen, load_credential, verify_credential
from quizzes.certs.gradebook import certify, read_pass_mark, record_pass_mark
from quizzes.cli import main
from quizzes.graded import QUIZ1

# student -> (first name, last name, e-mail, score out of 21 or None for no submission)
STUDENTS = {
    "alice": ("Alice", "Martin", "alice@example.org", 21.0),
    "bao": ("Trần", "Bảo", "bao@example.org", 16.8),  # exactly 80%: passes
    "bob": ("Bob", "Weber", "bob@example.org", 16.0),  # 76%: does not
    "carol": ("Carol", None, None, 19.0),  # passed, but no e-mail to identify her by
    "dan": ("Dan", "Ng", "dan@example.org", None),  # never submitted
}


def _spread(score: float) -> dict[str, float]:
    """A total score spread over quiz1's grade cells, filling them in order."""
    out, left = {}, score
    for gq in QUIZ1.questions:
        out[f"{gq.key}_test"] = min(gq.points, left)
        left -= out[f"{gq.key}_test"]
    return out


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The gradebook, built once with nbgrader's API; each test gets its own copy."""
    path = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    # a new gradebook asks the `alembic` command for its schema version: it must be on PATH, as in the venv
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        with Gradebook(f"sqlite:///{path}") as gb:
            gb.add_assignment("quiz1")
            gb.add_notebook("quiz1", "quiz1")
            for gq in QUIZ1.questions:
                gb.add_grade_cell(f"{gq.key}_test", "quiz1", "quiz1", max_score=gq.points, cell_type="code")
            for sid, (first, last, email, score) in STUDENTS.items():
                gb.add_student(sid, first_name=first, last_name=last, email=email)
                if score is None:
                    continue
                gb.add_submission("quiz1", sid)
                for cell, points in _spread(score).items():
                    grade = gb.find_grade(cell, "quiz1", "quiz1", sid)
                    grade.auto_score, grade.needs_manual_grade = points, False  # as autograde leaves them
                gb.db.commit()
            assert gb.find_assignment("quiz1").max_score == 21
    return path


@pytest.fixture
def gradebook(template: Path, tmp_path: Path) -> str:
    shutil.copy(template, tmp_path / "gradebook.db")
    return f"sqlite:///{tmp_path / 'gradebook.db'}"


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    private, _, _ = keygen(tmp_path_factory.mktemp("keys") / "k")
    return private


def test_certify_needs_a_recorded_pass_mark(gradebook, key, tmp_path):
    with pytest.raises(CertError, match="no pass mark recorded.*python -m quizzes passmark"):
        certify(gradebook, "quiz1", key, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pass_mark_is_stored_in_the_gradebook(gradebook):
    assert read_pass_mark(gradebook, "quiz1") is None
    record_pass_mark(gradebook, "quiz1", 0.8)
    record_pass_mark(gradebook, "quiz1", 0.8)  # recording again replaces, not duplicates
    assert read_pass_mark(gradebook, "quiz1") == 0.8
    with Gradebook(gradebook) as gb:  # nbgrader still reads its gradebook as before
        assert gb.find_submission("quiz1", "alice").score == 21
    with pytest.raises(CertError, match="no assignment 'quiz9'"):
        record_pass_mark(gradebook, "quiz9", 0.8)
    with pytest.raises(CertError, match="fraction"):
        record_pass_mark(gradebook, "quiz1", 80)


def test_certify_issues_exactly_to_those_who_passed(gradebook, key, tmp_path):
    record_pass_mark(gradebook, "quiz1", 0.8)
    out = tmp_path / "out"
    outcomes = {o.student: o for o in certify(gradebook, "quiz1", key, out)}
    assert {s: o.status for s, o in outcomes.items()} == {
        "alice": "certified", "bao": "certified", "bob": "below pass mark", "carol": "no e-mail",
        "dan": "no submission",
    }
    for sid in ("alice", "bao"):
        files = outcomes[sid].files
        assert [f.name for f in files] == [f"{sid}.credential.json", f"{sid}.certificate.html",
                                           f"{sid}.certificate.png"]
        credential = load_credential(files[0])
        verified = verify_credential(credential)
        first, last, email, score = STUDENTS[sid]
        assert identity_matches(credential, email=email, name=f"{first} {last}") == []
        assert f"{score:g} of 21 points" in verified.narrative and "pass mark is 80%" in verified.narrative
        assert f"{first} {last}" in files[1].read_text(encoding="utf-8")
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".json") == ["alice.credential.json",
                                                                              "bao.credential.json"]
    again = {o.student: o.status for o in certify(gradebook, "quiz1", key, out)}
    assert again["alice"] == again["bao"] == "exists"


def test_a_higher_pass_mark_certifies_fewer(gradebook, key, tmp_path):
    record_pass_mark(gradebook, "quiz1", 0.9)
    certified = [o.student for o in certify(gradebook, "quiz1", key, tmp_path / "out") if o.status == "certified"]
    assert certified == ["alice"]


def test_cli_passmark_and_certify(gradebook, key, tmp_path, capsys):
    assert main(["passmark", "--gradebook", gradebook, "--assignment", "quiz1"]) == 0  # quiz1's own 80%
    assert "80%" in capsys.readouterr().out
    assert main(["certify", "--gradebook", gradebook, "--assignment", "quiz1", "--key", str(key),
                 "--out", str(tmp_path / "out"), "--lang", "de"]) == 0
    out = capsys.readouterr().out
    assert "alice: certified (21 of 21 points (100%))" in out and "bob: below pass mark" in out
    assert "2 credential(s) issued" in out
    assert "Leistungszertifikat" in (tmp_path / "out" / "alice.certificate.html").read_text(encoding="utf-8")


def test_cli_refuses_a_missing_gradebook(key, tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert main(["certify", "--gradebook", f"sqlite:///{missing}", "--assignment", "quiz1", "--key", str(key),
                 "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "no gradebook at" in err and "Traceback" not in err
    assert not missing.exists()  # no empty gradebook created by a typo
    assert main(["passmark", "--gradebook", "gradebook.db", "--assignment", "quiz1"]) == 1
    assert "not a database URL" in capsys.readouterr().err
