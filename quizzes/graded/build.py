"""Write a graded quiz's nbgrader source notebook from the private bank: `python -m quizzes build-graded`.

    python -m quizzes build-graded --bank PRIVATE_DIR [--quiz quiz1] [--secret-file FILE] [--out SOURCE_DIR]

The notebook holds prompts only: no solution, no hidden test, no key. It is the same for the whole class (nbgrader
releases one notebook), so it holds every pool question's prompt; a locked cell lists each student's drawn
questions (quizzes.graded.draw). Cells (nbgrader schema 3):

- locked markdown: the header, and one prompt per pool question (with its exhibit and lettered options);
- a locked setup cell binding SHEET (the public draw plan and answer forms) and `answers = {}`;
- plain code cells for the student: STUDENT_ID, and one `answers["p07"] = None` under each prompt;
- one locked grade cell per slot (`slot01`..., with the slot's points): a shape check in the kernel (help, not
  a score). The grader's preprocessor replaces these cells' scores with quizzes.graded.scoring's.

The build also writes PRIVATE_DIR/.built/<quiz>.json, the pool's fingerprint, which the grader checks.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

from minialloc.lang import messages

from ..cues import cue_reports, private_items, refusal
from ..i18n import LANG_NAMES, LANGS
from .draw import slot_id
from .pool import Pool, build_pool
from .private_bank import PrivateBankError, QuizDefinition, load_quiz
from .scoring import write_record

# The quiz notebook's introduction, every language one after the other (the student may not have chosen one).
TEXT = messages("quizzes.graded.build.TEXT", {
    "intro":
        "{count} questions are drawn for you from the {pool} below ({tiers}): {points} points; you pass with "
        "{pass_pct}% ({pass_points} points). Write your student id (your JupyterHub or nbgrader user name) in the "
        "cell for it and run the notebook from the top: the cell under it lists your questions. Answer each of "
        "them in the code cell under its prompt, writing the value itself: `answers[\"p07\"] = \"b\"`, a set of "
        "letters, or a tuple with one entry per part. The grader reads your answers from the notebook's text, "
        "outside your kernel, and draws your questions from your user name: answers to other questions, "
        "computed values and printed output earn nothing. The cells at the end check the form of your answers, "
        "not whether they are right.",
})


def _meta(grade_id: str, *, points: float | None = None) -> dict:
    meta = {"schema_version": 3, "grade": points is not None, "locked": True, "solution": False,
            "grade_id": grade_id, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _markdown(source: str, grade_id: str) -> NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source, metadata=_meta(grade_id))
    cell.id = grade_id.replace("_", "-")
    return cell


def _locked_code(source: str, grade_id: str, points: float | None = None) -> NotebookNode:
    cell = nbformat.v4.new_code_cell(source, metadata=_meta(grade_id, points=points))
    cell.id = grade_id.replace("_", "-")
    return cell


def _student_code(source: str, cell_id: str) -> NotebookNode:
    """A cell the student writes in: no nbgrader metadata, so autograde keeps it as submitted."""
    cell = nbformat.v4.new_code_cell(source)
    cell.id = cell_id
    return cell


def _number(x: float, lang: str) -> str:
    return f"{x:g}" if lang == "en" else f"{x:g}".replace(".", ",")


def build_notebook(pool: Pool) -> NotebookNode:
    quiz, sheet = pool.quiz, pool.sheet()
    pass_points = round(quiz.pass_mark * quiz.max_score, 2)
    intro = []
    for lang in LANGS:
        tiers = "; ".join(f"{t.name}: {t.count} × {_number(t.points, lang)}" for t in quiz.tiers)
        intro.append(f"**{LANG_NAMES[lang]}.** " + TEXT["intro"][lang].format(
            count=sheet.slot_count, pool=len(pool.questions), tiers=tiers, points=_number(quiz.max_score, lang),
            pass_pct=round(quiz.pass_mark * 100), pass_points=_number(pass_points, lang)))
    title = " / ".join(dict.fromkeys(quiz.title[lang] for lang in LANGS if lang in quiz.title))
    cells = [
        _markdown(f"# {title}\n\n" + "\n\n".join(intro) + "\n", "header"),
        _locked_code("from quizzes.graded import student as Q\n\n"
                     f"SHEET = Q.Sheet.from_json({sheet.to_json()!r})\nanswers = {{}}", "setup"),
        _markdown("## Student id", "student_id_text"),
        _student_code('STUDENT_ID = ""  # your student id, in quotes', "student-id"),
        _locked_code("MY_QUESTIONS = Q.hello(SHEET, STUDENT_ID)", "hello"),
        _markdown("## Questions", "questions_text"),
    ]
    for q in pool.questions:
        cells.append(_markdown(q.markdown, f"{q.key}_text"))
        cells.append(_student_code(f'answers["{q.key}"] = None  # only if {q.key} is one of your questions',
                                   f"{q.key}-answer"))
    cells.append(_markdown("## Form check\n\nEach cell below checks that one of your questions has an answer the "
                           "grader can read. The grader scores them outside this notebook.", "check_text"))
    number = 0
    for tier in sheet.tiers:  # slot numbers and points, tier by tier: draw.draw fills the slots in this order
        for _ in range(tier.count):
            number += 1
            cells.append(_locked_code(f"Q.check(SHEET, answers, STUDENT_ID, {number})", slot_id(number),
                                      points=tier.points))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "minialloc_quiz": {"quiz": quiz.name, "fingerprint": pool.fingerprint},
    }
    return nb


def notebook_path(out_dir: Path, quiz: str) -> Path:
    return Path(out_dir) / quiz / f"{quiz}.ipynb"


def refuse_option_cues(definition: QuizDefinition) -> None:
    """Raise when the quiz's single-choice questions can be passed by option length (quizzes.cues)."""
    reason = refusal(f"quiz {definition.name!r}", cue_reports(private_items(definition.questions)))
    if reason is not None:
        raise PrivateBankError(definition.file, None, None, f"{reason}, or build it anyway with --allow-cues")


def build(bank_dir: Path, secret: bytes, *, quiz: str | None = None, out_dir: Path = Path("source"),
          progress: bool = True, allow_cues: bool = False) -> tuple[Path, Pool]:
    """Build the pool (scenarios run on minialloc), write the source notebook and the build record.

    A bank whose single-choice questions a learner passes by picking the longest or the shortest option is
    refused unless allow_cues is set.
    """
    definition = load_quiz(bank_dir, quiz)
    if not allow_cues:
        refuse_option_cues(definition)
    pool = build_pool(definition, secret, progress=progress)
    path = notebook_path(out_dir, definition.name)
    nb = build_notebook(pool)
    nbformat.validate(nb)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    write_record(bank_dir, pool)
    return path, pool


def describe(pool: Pool) -> str:
    quiz = pool.quiz
    tiers = ", ".join(f"{t.count} {t.name} x {t.points:g}" for t in quiz.tiers)
    return (f"{quiz.name}: {len(pool.questions)} questions in the pool, {tiers} per student = {quiz.max_score:g} "
            f"points, pass mark {quiz.pass_mark:.0%}; pool fingerprint {pool.fingerprint[:12]}")
