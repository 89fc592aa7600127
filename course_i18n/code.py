"""The code's learner-facing strings in gettext catalogs, beside the notebooks': extract, build and check.

minialloc and quizzes write every word they show a learner in English, in tables made by
``minialloc.lang.messages("<package>.<module>.<NAME>", {key: English, ...})``. Each package has one catalog per
language, ``<package>/locale/<lang>/LC_MESSAGES/<package>.po``, keyed like the notebooks' (see catalog.py):
``msgctxt`` is ``"<table>:<key>"`` (the table plays the notebook cell's part when the English changes), ``msgid``
the English. ``build`` compiles each ``.po`` to the ``.mo`` that minialloc.lang reads with the standard library
(the package needs no Babel at run time, and the wheel ships both).
"""

from __future__ import annotations

import ast
import io
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.mofile import read_mo, write_mo

from . import catalog as cat
from . import glossary

PACKAGES: tuple[str, ...] = ("minialloc", "quizzes")
DOMAIN_WHAT = "learner-facing strings of the code"
# Feedback names the learner's code without backticks (device.malloc, torch.cuda.empty_cache()): code, not prose,
# so the glossary leaves it alone on both sides, as it leaves `inline code` alone in the notebooks.
CODE_NAME = re.compile(r"\b\w+(?:\.\w+)+(?:\(\))?")


@dataclass(frozen=True)
class CodeLayout:
    """The repository holding the packages, and the course folder whose glossaries the catalogs follow."""

    root: Path
    course: Path

    def po(self, package: str, lang: str) -> Path:
        return self.root / package / "locale" / lang / "LC_MESSAGES" / f"{package}.po"

    def mo(self, package: str, lang: str) -> Path:
        return self.po(package, lang).with_suffix(".mo")

    def glossary(self, lang: str) -> Path:
        return self.course / "locale" / lang / "glossary.json"


def _literal_table(call: ast.Call) -> tuple[str, list[tuple[str, str]]] | None:
    """(table, [(key, English)]) of a ``messages("table", {...})`` call written out literally, else None."""
    if len(call.args) != 2 or call.keywords:
        return None
    name, table = call.args
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and isinstance(table, ast.Dict)):
        return None
    pairs = []
    for key, value in zip(table.keys, table.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)
                and isinstance(value, ast.Constant) and isinstance(value.value, str)):
            return None
        pairs.append((key.value, value.value))
    return name.value, pairs


def find(root: Path, package: str) -> list[cat.Entry]:
    """Every message of ``package``'s ``messages(...)`` tables, in file and table order. A call whose table name or
    entries are not literal strings is a ValueError: the catalog would silently miss it."""
    entries: list[cat.Entry] = []
    for path in sorted((root / package).rglob("*.py")):
        relative = path.relative_to(root)
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(relative))):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if called != "messages":  # messages(...) or lang.messages(...)
                continue
            found = _literal_table(node)
            if found is None:
                raise ValueError(f"{relative}:{node.lineno}: messages() needs a literal table name and a dict of "
                                 "literal strings, so that `python -m course_i18n extract` can read it")
            table, pairs = found
            if not table.startswith(f"{module}."):
                raise ValueError(f"{relative}:{node.lineno}: table {table!r} must be named {module}.<NAME>")
            entries += [cat.Entry(f"{table}:{key}", text, f"learner-facing string ({relative})") for key, text in pairs]
    return entries


def _merged(layout: CodeLayout, package: str, lang: str, entries: list[cat.Entry]) -> Catalog:
    path = layout.po(package, lang)
    old = cat.read(path) if path.exists() else None
    catalog = cat.merge(entries, lang, package, old, what=DOMAIN_WHAT)
    catalog.header_comment = (f"# {package}: {lang} translation of the {DOMAIN_WHAT} (minialloc.lang.messages).\n"
                              "# Updated by `python -m course_i18n extract`; the English in the source is the source. "
                              "Compiled by `python -m course_i18n build`.")
    return catalog


