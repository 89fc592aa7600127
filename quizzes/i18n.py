"""The three languages of the course and every string the quiz tools show around the questions.

Question text lives in the bank (quizzes/bank/*.json); this module holds the interface around it: buttons,
feedback, progress, the printed certificate, in English, with the translations in the quizzes package's gettext
catalogs (quizzes/locale/<lang>/LC_MESSAGES/quizzes.po, see minialloc.lang.messages). Every entry has all of LANGS,
which tests/test_quiz_bank.py checks.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping

from minialloc.lang import LANGS as LANGS  # the course's languages, for the quiz tools
from minialloc.lang import check_lang, messages

LANG_NAMES: dict[str, str] = {"en": "English", "vi": "Tiếng Việt", "de": "Deutsch"}

UI = messages("quizzes.i18n.UI", {
    "title": "Practice quiz",
    "title_chapter": "Practice quiz: chapter {chapter}",
    "check": "Check",
    "next": "Next question",
    "finish": "See my score",
    "retry": "Start again",
    "language": "Language",
    # the quiz's last line: a reopened notebook shows the saved quiz, but no kernel answers its buttons
    "rerun": "The buttons need this notebook's kernel: after reopening the notebook, run this cell again.",
    "your_answer": "Your answer",
    "correct": "Correct.",
    "wrong": "Not quite. You can change your answer and check again.",
    "choose_one": "Choose an answer first.",
    "choose_many": "Tick at least one answer first.",
    "not_a_number": "Please type a number, for example 20 or 1.5.",
    "select_all": "Select all that apply.",
    "answer_in": "Answer in {unit}.",
    "enter_hint": "Type a number and press Enter, or use the Check button.",
    "progress": "Question {i} of {n} · first-try score {score}/{answered}",
    "done": "Finished: {score} of {n} right at the first try. Start again for new numbers and a new order.",
    "text_mode": "Interactive quiz: open this notebook in JupyterLab to answer with instant feedback.",
    "question": "Question",
    "points": "points",
    "point": "point",
})

# The printable certificate's wording; {name}, {course}, {date}, {score} are filled in by quizzes.certs.printable.
CERT = messages("quizzes.i18n.CERT", {
    "heading": "Certificate of achievement",
    "awarded": "awarded to",
    "for_passing": "for passing the graded quiz of the course",
    "score": "Score: {score}",
    "date": "Date: {date}",
    "issuer": "Issued by {issuer}",
    "verification_id": "Verification ID",
    "how_to_verify": "Check it offline with: python -m quizzes verify {file}",
})


def ui(key: str, lang: str, **values: object) -> str:
    """One interface string in `lang`, with {placeholders} filled."""
    return UI[key][check_lang(lang)].format(**values)


def pick(text: Mapping[str, str], lang: str) -> str:
    """The `lang` entry of a {"en": ..., "vi": ..., "de": ...} text."""
    return text[check_lang(lang)]


_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def to_html(text: str) -> str:
    """The bank's tiny markup as HTML: `code`, **bold** and line breaks; everything else is escaped."""
    out = html.escape(text, quote=False)
    out = _CODE.sub(r"<code>\1</code>", out)
    out = _BOLD.sub(r"<b>\1</b>", out)
    return out.replace("\n", "<br>")


def to_plain(text: str) -> str:
    """The bank's markup for a terminal or a text/plain output: bold markers dropped, `code` kept."""
    return _BOLD.sub(r"\1", text)
