"""The course's predict-then-run and exercise harness: commit to an answer, then let minialloc say if it holds.

A learner uses two calls, each in the cell after the one they edit::

    rounded = ...                                    # cell tagged "predict": the learner replaces ... with a guess
    learn.reveal("c1-rounded", rounded, actual, chapter1.why("c1-rounded"))

    def release_and_retry(alloc, size): ...          # cell tagged "exercise": the learner writes the body
    learn.check("c1-retry", release_and_retry, chapter1.check_release_and_retry)

Both print plain text (readable in a terminal and in JupyterLab; in JupyterLab a small coloured HTML rendering is
shown as well), return that text, record the outcome under the id, and never raise: a learner's mistake is
feedback, not a traceback. ``results()`` gives every id's latest outcome:

- predictions: ``"not yet"`` (the guess is still ``...``), ``"right"`` or ``"wrong"``;
- exercises: ``"not yet"`` (the body still raises ``NotImplementedError`` or returns ``...``), ``"passed"`` or
  ``"failed"``.

For chapter authors, the checker contract (``minialloc/learn/chapterN.py`` holds one checker per exercise, with
the hidden reference solution beside it, never in the notebook):

- A checker is ``checker(learner_obj) -> str | None``. It exercises the learner's function or trace on minialloc
  and compares with the hidden reference. Returning normally means "passed"; a returned string is added to the
  "passed" line (say what the learner's code just showed).
- To say what is wrong, raise ``Wrong(message, hint)``: ``message`` states what the learner's code did that is
  wrong (the input, what came back, what was expected of it in words, never the expected value when that value
  is the answer); ``hint`` points at the idea to re-read. ``check`` prints both.
- Call the learner's code through ``call(fn, *args, **kwargs)``: a body that returns ``...`` then counts as
  "not yet", as does one that raises ``NotImplementedError``. Any other exception escaping the checker is reported
  as "failed" with the exception and the learner's line that raised it; so a checker that wants to accept an
  exception (an ``OutOfMemoryError`` the exercise asks for) must catch it itself.
- ``expect(condition, message, hint)`` is a one-line ``Wrong``.
- Raise ``NotYet(message)`` for any other "the learner has not started" state (an empty trace list, say).
- Every exercise has a hint ladder: the first miss shows the message (the failing case) and only ``rule`` (the
  chapter and rule to re-read), a second miss in a row the ``hint`` (the crux, closer), a third and later one
  ``fix`` when the checker gives one (the step to take, still not the code). ``Wrong(message, hint, rule=...,
  fix=...)`` sets a ladder for one mistake; ``@ladder(TEXT, "rule_id")`` on a checker gives every ``Wrong`` it
  raises without a rule of its own the exercise's rule, so no first miss shows the crux.

Predict-first, for chapter authors: a learner may press Run All, so nothing above a verdict may answer its
prediction. The explanation lives in ``chapterN.WHY`` (``chapterN.why(pid, **measured)``), never in the cell's
visible source; output that answers a prediction is printed only ``if learn.predicted(pid):``; and a reveal or
check cell rebuilds the state it measures, so running it twice gives the same verdict.

Prediction ids and exercise ids share one namespace; use ``cN-...`` for chapter N.

Languages: everything printed follows ``minialloc.lang.get_lang()`` (a translated chapter sets it once). Each
module keeps its learner-facing strings in English, in one ``minialloc.lang.messages`` table of message ids (the
translations are in minialloc's gettext catalogs), and turns an entry into text with ``say(table, id, **fields)``
when it raises or prints, never at import. The outcomes
that ``results()`` records ("not yet", "passed", ...) are the same in every language.
"""

from __future__ import annotations

import html
import math
import numbers
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ..lang import messages, say

__all__ = ["TEXT", "NotYet", "Wrong", "call", "check", "expect", "explainer", "ladder", "predicted", "reset", "results",
           "reveal", "say"]

NOT_YET = "not yet"
_RESULTS: dict[str, str] = {}
_MISSES: dict[str, int] = {}  # exercise id -> failed checks in a row, for the hint ladder

