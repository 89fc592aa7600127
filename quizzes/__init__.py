"""Quizzes and certificates for the minialloc course.

In a chapter notebook:

    import quizzes
    quizzes.practice(chapter=2)                 # the chapter's questions, shuffled, with instant feedback
    quizzes.practice(chapter=2, lang="vi")      # in Vietnamese (the widget also has a language switch)
    quizzes.practice(ids=["c2-5gb-2gb"], seed=7)

The bank lives in quizzes/bank/*.json (format in quizzes/README.md); `python -m quizzes check` checks it.
The graded quiz is built from an instructor's private bank by `python -m quizzes build-graded --bank DIR` and
graded in the grader's process (quizzes.graded); this public bank is for practice only. Certificates are Open
Badges 3.0 credentials made and checked by `python -m quizzes keygen | issue | certify | verify` (quizzes.certs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .bank import Bank, BankError, Question, load_bank
from .i18n import LANGS
from .practice import PracticeSession, TextQuiz, render_text

if TYPE_CHECKING:  # ipywidgets is imported only when a widget is shown
    from .widget import PracticeQuiz

__all__ = ["LANGS", "Bank", "BankError", "PracticeSession", "Question", "TextQuiz", "load_bank", "practice",
           "render_text"]


def _in_kernel() -> bool:
    """True inside a Jupyter kernel, where a widget can be displayed (also under nbclient)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def practice(
    chapter: int | Sequence[int] | None = None,
    *,
    ids: Sequence[str] | None = None,
    tag: str | None = None,
    lang: str | None = None,
    seed: int | str | None = None,
    limit: int | None = None,
    mode: str = "auto",
) -> TextQuiz | PracticeQuiz:
    """A practice quiz over a chapter's questions (or the given question ids, or one tag's questions, or the whole
    bank). tag="faq": the five questions of the course page's own quiz.

    lang: "en", "vi" or "de" (switchable in the widget); None: the notebook's language, minialloc.lang.get_lang()
    (a translated chapter sets it once; else MINIALLOC_LANG, else English). seed: fixes the order, the option
    order and the computed questions' numbers (None: new ones every time). limit: ask at most this many
    questions per round. mode: "widget" (ipywidgets), "text" (printable), or "auto": the widget inside a
    Jupyter kernel, else text.
    """
    if lang is None:
        from minialloc.lang import get_lang

        lang = get_lang()
    if mode not in ("auto", "widget", "text"):
        raise ValueError(f"mode must be 'auto', 'widget' or 'text', got {mode!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    bank = load_bank()
    if ids is not None:
        questions = [bank[qid] for qid in ids]
    elif tag is not None:
        questions = [q for q in bank if tag in q.tags]
        if not questions:
            raise ValueError(f"no questions tagged {tag!r}")
    elif chapter is not None:
        questions = bank.chapter(chapter)
        if not questions:
            raise ValueError(f"no questions for chapter {chapter!r}; chapters with questions: {bank.chapters}")
    else:
        questions = list(bank)
    title = None
    if tag is not None and ids is None:
        from .practice import TAG_TITLES

        title = TAG_TITLES.get(tag)
    elif isinstance(chapter, int) and chapter in bank.titles:
        from .i18n import UI

        title = {lang_: UI["title_chapter"][lang_].format(chapter=chapter) + " · " + bank.titles[chapter][lang_]
                 for lang_ in LANGS}
    session = PracticeSession(questions, lang=lang, seed=seed, title=title, limit=limit)
    if mode == "text" or (mode == "auto" and not _in_kernel()):
        return TextQuiz(session)
    try:
        from .widget import PracticeQuiz
    except ImportError:  # ipywidgets is not installed: the text still lets a student read the questions
        if mode == "widget":
            raise
        return TextQuiz(session)
    return PracticeQuiz(session)
