"""The language a notebook speaks, for every learner-facing string minialloc shows in the course.

A translated chapter (course/vi/, course/de/, written by ``python -m course_i18n build``) sets it once, in the
cell it adds before the chapter's first code cell::

    import minialloc.lang
    minialloc.lang.set_lang("vi")

Code that shows words to a learner (the stepper's and pictures' labels, the exercise checks' feedback, the
quiz's interface) writes them in English, in a table made by ``messages``, and asks ``say`` for one of them when it
draws, prints or raises, so the text follows ``get_lang()`` at that moment. Without ``set_lang`` the language comes
from the environment variable MINIALLOC_LANG, else English, so the English chapters and every script stay as
they are. ``set_lang`` also exports MINIALLOC_LANG, so the commands a chapter starts (``python -m minialloc
replay ...`` in a subprocess) answer in the chapter's language while its code cells stay those of the English.

The translations live where the notebooks' do, in gettext catalogs, the way Python's ``gettext`` module and GNU
gettext hold them: ``<package>/locale/<lang>/LC_MESSAGES/<package>.po``, one per package (minialloc, quizzes),
the English text as ``msgid`` and ``"<table>:<key>"`` as ``msgctxt`` (so the same English can be rendered two ways
in two places). ``python -m course_i18n extract`` writes the ``.po`` files from the tables, ``build`` compiles them
to the ``.mo`` files read here (with the standard library alone), and ``check`` fails on a missing or stale
translation and applies the course's glossary to them.
"""

from __future__ import annotations

import gettext
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from importlib import resources

LANGS: tuple[str, ...] = ("en", "vi", "de")
DEFAULT = "en"
ENV_VAR = "MINIALLOC_LANG"

_lang: str | None = None  # set by set_lang; None means "ask the environment"
_UNSET = object()
_env_before: object = _UNSET  # MINIALLOC_LANG as it was before set_lang first exported it (None: absent)


def check_lang(lang: str) -> str:
    """``lang`` itself when it is one of LANGS; else a ValueError that names the choices."""
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGS)}")
    return lang


def set_lang(lang: str | None) -> None:
    """Make ``lang`` the language of everything shown from now on, in this process and in the subprocesses it
    starts (MINIALLOC_LANG is exported); ``None`` goes back to MINIALLOC_LANG as it was before, or English."""
    global _lang, _env_before
    _lang = None if lang is None else check_lang(lang)
    if _lang is not None:
        if _env_before is _UNSET:
            _env_before = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = _lang
    elif _env_before is not _UNSET:
        if _env_before is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = str(_env_before)
        _env_before = _UNSET


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
    before = _lang
    set_lang(lang)
    try:
        yield lang
    finally:
        set_lang(before)


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


class _Untranslated(gettext.NullTranslations):
    """The last fallback of a catalog: a message it does not hold is a KeyError, not its English (gettext's
    default), so ``Text`` can tell "not translated" from "translated as the same words"."""

    def pgettext(self, context: str, message: str) -> str:
        raise KeyError(f"{context}: {message!r}")


@cache
def catalog(package: str, lang: str) -> gettext.NullTranslations:
    """The compiled catalog of ``package`` (its ``locale/<lang>/LC_MESSAGES/<package>.mo``) for ``lang``; a package
    without one has no translations, and every message shows in English."""
    path = resources.files(package) / "locale" / lang / "LC_MESSAGES" / f"{package}.mo"
    try:
        with path.open("rb") as f:
            found: gettext.NullTranslations = gettext.GNUTranslations(f)
    except FileNotFoundError:
        found = gettext.NullTranslations()
    found.add_fallback(_Untranslated())
    return found


class Text(Mapping[str, str]):
    """One learner-facing message: its English, and its translations read from the package's catalog when asked.

    It reads as ``{"en": ..., "vi": ..., "de": ...}`` with only the languages the catalog translates, so ``pick``
    falls back to English for the others."""

    def __init__(self, package: str, context: str, english: str) -> None:
        self.package, self.context, self.english = package, context, english

    def __getitem__(self, lang: str) -> str:
        if lang == DEFAULT:
            return self.english
        if lang not in LANGS:
            raise KeyError(lang)
        return catalog(self.package, lang).pgettext(self.context, self.english)

    def __iter__(self) -> Iterator[str]:
        return (lang for lang in LANGS if lang in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, lang: object) -> bool:
        try:
            self[lang]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __repr__(self) -> str:
        return f"Text({self.context!r}, {self.english!r})"


def messages(table: str, english: Mapping[str, str]) -> dict[str, Text]:
    """A module's table of learner-facing messages: ``key -> Text``, from the English of each.

    ``table`` names it as its catalog entries do (``"minialloc.viz.stepper.TEXT"``; an entry's ``msgctxt`` is
    ``"<table>:<key>"``) and its first part is the package whose catalog translates it. ``python -m course_i18n
    extract`` finds these calls in the source, so ``table`` and the English must be written out literally."""
    package = table.split(".", 1)[0]
    return {key: Text(package, f"{table}:{key}", text) for key, text in english.items()}
