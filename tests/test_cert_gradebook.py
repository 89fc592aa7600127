"""`certify` on a gradebook built with nbgrader's own API: who gets a credential, and why not; one student's problem
never costs another student theirs; the pass mark is the instructor's; the key stays out of the sandbox's reach."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

import quizzes.certs.keyguard as keyguard
from quizzes.certs import CertError, identity_matches, keygen, load_credential, verify_credential
from quizzes.certs.gradebook import certify, file_stems, full_name
from quizzes.cli import main

# student -> (first name, last name, e-mail, score out of 21 or None for no submission, late penalty, extra credit)
STUDENTS = {
    "alice": ("Alice", "Martin", "alice@example.org", 21.0, 0, 0),
    "bao": ("Trần", "Bảo", "bao@example.org", 16.8, 0, 0),  # exactly 80%: passes
    "bob": ("Bob", "Weber", "bob@example.org", 16.0, 0, 0),  # 76%: does not
    "carol": ("Carol", None, None, 19.0, 0, 0),  # passed, but no e-mail to identify her by
    "dan": ("Dan", "Ng", "dan@example.org", None, 0, 0),  # never submitted
    "erin": ("Erin", "Late", "erin@example.org", 20.0, 4, 0),  # 20 - 4 late = 16: below 80%
    "finn": ("Finn", "Extra", "finn@example.org", 21.0, 0, 4),  # 25 of 21: 100% + 4 extra credit
    "a/b": ("Ann", "Slash", "ab.slash@example.org", 19.0, 0, 0),  # made safe: a_b, with a hash tag
    "a_b": ("Ann", "Underscore", "ab.under@example.org", 19.0, 0, 0),  # keeps a_b
    "tex": ("$\\bad$", "Mathtext", "tex@example.org", 19.0, 0, 0),  # broke matplotlib's mathtext in the PNG
}


# the assignment's grade cells (this file's own: certify reads only totals, whatever the quiz's questions are)
CELLS = {f"q{i:02d}_test": points for i, points in enumerate([1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3], start=1)}


def _spread(score: float) -> dict[str, float]:
    """A total score spread over the grade cells, filling them in order."""
    out, left = {}, score
    for cell, points in CELLS.items():
        out[cell] = min(points, left)
        left -= out[cell]
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
            for cell, points in CELLS.items():
                gb.add_grade_cell(cell, "quiz1", "quiz1", max_score=points, cell_type="code")
            for sid, (first, last, email, score, _, _) in STUDENTS.items():
                gb.add_student(sid, first_name=first, last_name=last, email=email)
                if score is None:
                    continue
                gb.add_submission("quiz1", sid)
                for cell, points in _spread(score).items():
                    grade = gb.find_grade(cell, "quiz1", "quiz1", sid)
                    grade.auto_score, grade.needs_manual_grade = points, False  # as autograde leaves them
                gb.db.commit()
            for sid, (_, _, _, _, late, extra) in STUDENTS.items():  # after all submissions exist
                if extra:  # as a grader gives it in formgrader
                    gb.find_grade(next(iter(CELLS)), "quiz1", "quiz1", sid).extra_credit = extra
                if late:  # as autograde records it for a late submission
                    gb.find_submission_notebook("quiz1", "quiz1", sid).late_submission_penalty = late
                gb.db.commit()
            assert gb.find_assignment("quiz1").max_score == 21
            assert gb.find_submission("quiz1", "finn").score == 25
            assert gb.find_submission("quiz1", "erin").late_submission_penalty == 4
    return path


@pytest.fixture
def gradebook(template: Path, tmp_path: Path) -> str:
    shutil.copy(template, tmp_path / "gradebook.db")
    return f"sqlite:///{tmp_path / 'gradebook.db'}"


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    private, _, _ = keygen(tmp_path_factory.mktemp("keys") / "k")
    return private


@pytest.fixture(autouse=True)
def sandbox_cannot_read(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The sandbox's answer for these tests' keys: no (test_certify_refuses_a_key_the_sandbox_can_read asks the real
    one). Records what was asked."""
    asked: list[Path] = []
    monkeypatch.setattr(keyguard, "_sandbox_can_read", lambda path: asked.append(path) or False)
    return asked


