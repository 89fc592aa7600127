"""What a student answered: the answer forms, reading answers out of a notebook, and checking their shape.

Answers are data. A student writes `answers["p07"] = "b"` (one letter), `answers["p12"] = {"a", "c"}` (a set of
letters) or `answers["p31"] = ("b", 132)` (one entry per part of a diagnosis question) in the notebook's code
cells. The grader never runs them: read_answers parses the cells' SOURCE with Python's ast and takes each value
with ast.literal_eval, so nothing a kernel does (monkeypatching, fake outputs, killed kernels, skipped cells)
changes what is read, and a value must be written out (a literal), not computed. When a key is assigned more
than once, the last assignment in notebook order counts, as it would when the notebook runs from the top.

Garbage never stops grading: a cell that does not parse is skipped, a value that is not a literal becomes an
Unreadable, and a value of the wrong shape makes parse_answer raise AnswerError, which scores that question 0.
Nothing here knows a right answer; the kernel-side format check in quizzes.graded.student uses it too.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_CELL_CHARS = 64 * 1024  # an answer cell is a few lines; a larger cell is not parsed (it could be a bomb)
MAX_CELLS = 2000
ANSWER_NAME = "answers"
KEY_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}$")


class AnswerError(ValueError):
    """A well-read answer of the wrong shape; the message says what shape was expected, never what is right."""


@dataclass(frozen=True)
class Unreadable:
    """An assignment to answers[...] whose value is not a literal (a name, a call, an expression)."""

    reason: str


@dataclass(frozen=True)
class AnswerForm:
    """The shape of one question's answer: public, it is what the notebook asks for."""

    kind: str  # "single", "multi" or "parts"
    letters: str = ""  # single and multi: the letters offered
    parts: tuple[tuple[str, str], ...] = ()  # parts: ("choice", letters) or ("number", unit)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "letters": self.letters, "parts": [list(p) for p in self.parts]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AnswerForm:
        return cls(data["kind"], data.get("letters", ""), tuple((p[0], p[1]) for p in data.get("parts", ())))

    def example(self) -> str:
        """How to write an answer of this form, with placeholder values (not a hint: every option appears)."""
        if self.kind == "single":
            return '"a"'
        if self.kind == "multi":
            return '{"a", "c"}'
        return "(" + ", ".join('"a"' if k == "choice" else "12.5" for k, _ in self.parts) + ")"

    def describe(self) -> str:
        if self.kind == "single":
            return f"one letter in quotes, one of {', '.join(self.letters)}"
        if self.kind == "multi":
            return f"a set of letters in quotes, from {', '.join(self.letters)} (all that are right)"
        described = [f"a letter ({', '.join(v)})" if k == "choice" else f"a number in {v}" for k, v in self.parts]
        return "a tuple: " + "; ".join(f"part {i} {d}" for i, d in enumerate(described, 1))


def _letter(value: object, letters: str, where: str) -> str:
    if not isinstance(value, str) or value.strip().lower() not in letters or len(value.strip()) != 1:
        raise AnswerError(f"{where} must be one letter in quotes, one of {', '.join(letters)}")
    return value.strip().lower()


def _number(value: object, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip().replace(",", "."))
        except ValueError:
            raise AnswerError(f"{where} must be a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnswerError(f"{where} must be a number")
    try:
        number = float(value)
    except OverflowError:  # an integer literal of hundreds of digits
        raise AnswerError(f"{where} must be a finite number") from None
    if not math.isfinite(number):
        raise AnswerError(f"{where} must be a finite number")
    return number


def parse_answer(value: object, form: AnswerForm) -> tuple[Any, ...]:
    """The answer normalised for comparison: ("b",), (frozenset({"a", "c"}),), or one entry per part."""
    if isinstance(value, Unreadable):
        raise AnswerError(f"could not be read ({value.reason}): write the value itself, like {form.example()}")
    if value is None:
        raise AnswerError("no answer")
    if form.kind == "single":
        return (_letter(value, form.letters, "the answer"),)
    if form.kind == "multi":
        if isinstance(value, str):
            value = [v for v in re.split(r"[\s,]+", value.strip()) if v] if re.search(r"[\s,]", value) \
                else list(value.strip())
        if not isinstance(value, (set, frozenset, list, tuple)) or not value or len(value) > len(form.letters):
            raise AnswerError(f"the answer must be {form.describe()}")
        return (frozenset(_letter(v, form.letters, "each letter") for v in value),)
    if not isinstance(value, (tuple, list)) or len(value) != len(form.parts):
        raise AnswerError(f"the answer must be {form.describe()}")
    return tuple(_letter(v, spec, f"part {i}") if kind == "choice" else _number(v, f"part {i}")
                 for i, (v, (kind, spec)) in enumerate(zip(value, form.parts, strict=True), 1))


def _answer_key(target: ast.expr) -> str | None:
    """"p07" for the target answers["p07"], else None."""
    if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == ANSWER_NAME
            and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str)
            and KEY_RE.match(target.slice.value)):
        return target.slice.value
    return None


def _cell_source(cell: object) -> str | None:
    if not isinstance(cell, dict) or cell.get("cell_type") != "code":
        return None
    source = cell.get("source", "")
    if isinstance(source, list):  # nbformat on disk may split a source into lines
        if len(source) > MAX_CELL_CHARS or not all(isinstance(s, str) for s in source):
            return None
        source = "".join(source)
    if not isinstance(source, str) or len(source) > MAX_CELL_CHARS:
        return None
    return source


def read_answers(nb: object) -> dict[str, object]:
    """Every answers["key"] = literal in the notebook's code cells, read from their source, never executed."""
    found: dict[str, object] = {}
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        return found
    for cell in cells[:MAX_CELLS]:
        source = _cell_source(cell)
        if source is None or ANSWER_NAME not in source:
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue  # IPython magics or broken code: this cell holds no readable answer
        for stmt in tree.body:
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            key = _answer_key(stmt.targets[0])
            if key is None:
                continue
            try:
                found[key] = ast.literal_eval(stmt.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                found[key] = Unreadable("not a literal value")
    return found
