"""The course in Vietnamese and German: the English notebooks are the source, gettext catalogs hold the translations.

::

    python -m course_i18n extract [STEM ...]   # update course/locale/<lang>/<stem>.po (changed English -> fuzzy)
    python -m course_i18n build                # write course/vi/*.ipynb and course/de/*.ipynb
    python -m course_i18n check                # exit 1 with a list: stale notebooks, untranslated or fuzzy
                                               # entries, glossary violations

The same commands cover the labs (``--only course`` or ``--only labs`` to pick one): catalogs
``labs/locale/<lang>/<lab>.po``, built labs ``labs/source/<lab>_<lang>/<lab>_<lang>.ipynb`` (nbgrader assignments of
their own, graded exactly as the English lab: see ``labs``); ``extract LAB`` creates a lab's catalogs, drafts go to
``--labs-locale-dir labs/locale-work``.

The same commands cover the code's learner-facing strings (``--only code``): the English ``minialloc.lang.messages``
tables in minialloc/ and quizzes/, catalogs ``<package>/locale/<lang>/LC_MESSAGES/<package>.po``, which ``build``
compiles to the ``.mo`` files the packages read (see ``code``).

``segments`` cuts cells into units, ``catalog`` reads and merges the ``.po`` files (Babel), ``glossary`` holds the
per-language term rules, ``tool`` the three commands, ``labs`` what
is particular to the labs, ``cli`` the command line over both.
"""

from .cli import main
from .tool import build, check, extract

__all__ = ["build", "check", "extract", "main"]