EXPECTED = {"alice": "certified", "bao": "certified", "bob": "below pass mark", "carol": "no e-mail",
            "dan": "no submission", "erin": "below pass mark", "finn": "certified", "a/b": "certified",
            "a_b": "certified", "tex": "certified"}


def test_certify_issues_exactly_to_those_who_passed(gradebook, key, tmp_path, sandbox_cannot_read):
    out = tmp_path / "out"
    outcomes = {o.student: o for o in certify(gradebook, "quiz1", key, out, pass_mark=0.8)}
    assert sandbox_cannot_read == [key.resolve()]
    assert {s: o.status for s, o in outcomes.items()} == EXPECTED
    for sid in ("alice", "bao", "finn"):
        files = outcomes[sid].files
        assert [f.name for f in files] == [f"{sid}.credential.json", f"{sid}.certificate.html",
                                           f"{sid}.certificate.png"]
        credential = load_credential(files[0])
        verified = verify_credential(credential)
        first, last, email, score, _, extra = STUDENTS[sid]
        assert identity_matches(credential, email=email, name=f"{first} {last}") == []
        assert "pass mark is 80%" in verified.narrative
        assert f"{first} {last}" in files[1].read_text(encoding="utf-8")
    assert verify_credential(load_credential(outcomes["bao"].files[0])).score == \
        "score 80% (16.8 of 21 points), pass mark 80%"
    assert verify_credential(load_credential(outcomes["finn"].files[0])).score == \
        "score 100% (21 of 21 points + 4 extra credit), pass mark 80%"
    assert outcomes["erin"].detail == "16 of 21 points (76%), after a late penalty of 4 < 80%"
    again = {o.student: o.status for o in certify(gradebook, "quiz1", key, out, pass_mark=0.8)}
    assert again["alice"] == again["bao"] == "exists"


def test_a_vietnamese_certificate_writes_the_family_name_first(gradebook, key, tmp_path):
    """nbgrader keeps a first (given) and a last (family) name; Vietnamese writes the family name first."""
    assert full_name("An", "Nguyễn Văn", "family-first") == "Nguyễn Văn An"
    assert full_name("An", "Nguyễn Văn", "given-first") == "An Nguyễn Văn"
    assert full_name("Carol", None, "family-first") == "Carol"
    # bao's gradebook fields: first (given) name Trần, last (family) name Bảo
    outcomes = {o.student: o for o in certify(gradebook, "quiz1", key, tmp_path / "vi", pass_mark=0.8, lang="vi")}
    credential = load_credential(outcomes["bao"].files[0])
    assert identity_matches(credential, email="bao@example.org", name="Bảo Trần") == []
    assert "Bảo Trần" in outcomes["bao"].files[1].read_text(encoding="utf-8")
    again = {o.student: o for o in certify(gradebook, "quiz1", key, tmp_path / "en", pass_mark=0.8, lang="vi",
                                           name_order="given-first")}
    assert identity_matches(load_credential(again["bao"].files[0]), email="bao@example.org", name="Trần Bảo") == []
    with pytest.raises(CertError, match="given-first or family-first"):
        certify(gradebook, "quiz1", key, tmp_path / "x", pass_mark=0.8, name_order="surname")


def test_file_name_collisions_are_kept_apart_or_refused(gradebook, key, tmp_path):
    stems = file_stems(["a/b", "a_b", "Alice", "alice", ".hidden", "x" * 3])
    assert stems["a_b"] == "a_b" and stems["a/b"].startswith("a_b-") and stems["a/b"] != "a_b"
    assert stems["Alice"] is None and stems["alice"] is None  # equal on a case-insensitive file system
    assert stems[".hidden"].startswith("hidden-") and stems["xxx"] == "xxx"
    outcomes = {o.student: o for o in certify(gradebook, "quiz1", key, tmp_path / "out", pass_mark=0.8)}
    slash, under = outcomes["a/b"].files[0], outcomes["a_b"].files[0]
    assert slash != under and slash.parent == under.parent == tmp_path / "out"
    assert identity_matches(load_credential(slash), email="ab.slash@example.org") == []
    assert identity_matches(load_credential(under), email="ab.under@example.org") == []


