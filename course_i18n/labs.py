"""The labs in Vietnamese and German: each translated lab is an nbgrader assignment of its own.

``labs/source/<lab>/<lab>.ipynb`` is the English source; ``labs/locale/<lang>/<lab>.po`` holds a language's
translation; the build writes ``labs/source/<lab>_<lang>/<lab>_<lang>.ipynb``, which an instructor releases and
grades like any other lab (``nbgrader generate_assignment lab1_best_fit_vi``), and whose student version
``tools/make_student_labs.py`` writes to ``labs/student/<lab>_<lang>/``.

Only what a student reads as instructions is translated: markdown cells, and the comments and learner-facing
strings (see segments.py) of code cells that nbgrader does not grade. A translated lab keeps, cell for cell, the
English lab's cell ids, types and nbgrader metadata (grade ids, points, locked flags); its test cells
(``grade: true``) are the English ones character for character, and every ``### BEGIN/END SOLUTION`` and
``### BEGIN/END HIDDEN TESTS`` block, markers and contents, is kept as written (a solution's comments are not
translated: students never see them). ``grading_problems`` says where a built lab breaks that, and the build and
the check refuse such a lab. Links to a course chapter point at the chapter in the lab's language when the course
has that translation. The glossary of each language (``course/locale/<lang>/glossary.json``) applies here too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from . import catalog as cat
from .segments import Unit, _char_col, _line_offsets, _mask_magics, cell_units, code_shape
from .tool import LANGS, Layout, cell_entries, read_notebook, relink, translate_cell, translations

_BLOCK = re.compile(r"^[ \t]*### BEGIN (SOLUTION|HIDDEN TESTS)[ \t]*\n.*?^[ \t]*### END \1[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)[ \t]*$", re.M)
_POINTS = re.compile(r"\*\*\d+(?:\.\d+)?\*\*")  # a lab's points in bold: "**12**" (tests/test_labs.py reads them)
_CHAPTER_LINK = re.compile(r"^((?:\.\./)+course/)([^/#?]+)\.ipynb(#.*)?$")


def nbgrader_meta(cell: nbformat.NotebookNode) -> dict:
    return dict(cell.metadata.get("nbgrader", {}))


def lab_units(cell: nbformat.NotebookNode) -> list[Unit]:
    """The units of a lab cell a translator translates: none in a graded cell, none inside a solution or hidden
    test block."""
    if nbgrader_meta(cell).get("grade"):
        return []
    units = cell_units(cell.cell_type, cell.source)
    if cell.cell_type == "code":
        blocks = [(m.start(), m.end()) for m in _BLOCK.finditer(cell.source)]
        units = [u for u in units if not any(start < u.end and u.start < end for start, end in blocks)]
    return units


def _set_lang_literals(source: str) -> list[tuple[int, int, str]]:
    """(start, end, language) of the string literal of every ``set_lang("<language>")`` call in ``source``."""
    try:
        tree = ast.parse(_mask_magics(source))
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    at = _line_offsets(lines)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        arg = node.args[0]
        if name == "set_lang" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            start = at[arg.lineno - 1] + _char_col(lines[arg.lineno - 1], arg.col_offset)
            end = at[arg.end_lineno - 1] + _char_col(lines[arg.end_lineno - 1], arg.end_col_offset)
            found.append((start, end, arg.value))
    return found


def select_language(source: str, lang: str) -> str:
    """``source`` with every ``set_lang("...")`` call of minialloc.lang choosing ``lang``."""
    for start, end, _ in sorted(_set_lang_literals(source), reverse=True):
        source = f'{source[:start]}"{lang}"{source[end:]}'
    return source


def lab_language(nb: nbformat.NotebookNode) -> str | None:
    """The language a lab's ungraded code cells give minialloc (``set_lang``): the last call's, None without one."""
    chosen = None
    for cell in nb.cells:
        if cell.cell_type == "code" and not nbgrader_meta(cell).get("grade"):
            for _, _, lang in _set_lang_literals(cell.source):
                chosen = lang
    return chosen


def lab_entries(nb: nbformat.NotebookNode) -> list[cat.Entry]:
    return [e for cell in nb.cells for e in cell_entries(cell, lab_units(cell))[1]]


def grading_problems(english: nbformat.NotebookNode, built: nbformat.NotebookNode) -> list[str]:
    """Where ``built`` grades differently from ``english``: empty when it keeps every cell's id, type and nbgrader
    metadata, every graded cell's source, every solution and hidden-test block and the shape of every code cell."""
    if [c.get("id") for c in english.cells] != [c.get("id") for c in built.cells]:
        return ["its cells are not the English lab's cells (ids and order)"]
    problems = []
    for a, b in zip(english.cells, built.cells, strict=True):
        label = f"cell {a.get('id')}"
        if a.cell_type != b.cell_type:
            problems.append(f"{label}: cell type {b.cell_type}, English {a.cell_type}")
            continue
        if nbgrader_meta(a) != nbgrader_meta(b):
            problems.append(f"{label}: nbgrader metadata differ from the English lab's")
        if nbgrader_meta(a).get("grade") and a.source != b.source:
            problems.append(f"{label}: a graded cell differs from the English lab's")
            continue
        if [m.group(0) for m in _BLOCK.finditer(a.source)] != [m.group(0) for m in _BLOCK.finditer(b.source)] \
                or [m.group(0) for m in _MARKER.finditer(a.source)] != [m.group(0) for m in _MARKER.finditer(b.source)]:
            problems.append(f"{label}: a solution or hidden-test block differs from the English lab's")
        if a.cell_type == "markdown" and sorted(_POINTS.findall(a.source)) != sorted(_POINTS.findall(b.source)):
            problems.append(f"{label}: the points in bold differ from the English lab's "
                            f"{sorted(_POINTS.findall(a.source))}")
        if a.cell_type == "code":
            try:
                same = code_shape(a.source) == code_shape(b.source)
            except SyntaxError:
                same = a.source == b.source
            if not same:
                problems.append(f"{label}: its code differs from the English lab's (only strings may change)")
    return problems


