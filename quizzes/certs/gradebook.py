"""Certificates from nbgrader's gradebook, and the pass mark recorded in it.

nbgrader's gradebook knows each submission's score and the assignment's maximum, but has no notion of a pass
mark. `python -m quizzes passmark` records one in a small table of the same database, quizzes_pass_marks
(assignment, pass_mark); nbgrader ignores tables it does not own. certify reads the pass mark from there, so
the mark that decides is the one stored with the grades, and refuses to guess when none was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Column, Float, MetaData, String, Table, delete, insert, inspect, select

from .credential import DEFAULT_ISSUER_NAME, Score, issue_credential
from .errors import CertError
from .files import write_credential_files
from .keys import load_private_key

if TYPE_CHECKING:  # nbgrader is imported only when a gradebook is opened: `verify` works without it
    from nbgrader.api import Assignment, Gradebook

PASS_MARK_TABLE = "quizzes_pass_marks"
_METADATA = MetaData()
PASS_MARKS = Table(
    PASS_MARK_TABLE, _METADATA,
    Column("assignment", String(255), primary_key=True),
    Column("pass_mark", Float, nullable=False),  # a fraction of the assignment's max score, 0 < pass_mark <= 1
)


def _open(db_url: str) -> Gradebook:
    """nbgrader's Gradebook, refusing to create a new, empty database by a typo in a sqlite path."""
    from nbgrader.api import Gradebook

    if db_url.startswith("sqlite:///"):
        path = Path(db_url.removeprefix("sqlite:///"))
        if not path.is_file():
            raise CertError(f"no gradebook at {path} (from {db_url})")
    elif "://" not in db_url:
        raise CertError(f"{db_url!r} is not a database URL; for a file write sqlite:///path/to/gradebook.db")
    try:
        return Gradebook(db_url)
    except Exception as e:  # SQLAlchemy raises many kinds; the user needs the message, not the class
        raise CertError(f"cannot open the gradebook {db_url}: {e}") from None


def _assignment(gb: Gradebook, assignment: str) -> Assignment:
    from nbgrader.api import MissingEntry

    try:
        return gb.find_assignment(assignment)
    except MissingEntry:
        names = sorted(a.name for a in gb.assignments)
        raise CertError(f"the gradebook has no assignment {assignment!r} (it has: {', '.join(names) or 'none'})") \
            from None


def record_pass_mark(db_url: str, assignment: str, pass_mark: float) -> None:
    if not 0 < pass_mark <= 1:
        raise CertError(f"the pass mark must be a fraction in (0, 1], e.g. 0.8 for 80%, not {pass_mark}")
    with _open(db_url) as gb:
        _assignment(gb, assignment)
        gb.db.commit()  # end the read transaction before another connection writes (SQLite locks)
        _METADATA.create_all(gb.engine, tables=[PASS_MARKS])
        gb.db.execute(delete(PASS_MARKS).where(PASS_MARKS.c.assignment == assignment))
        gb.db.execute(insert(PASS_MARKS).values(assignment=assignment, pass_mark=pass_mark))
        gb.db.commit()


def _read_pass_mark(gb: Gradebook, assignment: str) -> float | None:
    if not inspect(gb.engine).has_table(PASS_MARK_TABLE):
        return None
    return gb.db.execute(select(PASS_MARKS.c.pass_mark).where(PASS_MARKS.c.assignment == assignment)).scalar()


def read_pass_mark(db_url: str, assignment: str) -> float | None:
    with _open(db_url) as gb:
        _assignment(gb, assignment)
        return _read_pass_mark(gb, assignment)


@dataclass
class Outcome:
    student: str
    status: str  # certified, below pass mark, no submission, needs manual grading, no e-mail, exists
    detail: str = ""
    files: list[Path] = field(default_factory=list)

    def line(self) -> str:
        where = f" -> {self.files[0]}" if self.files else ""
        return f"{self.student}: {self.status}{' (' + self.detail + ')' if self.detail else ''}{where}"


def _safe(student_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in student_id)


def certify(db_url: str, assignment: str, key_path: Path | str, out_dir: Path | str, *,
            issuer_name: str = DEFAULT_ISSUER_NAME, lang: str = "en", now: datetime | None = None) -> list[Outcome]:
    """One credential (with its printable certificate) per student at or above the recorded pass mark."""
    from nbgrader.api import MissingEntry

    key = load_private_key(key_path)
    out = Path(out_dir)
    outcomes: list[Outcome] = []
    with _open(db_url) as gb:
        record = _assignment(gb, assignment)
        pass_mark = _read_pass_mark(gb, assignment)
        if pass_mark is None:
            raise CertError(f"no pass mark recorded for {assignment!r} in the gradebook; record it first: "
                            f"python -m quizzes passmark --gradebook {db_url} --assignment {assignment} "
                            "--pass-mark 0.8")
        max_score = float(record.max_score)
        if max_score <= 0:
            raise CertError(f"{assignment!r} has no points in the gradebook: was it generated with nbgrader?")
        for student in sorted(gb.students, key=lambda s: s.id):
            try:
                submission = gb.find_submission(assignment, student.id)
            except MissingEntry:
                outcomes.append(Outcome(student.id, "no submission"))
                continue
            if submission.needs_manual_grade:
                outcomes.append(Outcome(student.id, "needs manual grading", "grade it, then certify again"))
                continue
            score = Score(submission.score / max_score, submission.score, max_score)
            if score.fraction + 1e-9 < pass_mark:
                outcomes.append(Outcome(student.id, "below pass mark", f"{score.describe()} < {pass_mark:.0%}"))
                continue
            if not student.email:
                outcomes.append(Outcome(student.id, "no e-mail", "add it to the gradebook: the credential "
                                                                 "identifies the learner by a hash of it"))
                continue
            name = " ".join(p for p in (student.first_name, student.last_name) if p) or student.id
            path = out / f"{_safe(student.id)}.credential.json"
            if path.exists():
                outcomes.append(Outcome(student.id, "exists", "kept the credential already issued", [path]))
                continue
            credential = issue_credential(key, name=name, email=student.email, score=score, pass_mark=pass_mark,
                                          issuer_name=issuer_name, assignment=assignment, valid_from=now)
            files = write_credential_files(credential, path, name=name, score_text=score.describe(lang), lang=lang)
            outcomes.append(Outcome(student.id, "certified", score.describe(), files))
    return outcomes