def test_a_name_with_mathtext_is_drawn_literally(gradebook, key, tmp_path):
    outcomes = {o.student: o for o in certify(gradebook, "quiz1", key, tmp_path / "out", pass_mark=0.8)}
    files = outcomes["tex"].files
    assert files[2].read_bytes().startswith(b"\x89PNG") and "$\\bad$ Mathtext" in files[1].read_text("utf-8")


def test_one_students_failure_never_aborts_the_batch(gradebook, key, tmp_path, monkeypatch, capsys):
    import quizzes.certs.files as files

    real = files.certificate_png

    def fails_for_bao(credential, name, *args, **kwargs):
        if name.startswith("Trần"):
            raise RuntimeError("the renderer broke\x1b[2J")
        return real(credential, name, *args, **kwargs)

    monkeypatch.setattr(files, "certificate_png", fails_for_bao)
    out = tmp_path / "out"
    outcomes = {o.student: o for o in certify(gradebook, "quiz1", key, out, pass_mark=0.8)}
    assert outcomes["bao"].status == "error" and "the renderer broke\x1b[2J" in outcomes["bao"].detail
    assert "the renderer broke\\x1b[2J" in outcomes["bao"].line()  # printed escaped
    assert {s: o.status for s, o in outcomes.items() if s != "bao"} == {s: v for s, v in EXPECTED.items()
                                                                        if s != "bao"}
    assert not list(out.glob("bao.*"))  # nothing half-written for her: rerun certify once fixed
    again = {o.student: o.status for o in certify(gradebook, "quiz1", key, out, pass_mark=0.8)}
    assert again["bao"] == "error" and again["alice"] == "exists"
    assert main(["certify", "--gradebook", gradebook, "--assignment", "quiz1", "--key", str(key), "--out", str(out),
                 "--pass-mark", "80%"]) == 1  # the batch ran to the end, and the exit code says one failed
    assert "bao: error" in capsys.readouterr().out


def test_the_pass_mark_is_never_read_from_the_gradebook(gradebook, key, tmp_path):
    """Student code that reaches the gradebook can write any table in it; certify reads only scores from it."""
    db = gradebook.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:  # what the old `passmark` command's table would hold, lowered by a cheat
        conn.execute("CREATE TABLE quizzes_pass_marks (assignment VARCHAR(255) PRIMARY KEY, pass_mark FLOAT)")
        conn.execute("INSERT INTO quizzes_pass_marks VALUES ('quiz1', 0.1)")
    outcomes = {o.student: o.status for o in certify(gradebook, "quiz1", key, tmp_path / "out", pass_mark=0.8)}
    assert outcomes["bob"] == "below pass mark"
    higher = [o.student for o in certify(gradebook, "quiz1", key, tmp_path / "o2", pass_mark=0.95)
              if o.status == "certified"]
    assert higher == ["alice", "finn"]
    with pytest.raises(CertError, match="fraction"):
        certify(gradebook, "quiz1", key, tmp_path / "o3", pass_mark=80)


def test_certify_refuses_a_key_the_sandbox_can_read(gradebook, tmp_path, monkeypatch):
    """Asks the grader's real sandbox policy, the key's folder bound into the sandbox as a course folder would be."""
    monkeypatch.undo()  # the real keyguard
    sandbox = pytest.importorskip("grading.sandbox")
    original = sandbox.Policy.default.__func__
    monkeypatch.setattr(sandbox.Policy, "default",
                        classmethod(lambda cls, **kw: original(cls, extra_read_only=[tmp_path / "bound"])))
    private, _, _ = keygen(tmp_path / "bound" / "keys")
    (tmp_path / "bound" / "keys").chmod(0o755)
    private.chmod(0o644)  # readable by every user: the sandbox's own user id too
    with pytest.raises(CertError, match="autograde's sandbox"):
        certify(gradebook, "quiz1", private, tmp_path / "out", pass_mark=0.8)
    assert not (tmp_path / "out").exists()
    private.chmod(0o600)
    if os.geteuid() == 0:  # the sandbox runs as a user of its own: a 0600 key of root's is out of its reach
        assert any(o.status == "certified" for o in certify(gradebook, "quiz1", private, tmp_path / "out",
                                                            pass_mark=0.8))
    else:  # the sandbox runs as the grader's own user, who can read the key
        with pytest.raises(CertError, match="autograde's sandbox"):
            certify(gradebook, "quiz1", private, tmp_path / "out", pass_mark=0.8)