@dataclass
class LabLayout(Layout):
    """Where the labs' things are: English labs in ``labs/source/<lab>/``, catalogs in ``locale/<lang>/``
    (``labs/locale``), built labs in ``labs/source/<lab>_<lang>/``; the glossaries and the chapters the labs link
    to in ``course`` (``Layout.course``)."""

    labs: Path = Path("labs")

    @classmethod
    def for_labs(cls, labs: Path | None = None, locale: Path | None = None, course: Path | None = None
                 ) -> LabLayout:
        labs = labs or Path("labs")
        return cls(course or Path("course"), locale or labs / "locale", labs)

    @property
    def what(self) -> str:
        return "lab's instructions"

    def source(self, stem: str) -> Path:
        return self.labs / "source" / stem / f"{stem}.ipynb"

    def english(self) -> list[Path]:
        return [p / f"{p.name}.ipynb" for p in sorted((self.labs / "source").iterdir())
                if (p / f"{p.name}.ipynb").is_file() and not p.name.endswith(tuple(f"_{lang}" for lang in LANGS))] \
            if (self.labs / "source").is_dir() else []

    def built(self, lang: str, stem: str) -> Path:
        return self.labs / "source" / f"{stem}_{lang}" / f"{stem}_{lang}.ipynb"

    def built_notebooks(self, lang: str) -> list[tuple[str, Path]]:
        found = []
        for folder in sorted((self.labs / "source").glob(f"*_{lang}")):
            notebook = folder / f"{folder.name}.ipynb"
            if notebook.is_file():
                found.append((folder.name[: -len(lang) - 1], notebook))
        return found

    def entries(self, nb: nbformat.NotebookNode) -> list[cat.Entry]:
        return lab_entries(nb)

    def chapter_link(self, target: str, lang: str) -> str:
        """A link to a course chapter, in ``lang`` where the course has that chapter's catalog."""
        m = _CHAPTER_LINK.match(target)
        if m and (self.course / "locale" / lang / f"{m.group(2)}.po").exists():
            return f"{m.group(1)}{lang}/{m.group(2)}.ipynb{m.group(3) or ''}"
        return target

    def build_notebook(self, stem: str, catalog: cat.Catalog, lang: str) -> tuple[nbformat.NotebookNode, int]:
        english_path = self.source(stem)
        english = read_notebook(english_path)
        nb = read_notebook(english_path)
        done = translations(catalog)
        missing = 0
        for cell in nb.cells:
            units, keyed = cell_entries(cell, lab_units(cell))
            source, left = translate_cell(cell, units, keyed, done)
            missing += left
            if cell.cell_type == "markdown":
                source = relink(source, lambda target: self.chapter_link(target, lang))
            elif not nbgrader_meta(cell).get("grade"):
                source = select_language(source, lang)
            cell.source = source
        problems = grading_problems(english, nb)
        if problems:
            raise ValueError(f"{english_path.name}: the {lang} lab would grade differently: " + "; ".join(problems))
        meta = nb.metadata.setdefault("minialloc", {})
        meta.update({"lang": lang, "generated_from": f"../{stem}/{english_path.name}",
                     "generated_note": "built by python -m course_i18n build: edit the English lab and the catalog "
                                       f"labs/locale/{lang}/{stem}.po, not this file"})
        return nb, missing

    def grading_problems(self, stem: str, built: nbformat.NotebookNode) -> list[str]:
        return grading_problems(read_notebook(self.source(stem)), built)