# What the harness itself prints, in English, shown in the notebook's language (minialloc.lang).
TEXT = messages("minialloc.learn.TEXT", {
    "blank": "your function still returns ..., the blank template",
    "predict_not_yet": "[{id}] not yet: write your prediction in the cell above (replace the ...), then run this cell",
    "right": "[{id}] right: {actual}",
    "why": "why: {why}",
    "wrong": "[{id}] wrong: you predicted {guess}, minialloc gives {actual}",
    "item": "item {n}: you said {guess}, it is {actual}",
    "count": "you gave {got} items, the answer has {want}",
    "tolerance": "(within {tol} would have counted as right)",
    "decimal_unit":
        "note: you wrote {unit}, read here as {binary} (2**10 steps), the unit of this course and of PyTorch's "
        "messages; a true {unit} is a power of 1000, a little smaller",
    "that_is": "{value}, that is ({units})",
    "no_compare": "[{id}] could not compare your prediction ({error})",
    "your_line": "  in your code, line {line}: {code}",
    "your_line_bare": "  in your code, line {line}",
    "exercise_blank": "[{id}] not yet: fill in the cell above, then run this cell",
    "exercise_not_yet":
        "[{id}] not yet{detail}: fill in the cell above (replace `raise NotImplementedError` or `...`), "
        "then run both cells",
    "not_implemented":
        "[{id}] not yet: your code still raises NotImplementedError; write it in the cell above, then run "
        "both cells",
    "not_passed": "[{id}] not passed: {message}",
    "hint": "hint: {hint}",
    "recursed": "[{id}] not passed: your code recursed without end",
    "raised": "[{id}] not passed: your code raised {error}",
    "ladder": "{rule} (miss again and the next hint is closer)",
    "passed": "[{id}] passed",
    "passed_note": "[{id}] passed: {note}",
})


