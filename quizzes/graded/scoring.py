"""Grading a graded-quiz submission in the grader's process: the student's answers against the instructor's key.

    scores = grade_notebook(nb, student_id, bank_dir, secret)    # one QuestionScore per slot, in slot order

`nb` is the executed (or merely submitted) notebook; nothing in it is run or trusted: the answers are read from
the cells' source (quizzes.graded.answers), the questions that count are drawn again from `student_id`, which
must be nbgrader's id for the submission (never what the notebook claims), and the expected answers come from
the private bank and the course secret (quizzes.graded.pool). An answer to a question outside the student's
draw earns nothing. A malformed answer scores 0 for its question; only instructor errors raise (a missing or
changed bank, a wrong secret, no `build-graded` record), so a submission can never stop a class's grading.

Points: single and multi questions are right or wrong; a diagnosis question gives its points in equal shares to
its parts (a letter must match; a number must lie within the part's tolerance). Feedback says what was right,
never what the right answer is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .answers import AnswerError, parse_answer, read_answers
from .draw import draw
from .pool import Pool, PoolQuestion, load_pool

RECORD_DIR = ".built"  # inside the private bank folder: one record per built quiz (its fingerprint)


class GradingSetupError(RuntimeError):
    """The instructor's side is not ready (no build record, or the bank/secret/minialloc changed since)."""


@dataclass(frozen=True)
class QuestionScore:
    key: str  # the nbgrader grade cell (grade_id) the points go to: "slot01"
    points: float
    max_points: float
    feedback: str  # for the student; never the answer
    question: str = ""  # the pool question the slot held for this student: "p07"


def record_path(bank_dir: Path, quiz: str) -> Path:
    return Path(bank_dir) / RECORD_DIR / f"{quiz}.json"


def write_record(bank_dir: Path, pool: Pool) -> Path:
    """What build-graded released: the grader checks it against the pool it rebuilds."""
    path = record_path(bank_dir, pool.quiz.name)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(json.dumps({"quiz": pool.quiz.name, "fingerprint": pool.fingerprint,
                                "questions": len(pool.questions), "max_score": pool.quiz.max_score}, indent=1) + "\n",
                    encoding="utf-8")
    return path


def checked_pool(bank_dir: Path, secret: bytes, quiz: str | None = None) -> Pool:
    """The pool, after checking that it is the one build-graded released."""
    pool = load_pool(bank_dir, secret, quiz)
    path = record_path(bank_dir, pool.quiz.name)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise GradingSetupError(f"{path}: no record of a build; run `python -m quizzes build-graded` with this bank "
                                "before releasing the quiz") from None
    if record.get("fingerprint") != pool.fingerprint:
        raise GradingSetupError(f"{pool.quiz.name}: the questions the bank and the secret give now differ from the "
                                "released ones (the bank, the secret or minialloc changed since build-graded); "
                                "grade with the bank, secret and minialloc version of the release")
    return pool


def _score(question: PoolQuestion, raw: Any, slot_points: float) -> tuple[float, str]:
    try:
        given = parse_answer(raw, question.form)
    except AnswerError as e:
        return 0.0, f"{question.key}: 0 points: {e}"
    except Exception:  # noqa: BLE001 (the contract: no answer, however odd, stops a class's grading)
        return 0.0, f"{question.key}: 0 points: the answer could not be read"
    right = 0
    for got, want, tolerance in zip(given, question.expected, question.tolerances, strict=True):
        if isinstance(want, float):
            # the tolerance is the bank's; 1e-9 relative absorbs float noise in the expected value itself
            right += math.isclose(got, want, rel_tol=1e-9, abs_tol=tolerance)
        else:
            right += got == want
    parts = len(question.expected)
    points = round(slot_points * right / parts, 4)
    if right == parts:
        return points, f"{question.key}: right"
    if parts == 1:
        return points, f"{question.key}: wrong"
    return points, f"{question.key}: {right} of {parts} parts right"


def grade_notebook(nb: Any, student_id: str, bank_dir: Path, secret: bytes, *, quiz: str | None = None
                   ) -> list[QuestionScore]:
    """One score per slot of the student's draw. `quiz` defaults to the private bank's only quiz."""
    pool = checked_pool(Path(bank_dir), secret, quiz)
    answers = read_answers(nb)
    slots = draw(pool.sheet(), student_id)
    drawn = {slot.key for slot in slots}
    stray = sorted(k for k, v in answers.items() if k not in drawn and v is not None)  # None: the cell's template
    scores = []
    for slot in slots:
        points, feedback = _score(pool.question(slot.key), answers.get(slot.key), slot.points)
        scores.append(QuestionScore(slot.grade_id, points, slot.points, feedback, slot.key))
    if stray and scores:  # said once, on the first slot: answers outside the draw are not graded
        first = scores[0]
        shown = ", ".join(stray[:10]) + (", ..." if len(stray) > 10 else "")
        scores[0] = QuestionScore(first.key, first.points, first.max_points,
                                  f"{first.feedback} (not graded, not among your questions: {shown})", first.question)
    return scores


def reference_answers(bank_dir: Path, secret: bytes, student_id: str, quiz: str | None = None) -> dict[str, Any]:
    """The right answers to `student_id`'s questions, written as a student would (for tests and for checking a
    release before handing it out). Instructor-side: it needs the private bank and the secret."""
    pool = load_pool(Path(bank_dir), secret, quiz)
    out: dict[str, Any] = {}
    for slot in draw(pool.sheet(), student_id):
        expected = pool.question(slot.key).expected
        if pool.question(slot.key).form.kind == "single":
            out[slot.key] = expected[0]
        elif pool.question(slot.key).form.kind == "multi":
            out[slot.key] = set(expected[0])
        else:
            out[slot.key] = tuple(expected)
    return out