def extract(layout: CodeLayout, langs: Iterable[str]) -> list[Path]:
    """Bring each package's catalogs in line with its tables (a changed English goes fuzzy); the paths written."""
    written = []
    for package in PACKAGES:
        entries = find(layout.root, package)
        for lang in langs:
            path = layout.po(package, lang)
            if not entries and not path.exists():
                continue  # a package without messages needs no catalog
            if cat.write(path, _merged(layout, package, lang, entries)):
                written.append(path)
    return written


def compiled(po: Path) -> bytes:
    """The ``.mo`` bytes of a ``.po`` file: its translated, non-fuzzy entries (what gettext would show)."""
    buf = io.BytesIO()
    write_mo(buf, cat.read(po), use_fuzzy=False)
    return buf.getvalue()


def _shown(po: Path) -> dict[tuple[str | None, str], str]:
    """What a ``.po`` file gives gettext: (context, English) -> translation, for its translated, non-fuzzy entries."""
    return {(m.context, m.id): m.string for m in cat.messages(cat.read(po)) if cat.translated(m)}


def _compiled_translations(mo: Path) -> dict[tuple[str | None, str], str]:
    """The same for a ``.mo`` file. Compared by content, not bytes: the header Babel writes names its version."""
    with mo.open("rb") as f:
        return {(m.context, m.id): m.string for m in read_mo(f) if m.id}


def build(layout: CodeLayout, langs: Iterable[str]) -> list[str]:
    """Compile every catalog to its ``.mo``; one line per file written."""
    lines = []
    for package in PACKAGES:
        for lang in langs:
            po, mo = layout.po(package, lang), layout.mo(package, lang)
            if not po.exists():
                continue
            if not mo.exists() or _compiled_translations(mo) != _shown(po):  # same content: leave the file alone
                mo.write_bytes(compiled(po))
                lines.append(f"wrote {mo}")
    return lines


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def check(layout: CodeLayout, langs: Iterable[str]) -> list[str]:
    """What keeps the code's catalogs from being complete, current and true to the glossary; empty when none."""
    problems: list[str] = []
    for package in PACKAGES:
        try:
            wanted = find(layout.root, package)
        except (ValueError, SyntaxError) as exc:
            problems.append(str(exc))
            continue
        for lang in langs:
            po = layout.po(package, lang)
            if not wanted and not po.exists():
                continue
            if not po.exists():
                problems.append(f"{po}: missing (run `python -m course_i18n extract`)")
                continue
            terms = glossary.load(layout.glossary(lang)) if layout.glossary(lang).exists() else []
            have = {(m.context, m.id): m for m in cat.messages(cat.read(po))}
            keys = {(e.context, e.text) for e in wanted}
            for e in wanted:
                m = have.get((e.context, e.text))
                label = f"{po}: [{e.context}]"
                if m is None:
                    problems.append(f"{label} not in the catalog (the English changed: run `python -m course_i18n "
                                    f"extract`): {e.text[:60]!r}")
                elif not m.string:
                    problems.append(f"{label} untranslated: {e.text[:60]!r}")
                elif m.fuzzy:
                    problems.append(f"{label} fuzzy (the English changed; review, then remove the fuzzy flag): "
                                    f"{e.text[:60]!r}")
                elif _fields(m.string) != _fields(e.text):
                    problems.append(f"{label} fields {sorted(_fields(m.string))}, the English has "
                                    f"{sorted(_fields(e.text))}")
                else:
                    # each message is read on its own, so a term's "first use" rendering is never required
                    seen = {term.term for term in terms}
                    for problem in glossary.violations(CODE_NAME.sub(" ", e.text), CODE_NAME.sub(" ", m.string),
                                                       terms, seen,
                                                       glossary.waived(list(m.user_comments))):
                        problems.append(f"{label} glossary: {problem}")
            for context, text in have:
                if (context, text) not in keys:
                    problems.append(f"{po}: [{context}] no longer in the code (run `python -m course_i18n extract`): "
                                    f"{text[:60]!r}")
            mo = layout.mo(package, lang)
            if not mo.exists() or _shown(po) != _compiled_translations(mo):
                problems.append(f"{mo}: out of date with its .po (run `python -m course_i18n build`)")
    return problems