def explainer(table: Mapping[str, Mapping[str, str]]) -> Callable[..., str]:
    """A chapter's ``why``, reading its table of explanations (``WHY``) when called."""

    def why(pid: str, **fields: object) -> str:
        """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
        return say(table, pid, **fields)

    return why


class Wrong(Exception):
    """Raised by a checker: the learner's code ran and is wrong. ``message`` says what is wrong, ``hint`` where to
    look; neither gives the answer. ``rule``, when given, is the first rung of a hint ladder: the first miss of an
    exercise points only to the rule to re-read (chapter and rule number), a second miss in a row gives ``hint``,
    the crux, and a third or later ``fix`` (the step to take), when given."""

    def __init__(self, message: str, hint: str = "", rule: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.rule = rule
        self.fix = fix

    def rung(self, misses: int) -> str:
        """The hint for the (misses + 1)-th failed check in a row: rule, then hint, then fix."""
        ladder = [r for r in (self.rule, self.hint, self.fix) if r]
        return ladder[min(misses, len(ladder) - 1)] if ladder else ""


def ladder(table: Mapping[str, Mapping[str, str]], rule_id: str) -> Callable[[Callable[[Any], str | None]],
                                                                             Callable[[Any], str | None]]:
    """Decorate an exercise's checker: a ``Wrong`` it raises without a rule gets ``say(table, rule_id)``, the
    exercise's rule, as its first rung, so the first miss of any kind names the rule, never the crux."""
    import functools

    def decorate(checker: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        @functools.wraps(checker)
        def checked(learner_obj: Any) -> str | None:
            try:
                return checker(learner_obj)
            except Wrong as exc:
                if not exc.rule:
                    exc.rule = say(table, rule_id)
                raise

        return checked

    return decorate


class NotYet(Exception):
    """Raised by a checker (or by ``call``) when the learner's code is still the blank template."""


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; a result of ``...`` (the blank template's return) means "not yet"."""
    result = fn(*args, **kwargs)
    if result is Ellipsis:
        raise NotYet(say(TEXT, "blank"))
    return result


def expect(condition: object, message: str, hint: str = "", rule: str = "", fix: str = "") -> None:
    """Raise ``Wrong(message, hint, rule, fix)`` unless ``condition`` holds."""
    if not condition:
        raise Wrong(message, hint, rule, fix)


def results() -> dict[str, str]:
    """Every id seen so far -> its latest outcome ("not yet", "right", "wrong", "passed", "failed")."""
    return dict(_RESULTS)


def predicted(pid: str) -> bool:
    """Has the learner made prediction ``pid`` (its latest reveal was "right" or "wrong")? A reveal cell prints
    the output that answers its prediction only then, so a Run All over blank cells shows no answer first."""
    return _RESULTS.get(str(pid)) in ("right", "wrong")


def reset() -> None:
    """Forget every recorded outcome (a fresh start, and the harness's own tests)."""
    _RESULTS.clear()
    _MISSES.clear()


# --- comparing a prediction with what minialloc did ---------------------------------------------------------


def _norm_text(s: str) -> str:
    # "Large pool", "large  pool" and "largepool" are the same answer: case and spaces carry no meaning here.
    return re.sub(r"\s+", "", s).casefold()


# Words a learner adds around a choice without changing it: "small pool" for "small", "lower than the recorded
# run" for "lower", "same" for "the same". Any other word (a second choice, a "not") keeps the answer apart.
_FILLER_WORDS = frozenset({"the", "a", "pool", "than", "as", "recorded", "run", "replay", "one"})


def _choice_words(s: str) -> list[str]:
    return [w for w in re.findall(r"[^\W_]+", s.casefold()) if w not in _FILLER_WORDS]


def _same_text(guess: str, actual: str) -> bool:
    if _norm_text(guess) == _norm_text(actual):
        return True
    words = _choice_words(actual)
    return bool(words) and _choice_words(guess) == words


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


# A number as a learner types it: "1.4 GiB", "20MB", "100%", "1,44 GiB" (a decimal comma), "6,526" (thousands).
_QUANTITY = re.compile(r"^\s*([-+]?\d+(?:[.,]\d+)?)\s*([A-Za-z%]*)\s*$")
_BINARY_OF_DECIMAL = {"kb": "kib", "mb": "mib", "gb": "gib", "tb": "tib"}


def _quantity(text: str) -> tuple[float, float, str, int, int] | None:
    """'1.4 GiB' -> (1.4, 2**30, 'gib', 1 decimal, 2 significant digits); None when the text is no number."""
    from ..sizes import _UNITS  # here, not at the top: keeps `import minialloc.learn` light

    m = _QUANTITY.match(text)
    if m is None:
        return None
    digits, unit = m.group(1), m.group(2).casefold()
    if "," in digits:  # "6,526" is a thousands separator, "1,44" a decimal comma
        whole, frac = digits.split(",")
        digits = whole + frac if len(frac) == 3 else f"{whole}.{frac}"
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    significant = len(digits.replace(".", "").lstrip("+-").lstrip("0")) or 1
    if unit == "%":
        return float(digits) / 100, 1.0, unit, decimals + 2, significant
    if unit not in _UNITS:
        return None
    return float(digits), float(_UNITS[unit]), unit, decimals, significant


def _same_number_text(guess: str, actual: float, rel_tol: float, notes: list[str]) -> bool:
    """A number typed as text. Exact questions (rel_tol 0) want the value; approximate ones also accept the
    value at the precision the learner wrote, as the text itself rounds it ("1.4 GiB" for 1.44 GiB), from two
    significant digits on. MB/GB are read as MiB/GiB when only that reading matches, with a note saying so."""
    q = _quantity(guess)
    if q is None:
        return False
    number, scale, unit, decimals, significant = q

    def matches(scale: float) -> bool:
        value = number * scale
        if value == actual or (rel_tol and math.isclose(value, actual, rel_tol=rel_tol)):
            return True
        # the learner's own rounding: actual, in the unit they wrote, rounded to their digits (strictly inside
        # half a last digit, so 19.5 MiB is never "20 MiB")
        return bool(rel_tol) and significant >= 2 and abs(actual / scale - number) < 0.5 * 10.0 ** -decimals

    if matches(scale):
        return True
    if unit in _BINARY_OF_DECIMAL:
        from ..sizes import _UNITS

        if matches(float(_UNITS[_BINARY_OF_DECIMAL[unit]])):
            notes.append(say(TEXT, "decimal_unit", unit=_unit_name(unit), binary=_unit_name(_BINARY_OF_DECIMAL[unit])))
            return True
    return False


def _unit_name(unit: str) -> str:
    """'mib' -> 'MiB', 'mb' -> 'MB': a unit as the course writes it."""
    return unit[0].upper() + unit[1:-1] + unit[-1].upper() if len(unit) == 3 else unit.upper()


def _same(guess: Any, actual: Any, rel_tol: float, notes: list[str] | None = None) -> bool:
    """True when the prediction matches: numbers within rel_tol (or text at the precision it was written in),
    text ignoring case, spaces and filler words around a choice, containers element by element (a list guess for
    a tuple answer is fine; a set answer ignores order). ``notes`` collects what the learner should still know
    about an answer accepted in a looser reading (MB read as MiB)."""
    notes = [] if notes is None else notes
    if isinstance(actual, bool) or isinstance(guess, bool):
        return isinstance(guess, bool) and isinstance(actual, bool) and guess == actual
    if _is_number(actual):
        if isinstance(guess, str):
            return _same_number_text(guess, actual, rel_tol, notes)
        if not _is_number(guess):
            return False
        if rel_tol == 0:
            return guess == actual
        return math.isclose(guess, actual, rel_tol=rel_tol)
    if isinstance(actual, str):
        return isinstance(guess, str) and _same_text(guess, actual)
    if isinstance(actual, (set, frozenset)):
        if not isinstance(guess, (set, frozenset, list, tuple, range)):
            return False
        # Order does not matter; each actual element must be matched by exactly one guessed element.
        remaining = list(guess)
        if len(remaining) != len(actual):
            return False
        for a in actual:
            for i, g in enumerate(remaining):
                if _same(g, a, rel_tol, notes):
                    del remaining[i]
                    break
            else:
                return False
        return True
    if isinstance(actual, Mapping):
        return (isinstance(guess, Mapping) and set(guess) == set(actual)
                and all(_same(guess[k], actual[k], rel_tol, notes) for k in actual))
    if isinstance(actual, (list, tuple, range)):
        return (isinstance(guess, (list, tuple, range)) and len(guess) == len(actual)
                and all(_same(g, a, rel_tol, notes) for g, a in zip(guess, actual, strict=True)))
    try:
        return bool(guess == actual)
    except Exception:  # an odd object whose == raises: a mismatch, not a crash in the learner's face
        return False


def _wrong_parts(guess: Any, actual: Any, rel_tol: float) -> list[str]:
    """For a tuple/list answer, which positions differ (so "3 of 5 right" can say which)."""
    if (isinstance(actual, (list, tuple)) and isinstance(guess, (list, tuple)) and len(guess) == len(actual)):
        return [say(TEXT, "item", n=i + 1, guess=repr(g), actual=repr(a))
                for i, (g, a) in enumerate(zip(guess, actual, strict=True)) if not _same(g, a, rel_tol)]
    if isinstance(actual, (list, tuple)) and isinstance(guess, (list, tuple)):
        return [say(TEXT, "count", got=len(guess), want=len(actual))]
    return []


def _show(value: Any) -> str:
    """A value as the learner reads it: byte counts also in PyTorch's units."""
    from ..sizes import format_size

    def big(x: Any) -> bool:
        return _is_number(x) and isinstance(x, numbers.Integral) and abs(int(x)) >= 1024

    if big(value):
        return f"{value!r} ({format_size(int(value))})"
    if isinstance(value, (list, tuple)) and any(big(x) for x in value):
        # (1024, 'small', 2097152, ...) is hard to read: repeat it with sizes in PyTorch's units
        units = ", ".join(format_size(int(x)) if big(x) else repr(x) for x in value)
        return say(TEXT, "that_is", value=repr(value), units=units)
    return repr(value)


# --- output ---------------------------------------------------------------------------------------------------


def _emit(text: str, status: str) -> None:
    """Print text; in a Jupyter kernel, publish it with an HTML twin so the outcome stands out."""
    shell = None
    ipython = sys.modules.get("IPython")
    if ipython is not None:
        try:
            shell = ipython.get_ipython()
        except Exception:
            shell = None
    if shell is None or not hasattr(shell, "kernel"):
        print(text)
        return
    colour = {"right": "#1a7f37", "passed": "#1a7f37", "wrong": "#b35900", "failed": "#b35900"}.get(status, "#555")
    body = html.escape(text).replace("\n", "<br>")
    markup = (f'<div style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0;'
              f'font-family:var(--jp-code-font-family,monospace);white-space:pre-wrap">{body}</div>')
    from IPython.display import display

    display({"text/plain": text, "text/html": markup}, raw=True)


class Feedback(str):
    """The text that was printed. In a notebook, a cell ending in ``reveal(...)`` must not print it twice."""

    def _ipython_display_(self) -> None:  # IPython calls this instead of showing the repr: already shown
        return None


def _record(key: str, status: str, text: str) -> Feedback:
    _RESULTS[str(key)] = status
    try:
        _emit(text, status)
    except Exception:  # output must never be what breaks a learner's cell
        print(text)
    return Feedback(text)


# --- the two calls --------------------------------------------------------------------------------------------


def reveal(pid: str, guess: Any, actual: Any, why: str, *, rel_tol: float = 0.0) -> str:
    """Compare a learner's prediction with what minialloc did, and say why. Never raises.

    ``guess`` is ``...`` while the learner has not predicted: then nothing is revealed. Numbers compare within
    ``rel_tol`` (a byte count may also be guessed as text: "20 MiB"); text ignores case and spaces; tuples and
    lists compare element by element; sets ignore order.
    """
    try:
        if guess is Ellipsis:
            return _record(pid, NOT_YET, say(TEXT, "predict_not_yet", id=pid))
        notes: list[str] = []
        if _same(guess, actual, rel_tol, notes):
            text = "\n".join([say(TEXT, "right", id=pid, actual=_show(actual)), *notes, say(TEXT, "why", why=why)])
            return _record(pid, "right", text)
        lines = [say(TEXT, "wrong", id=pid, guess=_show(guess), actual=_show(actual))]
        lines += [f"  {part}" for part in _wrong_parts(guess, actual, rel_tol)]
        if rel_tol:
            lines.append("  " + say(TEXT, "tolerance", tol=f"{rel_tol:.0%}"))
        lines.append(say(TEXT, "why", why=why))
        return _record(pid, "wrong", "\n".join(lines))
    except Exception as exc:  # a harness bug must not stop the learner's notebook
        return _record(pid, "wrong", say(TEXT, "no_compare", id=pid, error=f"{type(exc).__name__}: {exc}"))


def _learner_line(tb: Any) -> str:
    """The last frame outside minialloc: the line of the learner's own code that raised."""
    import os

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(tb) if not os.path.abspath(f.filename).startswith(package_dir)]
    if not frames:
        return ""
    f = frames[-1]
    if f.line:
        return say(TEXT, "your_line", line=f.lineno, code=f.line)
    return say(TEXT, "your_line_bare", line=f.lineno)


def check(eid: str, learner_obj: Any, checker: Callable[[Any], str | None]) -> str:
    """Run a chapter's checker on the learner's function or trace, and say "passed", "not yet" or what is wrong
    with a hint. Never raises; records the outcome under ``eid``."""
    if learner_obj is Ellipsis:
        _MISSES.pop(eid, None)
        return _record(eid, NOT_YET, say(TEXT, "exercise_blank", id=eid))
    misses = _MISSES.pop(eid, 0)  # put back below only when this check fails again
    try:
        note = checker(learner_obj)
    except NotYet as exc:
        detail = f" ({exc})" if str(exc) else ""
        return _record(eid, NOT_YET, say(TEXT, "exercise_not_yet", id=eid, detail=detail))
    except NotImplementedError:
        return _record(eid, NOT_YET, say(TEXT, "not_implemented", id=eid))
    except Wrong as exc:
        _MISSES[eid] = misses + 1
        text = say(TEXT, "not_passed", id=eid, message=exc.message)
        # the ladder: the rule at the first miss, the crux at the second, the step to take from the third on;
        # never the answer
        hint = exc.rung(misses)
        if exc.rule and misses == 0:
            hint = say(TEXT, "ladder", rule=hint)
        if hint:
            text += "\n" + say(TEXT, "hint", hint=hint)
        return _record(eid, "failed", text)
    except RecursionError:
        return _record(eid, "failed", say(TEXT, "recursed", id=eid))
    except Exception as exc:  # the learner's code raised: say what and where, not a traceback
        where = _learner_line(exc.__traceback__)
        text = say(TEXT, "raised", id=eid, error=f"{type(exc).__name__}: {exc}")
        if where:
            text += "\n" + where
        return _record(eid, "failed", text)
    if note:
        return _record(eid, "passed", say(TEXT, "passed_note", id=eid, note=note))
    return _record(eid, "passed", say(TEXT, "passed", id=eid))
