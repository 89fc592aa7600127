"""extract, build and check: the English notebooks, the catalogs and the generated notebooks kept in step."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import catalog as cat
from . import glossary
from .segments import Unit, _char_col, _line_offsets, _mask_magics, apply, cell_units, code_shape, fields

LANGS: tuple[str, ...] = ("vi", "de")  # the English notebooks are the source; these are built from them
LANG_CELL = {  # the cell a built notebook gets before its first code cell: the language the course helpers speak
    "vi": "Ngôn ngữ của notebook này: tiếng Việt (hình vẽ, phản hồi của bài tập và bài luyện tập dùng theo).",
    "de": "Sprache dieses Notebooks: Deutsch (Bilder, Rückmeldungen der Übungen und das Übungsquiz folgen ihr).",
}
_LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))|((?:src|href)=\")([^\"]+)(\")")
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_LINK_TARGET = re.compile(r"\]\(([^)\s]+)")
_MATH = re.compile(r"\$[^$\n]+\$")
_ONE_LINE = ("markdown heading", "markdown list item", "markdown table row", "code comment (end of line)")


@dataclass
class Layout:
    """Where things are: the English notebooks in ``course``, catalogs under ``locale/<lang>/``, built notebooks
    in ``course/<lang>/``."""

    course: Path
    locale: Path

    @classmethod
    def default(cls, course: Path | None = None, locale: Path | None = None) -> Layout:
        course = course or Path("course")
        return cls(course, locale or course / "locale")

    def english(self) -> list[Path]:
        return sorted(self.course.glob("*.ipynb"))

    def catalog_path(self, lang: str, stem: str) -> Path:
        return self.locale / lang / f"{stem}.po"

    def catalogs(self) -> list[tuple[str, Path]]:
        return [(lang, p) for lang in LANGS for p in sorted((self.locale / lang).glob("*.po"))]

    def built(self, lang: str, stem: str) -> Path:
        return self.course / lang / f"{stem}.ipynb"

    def glossary(self, lang: str) -> Path:
        return self.course / "locale" / lang / "glossary.json"  # one glossary per language, drafts included

    # what extract, build and check ask of a layout (LabLayout answers them for the labs)

    def source(self, stem: str) -> Path:
        """The English notebook ``stem``."""
        return self.course / f"{stem}.ipynb"

    def entries(self, nb: nbformat.NotebookNode) -> list[cat.Entry]:
        return entries(nb)

    def build_notebook(self, stem: str, catalog: cat.Catalog, lang: str) -> tuple[nbformat.NotebookNode, int]:
        return build_notebook(self.source(stem), catalog, lang, siblings_of(self, lang))

    def built_notebooks(self, lang: str) -> list[tuple[str, Path]]:
        """(stem, path) of every notebook generated for ``lang``, catalog or not."""
        return [(p.stem, p) for p in sorted((self.course / lang).glob("*.ipynb"))]

    def grading_problems(self, stem: str, built: nbformat.NotebookNode) -> list[str]:
        return []

    @property
    def what(self) -> str:
        return "course notebook"


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- the English side


def read_notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def cell_entries(cell: nbformat.NotebookNode, units: list[Unit] | None = None) -> tuple[list[Unit], list[cat.Entry]]:
    units = cell_units(cell.cell_type, cell.source) if units is None else units
    cid = cell.get("id")
    if units and not cid:
        raise ValueError("a cell without an id (nbformat 4.5 notebooks have them): cannot key its translation")
    contexts = [cid] if len(units) == 1 else [f"{cid}:{n}" for n in range(1, len(units) + 1)]
    return units, [cat.Entry(c, u.text, u.kind) for c, u in zip(contexts, units, strict=True)]


def entries(nb: nbformat.NotebookNode) -> list[cat.Entry]:
    return [e for cell in nb.cells for e in cell_entries(cell)[1]]


# ---------------------------------------------------------------- extract


def extract(layout: Layout, stems: Iterable[str] = (), langs: Iterable[str] = LANGS) -> list[Path]:
    """Update the catalogs of ``stems`` (default: every notebook that already has one) from the English notebooks;
    returns the catalogs written. Naming a notebook creates its catalogs; nothing else does."""
    stems = list(stems)
    written = []
    for lang in langs:
        wanted = stems or [p.stem for p in sorted((layout.locale / lang).glob("*.po"))]
        for stem in wanted:
            english = layout.source(stem)
            if not english.exists():
                raise FileNotFoundError(f"{english}: no such English notebook")
            path = layout.catalog_path(lang, stem)
            old = cat.read(path) if path.exists() else None
            new = cat.merge(layout.entries(read_notebook(english)), lang, english.name, old, layout.what)
            if cat.write(path, new):
                written.append(path)
    return written


# ---------------------------------------------------------------- build


def relocate(target: str, siblings: set[str]) -> str:
    """A relative link seen from course/<lang>/: a translated sibling chapter stays as it is, anything else in the
    course (data files, untranslated chapters, ../labs) is one folder up."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return target
    if target.split("#", 1)[0] in siblings:
        return target
    return "../" + target


