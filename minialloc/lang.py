"""The language a notebook speaks, for every learner-facing string minialloc shows in the course.

A translated chapter (course/vi/, course/de/, written by ``python -m course_i18n build``) sets it once, in the
cell it adds before the chapter's first code cell::

    import minialloc.lang
    minialloc.lang.set_lang("vi")

Code that shows words to a learner (the stepper's and pictures' labels, the exercise checks' feedback, the
quiz's default language) asks ``get_lang()`` when it draws or prints, and picks its text with ``pick``, using
the same ``{"en": ..., "vi": ..., "de": ...}`` shape as quizzes/i18n.py. Without ``set_lang`` the language comes
from the environment variable MINIALLOC_LANG, else English, so the English chapters and every script stay as
they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

LANGS: tuple[str, ...] = ("en", "vi", "de")
DEFAULT = "en"
ENV_VAR = "MINIALLOC_LANG"

_lang: str | None = None  # set by set_lang; None means "ask the environment"


def check_lang(lang: str) -> str:
    """``lang`` itself when it is one of LANGS; else a ValueError that names the choices."""
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGS)}")
    return lang


def set_lang(lang: str | None) -> None:
    """Make ``lang`` the language of everything shown from now on; ``None`` goes back to MINIALLOC_LANG or English."""
    global _lang
    _lang = None if lang is None else check_lang(lang)


def get_lang() -> str:
    """The language set by ``set_lang``, else MINIALLOC_LANG when it names one of LANGS, else English.

    An unknown MINIALLOC_LANG falls back to English rather than raising: a learner's shell setting must never
    stop a chapter from running.
    """
    if _lang is not None:
        return _lang
    env = os.environ.get(ENV_VAR, "").strip().lower()
    return env if env in LANGS else DEFAULT


@contextmanager
def using(lang: str) -> Iterator[str]:
    """Speak ``lang`` inside the ``with`` block only (tests, or one picture in another language)."""
    global _lang
    before = _lang
    set_lang(lang)
    try:
        yield lang
    finally:
        _lang = before


def pick(text: Mapping[str, str], lang: str | None = None) -> str:
    """The entry of ``text`` for ``lang`` (default: ``get_lang()``), falling back to English when it is missing,
    so a string not yet translated shows in English instead of failing."""
    chosen = check_lang(lang) if lang is not None else get_lang()
    if chosen in text:
        return text[chosen]
    return text[DEFAULT]


def say(table: Mapping[str, Mapping[str, str]], key: str, /, **fields: object) -> str:
    """The entry ``key`` of a module's message table in the notebook's language, with its ``{fields}`` filled in.

    Modules call it when they draw, print or raise, never at import, so a chapter that sets its language after
    importing them still gets its language."""
    return pick(table[key]).format(**fields)