def test_certify_refuses_when_the_sandbox_cannot_be_asked(gradebook, key, tmp_path, monkeypatch):
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "grading.sandbox", None)  # as if the grader package were missing
    with pytest.raises(CertError, match="cannot tell whether autograde's sandbox can read"):
        certify(gradebook, "quiz1", key, tmp_path / "out", pass_mark=0.8)


def test_cli_certify(gradebook, key, tmp_path, capsys):
    code = main(["certify", "--gradebook", gradebook, "--assignment", "quiz1", "--key", str(key),
                 "--out", str(tmp_path / "out"), "--lang", "de", "--pass-mark", "80%"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "alice: certified (21 of 21 points (100%))" in out and "bob: below pass mark" in out
    assert "finn: certified (21 of 21 points (100%) + 4 extra credit)" in out
    assert "6 credential(s) issued for quiz1 at pass mark 80%" in out and "0 error(s)" in out
    assert "Leistungszertifikat" in (tmp_path / "out" / "alice.certificate.html").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "out" / "alice.credential.json").read_text())["proof"]["cryptosuite"] == \
        "eddsa-rdfc-2022"
    with pytest.raises(SystemExit):  # the pass mark is the instructor's to give: no default from anywhere
        main(["certify", "--gradebook", gradebook, "--assignment", "quiz1", "--key", str(key), "--out", "x"])
    capsys.readouterr()


def test_cli_certify_jcs_on_request(gradebook, key, tmp_path, capsys):
    assert main(["certify", "--gradebook", gradebook, "--assignment", "quiz1", "--key", str(key),
                 "--out", str(tmp_path / "out"), "--pass-mark", "0.95", "--cryptosuite", "eddsa-jcs-2022"]) == 0
    capsys.readouterr()
    credential = load_credential(tmp_path / "out" / "alice.credential.json")
    assert credential["proof"]["cryptosuite"] == "eddsa-jcs-2022"
    assert verify_credential(credential).score.startswith("score 100% (21 of 21 points)")


def test_cli_refuses_a_missing_gradebook(key, tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert main(["certify", "--gradebook", f"sqlite:///{missing}", "--assignment", "quiz1", "--key", str(key),
                 "--out", str(tmp_path / "out"), "--pass-mark", "80%"]) == 1
    err = capsys.readouterr().err
    assert "no gradebook at" in err and "Traceback" not in err
    assert not missing.exists()  # no empty gradebook created by a typo
    assert main(["certify", "--gradebook", "gradebook.db", "--assignment", "quiz1", "--key", str(key),
                 "--out", str(tmp_path / "out"), "--pass-mark", "80%"]) == 1
    assert "not a database URL" in capsys.readouterr().err


def test_certify_gives_each_credential_its_own_status_list_index(gradebook, key, tmp_path, capsys):
    from quizzes.certs.keys import load_private_key
    from quizzes.certs.status_list import create_status_list, ledger_path, read_status_entry

    status_list = create_status_list(tmp_path / "status-list.json", load_private_key(key),
                                     "https://course.example.org/status-list.json")
    assert main(["certify", "--gradebook", gradebook, "--assignment", "quiz1", "--key", str(key), "--out",
                 str(tmp_path / "out"), "--pass-mark", "80%", "--status-list", str(status_list)]) == 0
    capsys.readouterr()
    credentials = [load_credential(p) for p in sorted((tmp_path / "out").glob("*.credential.json"))]
    indices = {read_status_entry(c).index for c in credentials}
    assert len(credentials) == 6 and len(indices) == 6
    issued = json.loads(ledger_path(status_list).read_text())["issued"]
    assert {int(i): cid for i, cid in issued.items()} == {read_status_entry(c).index: c["id"] for c in credentials}