_LAB_LINK = re.compile(r"^((?:\.\./)*labs/(?:student|source)/)([^/#?]+)/\2\.ipynb(#.*)?$")


def lab_link(target: str, lang: str, course: Path) -> str:
    """A chapter's link to a lab (``../labs/student/<lab>/<lab>.ipynb``, or ``labs/source/``), made to point at the
    lab in ``lang`` (``<lab>_<lang>``) when that lab exists; ``course`` is the folder of the English chapter."""
    m = _LAB_LINK.match(target)
    if m:
        translated = f"{m.group(1)}{m.group(2)}_{lang}/{m.group(2)}_{lang}.ipynb"
        if (course / translated).is_file():
            return translated + (m.group(3) or "")
    return target


def relink(source: str, fix: Callable[[str], str]) -> str:
    """Markdown ``source`` with every link target (``](...)``, ``src=``/``href=``) replaced by ``fix(target)``."""
    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return m.group(1) + fix(m.group(2)) + m.group(3)
        return m.group(4) + fix(m.group(5)) + m.group(6)

    return _LINK.sub(sub, source)


def relocate_code(source: str) -> str:
    """String constants naming the course's data folder ("data/..."), seen from course/<lang>/: "../data/..."."""
    try:
        tree = ast.parse(_mask_magics(source))
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    at = _line_offsets(lines)
    inserts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value == "data" or node.value.startswith("data/")):
            start = at[node.lineno - 1] + _char_col(lines[node.lineno - 1], node.col_offset)
            quote = min(i for i in (source.find('"', start), source.find("'", start)) if i >= 0)
            inserts.append(quote + 1)
    for pos in sorted(inserts, reverse=True):
        source = source[:pos] + "../" + source[pos:]
    return source


def translations(catalog: cat.Catalog) -> dict[tuple[str, str], str]:
    """(context, English) -> translation, for the catalog's translated (not fuzzy) entries."""
    return {(m.context, m.id): m.string for m in cat.messages(catalog) if cat.translated(m)}


def translate_cell(cell: nbformat.NotebookNode, units: list[Unit], keyed: list[cat.Entry],
                   done: dict[tuple[str, str], str]) -> tuple[str, int]:
    """The cell's source with each unit translated from ``done``, English where it has no translation; also the
    number of units left in English."""
    texts = [done.get((e.context, e.text), e.text) for e in keyed]
    return apply(cell.source, units, texts), sum((e.context, e.text) not in done for e in keyed)


def build_notebook(english: Path, catalog: cat.Catalog, lang: str, siblings: set[str]
                   ) -> tuple[nbformat.NotebookNode, int]:
    """The ``lang`` notebook for ``english``; also the number of units still in English (untranslated or fuzzy)."""
    nb = read_notebook(english)
    done = translations(catalog)
    missing = 0
    for cell in nb.cells:
        units, keyed = cell_entries(cell)
        source, left = translate_cell(cell, units, keyed, done)
        missing += left
        if cell.cell_type == "markdown":  # a lab in the chapter's language, then every link seen from course/<lang>/
            source = relink(source, lambda target: relocate(lab_link(target, lang, english.parent), siblings))
        elif cell.cell_type == "code":
            if units and code_shape(source) != code_shape(cell.source):
                raise ValueError(f"{english.name}: cell {cell.get('id')}: a translation changed the code's shape")
            source = relocate_code(source)
            cell.outputs = []
            cell.execution_count = None
        cell.source = source
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    setter = nbformat.v4.new_code_cell(f"# {LANG_CELL[lang]}\nimport minialloc.lang\n\n"
                                       f'minialloc.lang.set_lang("{lang}")')
    setter.id = f"set-lang-{lang}"
    nb.cells.insert(first_code, setter)
    meta = nb.metadata.setdefault("minialloc", {})
    meta.update({"lang": lang, "generated_from": f"../{english.name}",
                 "generated_note": "built by python -m course_i18n build: edit the English notebook and the "
                                   f"catalog locale/{lang}/{english.stem}.po, not this file"})
    return nb, missing


def render(nb: nbformat.NotebookNode) -> str:
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def siblings_of(layout: Layout, lang: str) -> set[str]:
    return {p.stem + ".ipynb" for p in sorted((layout.locale / lang).glob("*.po"))}


def build(layout: Layout, langs: Iterable[str] = LANGS) -> list[str]:
    """Write course/<lang>/<stem>.ipynb (labs: labs/source/<lab>_<lang>/<lab>_<lang>.ipynb) for every catalog;
    returns one line per notebook written."""
    lines = []
    for lang in langs:
        for path in sorted((layout.locale / lang).glob("*.po")):
            nb, missing = layout.build_notebook(path.stem, cat.read(path), lang)
            out = layout.built(lang, path.stem)
            text = render(nb)
            if out.exists() and out.read_text(encoding="utf-8") == text:
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            lines.append(f"wrote {out}" + (f" ({missing} units still in English)" if missing else ""))
    return lines


