"""Write the graded quiz's nbgrader source notebook from the bank: `python -m quizzes build-graded`.

The notebook is generated, not hand-edited, so the graded questions always say what the bank says in all three
languages; tests/test_quiz_graded.py fails if the committed notebook differs from a fresh build. Choice options
are shuffled once with the quiz name as seed and relabelled a, b, c..., so the graded letters are not the bank's.

Cell kinds (nbgrader schema 3): read-only text and code (locked), the student's answer cells (solution, with the
reference answer between ### BEGIN SOLUTION and ### END SOLUTION), and one autograded test cell per question
(grade + locked, with points): a visible format check, then the key between ### BEGIN HIDDEN TESTS and
### END HIDDEN TESTS, which generate_assignment removes from the release and autograde restores.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

from ..bank import Option, Question, load_bank
from ..i18n import LANG_NAMES, LANGS, pick
from . import QUIZ1, SOURCE_DIR, GradedQuestion, GradedQuiz, expected

SOLUTION_STUDENT = "demo-student"  # the id the source notebook's reference answers are computed for
LETTERS = "abcdefgh"

_INTRO = {
    "en": (
        "{n} questions, {points} points; you pass with {pass_pct}% ({pass_points} points). "
        "First write your student id in the cell marked for it and run the notebook from the top. "
        "For each question, write your answer in the code cell below it, replacing `raise NotImplementedError()`, "
        "in the form shown there. Questions {first_computed}–{n} are computed for your student id: run the cell "
        "under the question to see your numbers; you may use minialloc to work them out. Your answers must be in "
        "the notebook's code: the grader runs the notebook again from the top. Use Validate before you submit."
    ),
    "vi": (
        "{n} câu hỏi, {points} điểm; bạn đạt nếu được {pass_pct}% ({pass_points} điểm). "
        "Trước tiên hãy ghi mã số sinh viên vào ô dành cho nó và chạy notebook từ đầu. "
        "Với mỗi câu, ghi câu trả lời vào ô mã bên dưới, thay cho `raise NotImplementedError()`, theo đúng mẫu ở "
        "đó. Các câu {first_computed}–{n} được tạo riêng theo mã số sinh viên của bạn: chạy ô bên dưới câu hỏi để "
        "xem số liệu của bạn; bạn được phép dùng minialloc để tính. Câu trả lời phải nằm trong mã của notebook: "
        "người chấm sẽ chạy lại notebook từ đầu. Hãy bấm Validate trước khi nộp."
    ),
    "de": (
        "{n} Fragen, {points} Punkte; bestanden ist ab {pass_pct} % ({pass_points} Punkte). "
        "Tragen Sie zuerst Ihre Studierenden-ID in die dafür vorgesehene Zelle ein und führen Sie das Notebook von "
        "oben aus. Schreiben Sie jede Antwort in die Codezelle unter der Frage, anstelle von "
        "`raise NotImplementedError()`, in der dort gezeigten Form. Die Fragen {first_computed}–{n} werden für Ihre "
        "ID berechnet: Führen Sie die Zelle unter der Frage aus, um Ihre Zahlen zu sehen; minialloc dürfen Sie "
        "benutzen. Die Antworten müssen im Code des Notebooks stehen: Die Bewertung führt das Notebook erneut von "
        "oben aus. Nutzen Sie vor der Abgabe „Validate“."
    ),
}
_ID_TEXT = {
    "en": "Your student id, exactly as your instructor has it (your JupyterHub or nbgrader user name).",
    "vi": "Mã số sinh viên của bạn, đúng như giảng viên đang dùng (tên người dùng JupyterHub hoặc nbgrader).",
    "de": "Ihre Studierenden-ID, genau wie Ihre Lehrkraft sie führt (Ihr JupyterHub- bzw. nbgrader-Benutzername).",
}
_COMPUTED_TEXT = {
    "en": "Run the cell below: it prints this question with your numbers.",
    "vi": "Chạy ô bên dưới: nó in câu hỏi này với số liệu của bạn.",
    "de": "Führen Sie die Zelle unten aus: Sie zeigt diese Frage mit Ihren Zahlen.",
}
_SELECT_ALL = {
    "en": "Several answers can be right.",
    "vi": "Có thể có nhiều đáp án đúng.",
    "de": "Mehrere Antworten können richtig sein.",
}


def _meta(grade_id: str, *, locked: bool = False, solution: bool = False, points: int | None = None) -> dict:
    meta = {"schema_version": 3, "grade": points is not None, "locked": locked, "solution": solution,
            "grade_id": grade_id, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _cell_id(grade_id: str) -> str:
    return grade_id.replace("_", "-")


def _markdown(source: str, grade_id: str) -> NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source, metadata=_meta(grade_id, locked=True))
    cell.id = _cell_id(grade_id)
    return cell


def _code(source: str, grade_id: str | None, **kinds: object) -> NotebookNode:
    metadata = _meta(grade_id, **kinds) if grade_id is not None else {}
    cell = nbformat.v4.new_code_cell(source, metadata=metadata)
    cell.id = _cell_id(grade_id or "language")
    return cell


def shuffled_options(quiz: GradedQuiz, question: Question) -> list[tuple[str, Option]]:
    """(graded letter, bank option), in the order the graded notebook shows them."""
    options = list(question.options)
    digest = hashlib.sha256(f"{quiz.name}|{question.id}".encode()).digest()
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(options)
    return list(zip(LETTERS, options, strict=False))


def graded_key(quiz: GradedQuiz, gq: GradedQuestion) -> str | set[str]:
    """The letter(s) right in the graded notebook: the key the hidden tests hold."""
    question = load_bank()[gq.bank_id]
    letters = {opt.id: letter for letter, opt in shuffled_options(quiz, question)}
    if question.kind == "single":
        return letters[str(question.answer)]
    assert isinstance(question.answer, frozenset)
    return {letters[a] for a in question.answer}


def _question_markdown(quiz: GradedQuiz, number: int, gq: GradedQuestion, question: Question) -> str:
    unit = "point" if gq.points == 1 else "points"
    lines = [f"### Question {number} · {gq.points} {unit} · `answers[\"{gq.key}\"]`", ""]
    for lang in LANGS:
        if question.kind == "computed":
            lines += [f"**{LANG_NAMES[lang]}.** {_COMPUTED_TEXT[lang]}", ""]
            continue
        lines.append(f"**{LANG_NAMES[lang]}.** {pick(question.text, lang)}")
        if question.kind == "multi":
            lines[-1] += f" *{_SELECT_ALL[lang]}*"
        lines.append("")
        lines += [f"- **{letter}**) {pick(opt.text, lang)}" for letter, opt in shuffled_options(quiz, question)]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _answer_cell(quiz: GradedQuiz, gq: GradedQuestion, question: Question, student: str) -> str:
    key = gq.key
    if question.kind == "single":
        letters = ", ".join(LETTERS[: len(question.options)])
        hint = f'# answers["{key}"] = one letter in quotes ({letters})'
        solution = f'answers["{key}"] = "{graded_key(quiz, gq)}"'
    elif question.kind == "multi":
        hint = f'# answers["{key}"] = a set of letters in quotes, like {{"x", "y"}}'
        letters_set = ", ".join(f'"{x}"' for x in sorted(graded_key(quiz, gq)))
        solution = f'answers["{key}"] = {{{letters_set}}}'
    else:
        unit = pick(question.unit, "en") if question.unit else ""
        hint = f'# answers["{key}"] = a number, in {unit}'
        value = expected(quiz.name, key, student)
        solution = f'answers["{key}"] = {int(value) if value.is_integer() else round(value, 4)}'
    return f"{hint}\n### BEGIN SOLUTION\n{solution}\n### END SOLUTION"


# Hidden tests run in the student's kernel, after the student's code: they must not trust anything that code could
# have replaced. Choice keys are compared with builtin str methods only (a str subclass with a lying __eq__ gains
# nothing); computed answers are checked after reloading the quiz modules, which undoes monkeypatching of them.
_RELOAD = ('_importlib = __import__("importlib")  # no import statement: a hidden test sits mid-cell\n'
           'for _module in ("quizzes.computed", "quizzes.bank", "quizzes.practice", "quizzes.graded"):\n'
           '    _importlib.reload(_importlib.import_module(_module))\n')


def _test_cell(quiz: GradedQuiz, gq: GradedQuestion, question: Question) -> str:
    key = gq.key
    present = f'assert "{key}" in answers, \'no answer yet: set answers["{key}"] in the cell above\''
    if question.kind == "single":
        letters = LETTERS[: len(question.options)]
        visible = (f'assert Q.is_choice(answers["{key}"], "{letters}"), '
                   f'\'answers["{key}"] must be one of the letters {", ".join(letters)}\'')
        hidden = f'assert str.lower(str.strip(answers["{key}"])) == "{graded_key(quiz, gq)}"'
    elif question.kind == "multi":
        letters = LETTERS[: len(question.options)]
        visible = (f'assert Q.is_choices(answers["{key}"], "{letters}"), '
                   f'\'answers["{key}"] must be a set of letters from {", ".join(letters)}\'')
        want = ", ".join(f'"{x}"' for x in sorted(graded_key(quiz, gq)))
        hidden = (f'assert sorted({{str.lower(str.strip(x)) for x in answers["{key}"]}}) == [{want}]\n'
                  f'assert len(answers["{key}"]) == {len(graded_key(quiz, gq))}')
    else:
        visible = f'assert Q.is_number(answers["{key}"]), \'answers["{key}"] must be a number\''
        hidden = (f'{_RELOAD}assert _importlib.import_module("quizzes.graded").check_computed('
                  f'"{quiz.name}", "{key}", answers["{key}"], STUDENT_ID)')
    return f"{present}\n{visible}\n### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS"


def build_notebook(quiz: GradedQuiz = QUIZ1, student: str = SOLUTION_STUDENT) -> NotebookNode:
    """The source notebook of `quiz`, with reference answers for `student`."""
    bank = load_bank()
    questions = [(gq, bank[gq.bank_id]) for gq in quiz.questions]
    first_computed = next(i for i, (_, q) in enumerate(questions, 1) if q.kind == "computed")
    pass_points = round(quiz.pass_mark * quiz.max_score, 2)
    intro = "\n\n".join(
        f"**{LANG_NAMES[lang]}.** " + _INTRO[lang].format(
            n=len(questions), points=quiz.max_score, pass_pct=round(quiz.pass_mark * 100),
            pass_points=f"{pass_points:g}" if lang == "en" else f"{pass_points:g}".replace(".", ","),
            first_computed=first_computed)
        for lang in LANGS
    )
    title = " / ".join(dict.fromkeys(pick(quiz.title, lang) for lang in LANGS))
    cells = [
        _markdown(f"# {title}\n\n{intro}\n", "header"),
        _code("from quizzes import graded as Q\n\nanswers = {}", "setup", locked=True),
        _markdown("## Student id\n\n" + "\n\n".join(f"**{LANG_NAMES[lang]}.** {_ID_TEXT[lang]}" for lang in LANGS),
                  "student_id_text"),
        _code(f'# STUDENT_ID = "your id"\n### BEGIN SOLUTION\nSTUDENT_ID = "{student}"\n### END SOLUTION',
              "student_id", solution=True),
        _code("Q.hello(STUDENT_ID)", "hello", locked=True),
        _code('LANG = "en"  # or "vi" (Tiếng Việt), "de" (Deutsch): the language of the computed questions', None),
    ]
    for number, (gq, question) in enumerate(questions, 1):
        cells.append(_markdown(_question_markdown(quiz, number, gq, question), f"{gq.key}_text"))
        if question.kind == "computed":
            cells.append(_code(f'Q.show("{quiz.name}", "{gq.key}", STUDENT_ID, LANG)', f"{gq.key}_scenario",
                               locked=True))
        cells.append(_code(_answer_cell(quiz, gq, question, student), f"{gq.key}_answer", solution=True))
        cells.append(_code(_test_cell(quiz, gq, question), f"{gq.key}_test", locked=True, points=gq.points))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def notebook_path(quiz: GradedQuiz = QUIZ1) -> Path:
    return SOURCE_DIR / quiz.name / f"{quiz.name}.ipynb"


def write(quiz: GradedQuiz = QUIZ1, path: Path | None = None) -> Path:
    path = path or notebook_path(quiz)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb := build_notebook(quiz))
    nbformat.write(nb, path)
    return path
