"""What the graded quiz's locked cells call in the student's kernel: show the student's questions, check shapes.

Nothing here grades, and nothing here knows an answer: the kernel is the student's, so whatever it says is
help, not a score. The grader scores the notebook in its own process (quizzes.graded.scoring). The checks read
the student's answers the way the grader will, from the source of the cells run so far (IPython's `In`), so a
value the grader cannot read (a computed one) is reported here before submission.
"""

from __future__ import annotations

from typing import Any

from .answers import AnswerError, parse_answer, read_answers
from .draw import Sheet, Slot, draw

__all__ = ["AnswerError", "Sheet", "check", "hello"]


def _student_id(student_id: object) -> str:
    if not isinstance(student_id, str) or not student_id.strip() or len(student_id) > 100:
        raise ValueError('write your student id in quotes above, e.g. STUDENT_ID = "nguyen-van-a", and run it')
    return student_id.strip()


def hello(sheet: Sheet, student_id: object) -> list[Slot]:
    """Print the student's questions (drawn from the id they typed) and return them."""
    slots = draw(sheet, _student_id(student_id))
    print(f"Your {len(slots)} questions, {sheet.max_score:g} points in all (drawn for {student_id!r}; the grader "
          "draws for your JupyterHub / nbgrader user name):")
    for tier in sheet.tiers:
        keys = [s.key for s in slots if s.key in tier.keys]
        print(f"  {tier.name}, {tier.points:g} point{'s' if tier.points != 1 else ''} each: {', '.join(keys)}")
    print("Answer these, and only these; answers to other questions earn nothing.")
    return slots


def _as_graded(key: str) -> object:
    """answers[key] as the grader will read it: from the source of the cells run so far, not from the kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    history = shell.user_ns.get("In", []) if shell is not None else []
    cells = [{"cell_type": "code", "source": s} for s in history if isinstance(s, str)]
    return read_answers({"cells": cells}).get(key)


def check(sheet: Sheet, answers: dict[str, Any], student_id: object, number: int) -> None:
    """Slot `number`'s answer: present, readable as written, of the right shape (never: right)."""
    slots = draw(sheet, _student_id(student_id))
    slot = slots[number - 1]
    form = sheet.forms[slot.key]
    if answers.get(slot.key) is None:
        raise AnswerError(f"{slot.grade_id}: no answer yet to {slot.key}: set answers[\"{slot.key}\"] under it")
    parse_answer(answers[slot.key], form)
    written = _as_graded(slot.key)
    if written is not None:
        parse_answer(written, form)  # the value as written: a computed value raises "could not be read"
    points = f"{slot.points:g} point" + ("" if slot.points == 1 else "s")  # "1 point", "0.5 points", "2 points"
    print(f"{slot.grade_id}: {slot.key} is answered in a form the grader reads ({points} at stake)")
