"""Certificates from nbgrader's gradebook: one per student at or above the pass mark, each student on their own.

The pass mark comes from the instructor (certify's --pass-mark, or the quiz's own), never from the gradebook:
student code runs during autograde and a gradebook is a file it might write. From the gradebook come only what
nbgrader records for each submission: the score (extra credit included), the late submission penalty, and the
assignment's maximum. The score certified is score - penalty, capped at the maximum; the rest is extra credit,
shown as such (quizzes.certs.credential.Score.from_points).

One student's problem (a name matplotlib cannot draw, a file name another id also maps to, a full disk) is an
error for that student, reported in its outcome, and the batch goes on. Before any of it, certify refuses to
sign while autograde's sandbox can read the key (quizzes.certs.keyguard).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .credential import DEFAULT_ISSUER_NAME, Score, issue_credential
from .display import shown
from .errors import CertError
from .files import write_credential_files
from .keyguard import ensure_hidden_from_sandbox
from .keys import load_private_key
from .passphrase import PassphraseSource
from .proof import RDFC_SUITE

if TYPE_CHECKING:  # nbgrader is imported only when a gradebook is opened: `verify` works without it
    from nbgrader.api import Assignment, Gradebook, Student


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


@dataclass
class Outcome:
    student: str
    status: str  # certified, below pass mark, no submission, needs manual grading, no e-mail, exists, error
    detail: str = ""
    files: list[Path] = field(default_factory=list)

    def line(self) -> str:
        """One printable line: ids and details can hold anything a gradebook field can, so they are escaped."""
        where = f" -> {shown(str(self.files[0]), 300)}" if self.files else ""
        detail = f" ({shown(self.detail, 300)})" if self.detail else ""
        return f"{shown(self.student, 100)}: {self.status}{detail}{where}"


def _safe(student_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in student_id)


def file_stems(student_ids: list[str]) -> dict[str, str | None]:
    """Each student id's file name stem, or None when it would collide with another student's.

    An id that is already a safe file name keeps it; any other is made safe and tagged with a hash of the id, so
    `a/b` and `a_b` get different files. What can still collide (two ids equal but for case, on a file system
    that ignores case, or a crafted id equal to another's tagged form) is refused for every id involved."""
    stems: dict[str, str] = {}
    for sid in student_ids:
        safe = _safe(sid)
        if safe != sid or safe.startswith(".") or not safe:
            safe = f"{safe.strip('.') or 'student'}-{hashlib.sha256(sid.encode()).hexdigest()[:10]}"
        stems[sid] = safe
    seen: dict[str, list[str]] = {}
    for sid, stem in stems.items():
        seen.setdefault(stem.casefold(), []).append(sid)
    return {sid: (stem if len(seen[stem.casefold()]) == 1 else None) for sid, stem in stems.items()}


# How each certificate language writes a person's name from nbgrader's first_name (given) and last_name (family)
# fields: Vietnamese puts the family name first ("Nguyễn Văn An"), English and German the given name.
NAME_ORDER = {"en": "given-first", "de": "given-first", "vi": "family-first"}


def full_name(given: str | None, family: str | None, order: str) -> str:
    """A name from the gradebook's two fields, in `order`; a missing field is left out."""
    parts = (given, family) if order == "given-first" else (family, given)
    return " ".join(p for p in parts if p)


def certify(db_url: str, assignment: str, key_path: Path | str, out_dir: Path | str, *, pass_mark: float,
            issuer_name: str = DEFAULT_ISSUER_NAME, lang: str = "en", now: datetime | None = None,
            passphrase: PassphraseSource | None = None, cryptosuite: str = RDFC_SUITE,
            status_list: Path | None = None, proof_array: bool = False,
            name_order: str | None = None) -> list[Outcome]:
    """One credential (with its printable certificate) per student at or above `pass_mark` (a fraction); each
    with a credentialStatus entry in `status_list` when one is given. Names are written in `name_order`
    ("given-first" or "family-first"), by default the order of the certificate's language `lang`."""
    from nbgrader.api import MissingEntry

    if not 0 < pass_mark <= 1:
        raise CertError(f"the pass mark must be a fraction in (0, 1], e.g. 0.8 for 80%, not {pass_mark}")
    order = name_order or NAME_ORDER.get(lang, "given-first")
    if order not in ("given-first", "family-first"):
        raise CertError(f"name order {order!r}: use given-first or family-first")
    ensure_hidden_from_sandbox(key_path)
    key = load_private_key(key_path, passphrase)
    out = Path(out_dir)
    outcomes: list[Outcome] = []
    with _open(db_url) as gb:
        record = _assignment(gb, assignment)
        max_score = float(record.max_score)
        if max_score <= 0:
            raise CertError(f"{assignment!r} has no points in the gradebook: was it generated with nbgrader?")
        students = sorted(gb.students, key=lambda s: s.id)
        stems = file_stems([s.id for s in students])
        for student in students:
            try:
                outcomes.append(_certify_one(gb, student, stems[student.id], assignment, max_score, pass_mark,
                                             key, out, issuer_name, lang, now, cryptosuite, MissingEntry,
                                             status_list, proof_array, order))
            except Exception as e:  # one student's failure must not cost the others theirs
                reason = str(e) if isinstance(e, CertError) else f"{type(e).__name__}: {e}"
                outcomes.append(Outcome(student.id, "error", reason))
    return outcomes


def _certify_one(gb: Gradebook, student: Student, stem: str | None, assignment: str, max_score: float,
                 pass_mark: float, key: Ed25519PrivateKey, out: Path, issuer_name: str, lang: str,
                 now: datetime | None, cryptosuite: str, missing: type[Exception],
                 status_list: Path | None = None, proof_array: bool = False,
                 name_order: str = "given-first") -> Outcome:
    try:
        submission = gb.find_submission(assignment, student.id)
    except missing:
        return Outcome(student.id, "no submission")
    if submission.needs_manual_grade:
        return Outcome(student.id, "needs manual grading", "grade it, then certify again")
    score = Score.from_points(float(submission.score), max_score, float(submission.late_submission_penalty or 0))
    if score.fraction + 1e-9 < pass_mark:
        return Outcome(student.id, "below pass mark", f"{score.describe()} < {pass_mark:.0%}")
    if not student.email:
        return Outcome(student.id, "no e-mail", "add it to the gradebook: the credential identifies the learner "
                                                "by a hash of it")
    if stem is None:
        return Outcome(student.id, "error", "its file name would collide with another student id's: rename one "
                                            "of them in the gradebook")
    name = full_name(student.first_name, student.last_name, name_order) or student.id
    path = out / f"{stem}.credential.json"
    if path.exists():
        return Outcome(student.id, "exists", "kept the credential already issued", [path])
    credential = issue_credential(key, name=name, email=student.email, score=score, pass_mark=pass_mark,
                                  issuer_name=issuer_name, assignment=assignment, valid_from=now,
                                  cryptosuite=cryptosuite, status_list=status_list,
                                  proof_array=proof_array)
    files = write_credential_files(credential, path, name=name, score_text=score.describe(lang), lang=lang)
    return Outcome(student.id, "certified", score.describe(), files)