# ---------------------------------------------------------------- check


def structure_problems(kind: str, english: str, translation: str) -> list[str]:
    """What a translation must keep of its English: inline code, link targets, formulas, f-string fields, the
    spaces around a printed string, a table row's columns, one line where the unit is one line."""
    problems = []
    for what, pattern in (("inline code", _CODE_SPAN), ("link targets", _LINK_TARGET), ("formulas", _MATH)):
        a, b = sorted(pattern.findall(english)), sorted(pattern.findall(translation))
        if a != b:
            problems.append(f"{what} differ: English {a}, translation {b}")
    if kind.startswith("code string"):
        if fields(english) != fields(translation):
            problems.append(f"replacement fields differ: English {fields(english)}, translation {fields(translation)}")
        lead = (len(english) - len(english.lstrip()), len(english) - len(english.rstrip()))
        if lead != (len(translation) - len(translation.lstrip()), len(translation) - len(translation.rstrip())):
            problems.append("the spaces at the start or end of the string differ from the English")
    if kind == "markdown table row" and english.count("|") != translation.count("|"):
        problems.append("the table row has another number of columns")
    if kind in _ONE_LINE and "\n" in translation:
        problems.append("a line break in a one-line unit")
    return problems


def check(layout: Layout) -> Report:
    report = Report()
    found = layout.catalogs()
    if not found:
        report.notes.append(f"no catalogs in {layout.locale}: nothing to check")
    glossaries: dict[str, list[glossary.Term]] = {}
    for lang in LANGS:
        gpath = layout.glossary(lang)
        if gpath.exists():
            try:
                glossaries[lang] = glossary.load(gpath)
            except (ValueError, KeyError) as exc:
                report.problems.append(f"{gpath}: {exc}")
    for lang, path in found:
        english = layout.source(path.stem)
        where = str(path)
        if not english.exists():
            report.problems.append(f"{where}: no English notebook {english}")
            continue
        if lang not in glossaries:
            report.problems.append(f"{where}: no glossary {layout.glossary(lang)}")
        try:
            catalog = cat.read(path)
        except Exception as exc:  # a broken PO file is a finding, not a crash of the check
            report.problems.append(f"{where}: unreadable catalog: {exc}")
            continue
        wanted = layout.entries(read_notebook(english))
        have = {(m.context, m.id): m for m in cat.messages(catalog)}
        keys = {(e.context, e.text) for e in wanted}
        for e in wanted:
            if (e.context, e.text) not in have:
                report.problems.append(f"{where}: [{e.context}] not in the catalog (the English changed: run "
                                       f"`python -m course_i18n extract`): {e.text[:60]!r}")
        for context, text in have:
            if (context, text) not in keys:
                report.problems.append(f"{where}: [{context}] no longer in the English notebook (run extract): "
                                       f"{text[:60]!r}")
        seen: set[str] = set()
        for e in wanted:
            m = have.get((e.context, e.text))
            if m is None:
                continue
            label = f"{where}: [{e.context}]"
            if not m.string:
                report.problems.append(f"{label} untranslated: {e.text[:60]!r}")
                continue
            if m.fuzzy:
                report.problems.append(f"{label} fuzzy (the English changed; review, then remove the fuzzy flag): "
                                       f"{e.text[:60]!r}")
                continue
            for problem in structure_problems(e.kind, e.text, m.string):
                report.problems.append(f"{label} {problem}")
            if lang in glossaries:
                for problem in glossary.violations(e.text, m.string, glossaries[lang], seen,
                                                   glossary.waived(list(m.user_comments))):
                    report.problems.append(f"{label} glossary: {problem}")
        out = layout.built(lang, path.stem)
        try:
            nb, _ = layout.build_notebook(path.stem, catalog, lang)
        except (ValueError, SyntaxError) as exc:
            report.problems.append(f"{where}: cannot build: {exc}")
            continue
        if not out.exists():
            report.problems.append(f"{out}: missing (run `python -m course_i18n build`)")
            continue
        if out.read_text(encoding="utf-8") != render(nb):
            report.problems.append(f"{out}: out of date with {path} (run `python -m course_i18n build`)")
        try:
            on_disk = read_notebook(out)
        except Exception as exc:  # noqa: BLE001 - an unreadable notebook is a finding
            report.problems.append(f"{out}: unreadable: {exc}")
            continue
        report.problems += [f"{out}: {p}" for p in layout.grading_problems(path.stem, on_disk)]
    for lang in LANGS:
        for stem, out in layout.built_notebooks(lang):
            if not layout.catalog_path(lang, stem).exists():
                report.problems.append(f"{out}: generated notebook without a catalog "
                                       f"{layout.catalog_path(lang, stem)}")
    if found and not report.problems:
        report.notes.append(f"{len(found)} catalogs checked: complete, glossary kept, notebooks up to date")
    return report
