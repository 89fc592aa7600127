"""The graded quiz: its definition, and the helpers its nbgrader notebook calls.

quiz1 asks the five questions of the course page's own quiz, one many-choice question, and five computed
questions whose numbers depend on the student id. Points are set so that the computed questions decide: 6
choice points + 5 x 3 computed points = 21; the 80% pass mark needs 16.8, so no one passes without at least
four of the five computations right, and those cannot be copied from a neighbour (other id, other numbers) or
guessed (a number, not a letter).

The student writes STUDENT_ID and every answer in code cells (answers["q07"] = 20), so the answers survive
autograde's re-execution. The answer key exists only in the source notebook's hidden tests: the choice letters
literally, the computed answers as a call to check_computed, which reruns the student's scenario on minialloc.
Computed questions are open book: running minialloc on one's own numbers is allowed, copying is what fails.

Which id is graded? During autograde (NBGRADER_EXECUTION=autograde) nbgrader runs the notebook inside
autograded/<student id>/<assignment>/, so check_computed takes the id from that path, not from what the
notebook claims: a notebook copied from a friend is graded against its submitter's own numbers.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..bank import Question, Text, load_bank
from ..i18n import LANGS, check_lang, pick, to_plain
from ..practice import parse_number

GRADED_DIR = Path(__file__).resolve().parent
SOURCE_DIR = GRADED_DIR / "source"
STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")


@dataclass(frozen=True)
class GradedQuestion:
    key: str  # the name in the student's answers dict: "q01"
    bank_id: str  # the bank question it asks
    points: int


@dataclass(frozen=True)
class GradedQuiz:
    name: str  # the nbgrader assignment id and notebook name
    title: Text
    pass_mark: float  # fraction of max_score needed to pass; `python -m quizzes passmark` records it
    questions: tuple[GradedQuestion, ...]

    @property
    def max_score(self) -> int:
        return sum(q.points for q in self.questions)

    def question(self, key: str) -> GradedQuestion:
        for q in self.questions:
            if q.key == key:
                return q
        raise KeyError(f"{self.name} has no question {key!r}")


QUIZ1 = GradedQuiz(
    name="quiz1",
    title={
        "en": "Graded quiz 1: GPU memory management and fragmentation",
        "vi": "Bài kiểm tra 1: Quản lý và phân mảnh bộ nhớ GPU",
        "de": "Benotetes Quiz 1: GPU-Speicherverwaltung und Fragmentierung",
    },
    pass_mark=0.8,
    questions=(
        GradedQuestion("q01", "c1-why-caching", 1),
        GradedQuestion("q02", "c2-what-is-fragmentation", 1),
        GradedQuestion("q03", "c2-5gb-2gb", 1),
        GradedQuestion("q04", "c3-faq-expandable", 1),
        GradedQuestion("q05", "c4-faq-paged", 1),
        GradedQuestion("q06", "c2-empty-cache", 1),
        GradedQuestion("q07", "c1-computed-rounding", 3),
        GradedQuestion("q08", "c2-computed-oom", 3),
        GradedQuestion("q09", "c2-computed-summary", 3),
        GradedQuestion("q10", "c2-computed-empty-cache", 3),
        GradedQuestion("q11", "c4-computed-fork", 3),
    ),
)
QUIZZES: dict[str, GradedQuiz] = {QUIZ1.name: QUIZ1}


def quiz(name: str) -> GradedQuiz:
    try:
        return QUIZZES[name]
    except KeyError:
        raise KeyError(f"no graded quiz {name!r}; known: {', '.join(QUIZZES)}") from None


def bank_question(quiz_name: str, key: str) -> Question:
    return load_bank()[quiz(quiz_name).question(key).bank_id]


def student_seed(quiz_name: str, student_id: str) -> str:
    """The seed a student's computed questions are drawn from: their id, namespaced by the quiz."""
    return f"graded|{quiz_name}|{student_id}"


# -- helpers the notebook calls ---------------------------------------------------------------------------------

def check_student_id(student_id: object) -> str:
    if not isinstance(student_id, str) or not STUDENT_ID_RE.match(student_id.strip()):
        raise ValueError(
            "STUDENT_ID must be your student id as a string, e.g. STUDENT_ID = \"nguyen-van-a\" "
            "(letters, digits and . _ @ + -)"
        )
    return student_id.strip()


def hello(student_id: object) -> None:
    sid = check_student_id(student_id)
    print(f"STUDENT_ID = {sid!r}: the computed questions below are drawn for this id.")


def show(quiz_name: str, key: str, student_id: object, lang: str = "en") -> None:
    """Print a computed question with this student's numbers, in `lang`."""
    sid = check_student_id(student_id)
    question = bank_question(quiz_name, key)
    rendered = question.render(student_seed(quiz_name, sid))
    lang = check_lang(lang if lang in LANGS else "en")
    print(to_plain(pick(rendered.text, lang)))
    if rendered.exhibit:
        print()
        print(rendered.exhibit)
    if rendered.unit is not None:
        print()
        print({"en": "Answer in", "vi": "Trả lời bằng", "de": "Antwort in"}[lang], pick(rendered.unit, lang) + ".")


def is_choice(value: object, letters: str) -> bool:
    return isinstance(value, str) and value.strip().lower() in letters


def normalize_choice(value: object) -> str:
    return value.strip().lower() if isinstance(value, str) else ""


def is_choices(value: object, letters: str) -> bool:
    return (isinstance(value, (set, frozenset, list, tuple)) and len(value) > 0
            and all(is_choice(v, letters) for v in value))


def normalize_choices(value: object) -> set[str]:
    if not isinstance(value, (set, frozenset, list, tuple)):
        return set()
    return {normalize_choice(v) for v in value}


def is_number(value: object) -> bool:
    return parse_number(value) is not None


def submission_student_id(declared: object) -> str:
    """The id whose numbers are graded: the submission's folder during autograde, else what the notebook says."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        here = Path.cwd()
        # nbgrader's default layout {nbgrader_step}/{student_id}/{assignment_id}: autograded/<id>/<assignment>
        if here.parent.parent.name == "autograded" and STUDENT_ID_RE.match(here.parent.name):
            return here.parent.name
    return check_student_id(declared)


def expected(quiz_name: str, key: str, student_id: str) -> float:
    """What minialloc computes for this student's drawing of a computed question."""
    question = bank_question(quiz_name, key)
    if question.kind != "computed":
        raise ValueError(f"{quiz_name} {key} is not a computed question")
    return float(question.render(student_seed(quiz_name, check_student_id(student_id))).answer)


def check_computed(quiz_name: str, key: str, value: object, declared_student_id: object) -> bool:
    """Is `value` the right answer for the submitting student's numbers (within the question's tolerance)?"""
    given = parse_number(value)
    if given is None:
        return False
    question = bank_question(quiz_name, key)
    want = expected(quiz_name, key, submission_student_id(declared_student_id))
    return math.isclose(given, want, rel_tol=0, abs_tol=question.tolerance + 1e-9 * max(1.0, abs(want)))
