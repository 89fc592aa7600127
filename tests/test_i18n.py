"""The course's translation machinery (course_i18n): extract, build and check on a small synthetic course, on the
real chapters' cells, and the check on the real repository (which CI runs here)."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_i18n import catalog as cat
from course_i18n.segments import apply, cell_units, code_shape
from course_i18n.tool import Layout, build, check, extract

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "course").glob("[0-9][0-9]_*.ipynb"))

INTRO = """# 1. Segments

A caching allocator cuts each **segment** into blocks. It
keeps freed blocks for the next request (see [chapter 2](02_more.ipynb) and [the data](data/readme.md)).

- a `malloc` takes a block;
- a free block stays cached.

```python
alloc.malloc(3 * MiB)   # code in prose is not translated
```

| size | pool |
|---|---|
| small | 2 MiB segments |
"""
CODE = '''x = 3
# The segment below holds three blocks; one request arrives
# on stream 0.
print(f"segment of {x} blocks", "on stream", x)   # what the learner reads
path = "data/readme.md"
label = "kept as code"
shown = "a marked label"  # i18n
quiet = "stays English"  # i18n: off


def blocks(n: int) -> int:
    """How many blocks a segment of n MiB holds."""
    raise NotImplementedError  # your code here
'''
VI = {
    "1. Segments": "1. Phân đoạn (segment)",
    "A caching allocator cuts each **segment** into blocks. It keeps freed blocks for the next request (see "
    "[chapter 2](02_more.ipynb) and [the data](data/readme.md)).":
        "Bộ cấp phát bộ nhớ đệm cắt mỗi **phân đoạn** thành các khối và giữ lại các khối đã giải phóng cho yêu cầu "
        "tiếp theo (xem [chương 2](02_more.ipynb) và [dữ liệu](data/readme.md)).",
    "a `malloc` takes a block;": "một lần `malloc` lấy một khối;",
    "a free block stays cached.": "một khối trống vẫn nằm trong bộ nhớ đệm.",
    "| size | pool |": "| kích thước | nhóm (pool) |",
    "| small | 2 MiB segments |": "| nhỏ | phân đoạn 2 MiB |",
    "The segment below holds three blocks; one request arrives on stream 0.":
        "Phân đoạn dưới đây chứa ba khối; một yêu cầu đến trên luồng CUDA (CUDA stream) 0.",
    "segment of {x} blocks": "phân đoạn gồm {x} khối",
    "on stream": "trên luồng CUDA",
    "what the learner reads": "điều người học đọc",
    "a marked label": "một nhãn được đánh dấu",
    "How many blocks a segment of n MiB holds.": "Một phân đoạn n MiB chứa bao nhiêu khối.",
    "your code here": "viết mã của bạn ở đây",
}
GLOSSARY = {
    "format": "minialloc-glossary", "version": 1, "lang": "vi",
    "terms": [
        {"term": "segment", "en": "segments?", "use": ["phân đoạn"], "first": [r"phân đoạn \(segments?\)"]},
        {"term": "stream", "en": "streams?", "use": ["luồng CUDA"], "first": [r"luồng CUDA \(CUDA stream\)"],
         "avoid": ["luồng(?! CUDA)"]},
        {"term": "block", "en": "blocks?", "use": ["khối"]},
        {"term": "pool", "en": "pools?", "use": ["nhóm"]},
    ],
}


def _notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture
def course(tmp_path: Path) -> Layout:
    root = tmp_path / "course"
    root.mkdir()
    intro = nbformat.v4.new_markdown_cell(INTRO)
    intro.id = "intro"
    code = nbformat.v4.new_code_cell(CODE)
    code.id = "work"
    code.metadata = {"tags": ["exercise"], "minialloc": {"id": "c1-blocks"}}
    code.outputs = [nbformat.v4.new_output("stream", text="old output\n")]
    code.execution_count = 3
    nbformat.write(_notebook([intro, code]), root / "01_demo.ipynb")
    nbformat.write(_notebook([nbformat.v4.new_markdown_cell("# More")]), root / "02_more.ipynb")
    (root / "data").mkdir()
    (root / "locale" / "vi").mkdir(parents=True)
    (root / "locale" / "vi" / "glossary.json").write_text(json.dumps(GLOSSARY), encoding="utf-8")
    return Layout.default(root)


def _translate(layout: Layout, table: dict[str, str], stem: str = "01_demo") -> None:
    path = layout.catalog_path("vi", stem)
    catalog = cat.read(path)
    for m in cat.messages(catalog):
        if m.id in table:
            m.string = table[m.id]
            m.flags.discard("fuzzy")
    cat.write(path, catalog)


def _problems(layout: Layout) -> list[str]:
    return check(layout).problems


def _edit_english(layout: Layout, cell_id: str, old: str, new: str) -> None:
    path = layout.course / "01_demo.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.id == cell_id)
    assert old in cell.source
    cell.source = cell.source.replace(old, new)
    nbformat.write(nb, path)


def test_no_catalog_means_nothing_to_check(course: Layout):
    report = check(course)
    assert report.problems == []
    assert any("nothing to check" in note for note in report.notes)


def test_extract_keys_every_unit_by_cell(course: Layout):
    written = extract(course, ["01_demo"], ["vi"])
    assert written == [course.catalog_path("vi", "01_demo")]
    messages = cat.messages(cat.read(written[0]))
    keys = [(m.context, m.id) for m in messages]
    assert ("intro:1", "1. Segments") in keys
    assert ("intro:2", next(k for k in VI if k.startswith("A caching allocator"))) in keys  # lines joined
    ids = {m.id for m in messages}
    assert "alloc.malloc(3 * MiB)" not in " ".join(ids)  # fenced code stays out
    assert "code in prose is not translated" not in ids
    assert "kept as code" not in ids and "stays English" not in ids and "data/readme.md" not in ids
    assert {"segment of {x} blocks", "on stream", "a marked label", "your code here",
            "How many blocks a segment of n MiB holds."} <= ids
    assert all(cat.cell_of(m.context) in {"intro", "work"} for m in messages)
    assert set(ids) == set(VI)  # the synthetic translation covers exactly what was extracted
    assert not any(m.string or m.fuzzy for m in messages)
    before = written[0].read_bytes()
    assert extract(course, ["01_demo"], ["vi"]) == [] and written[0].read_bytes() == before  # idempotent
    problems = _problems(course)
    assert sum("untranslated" in p for p in problems) == len(VI)
    assert any("missing (run `python -m course_i18n build`)" in p for p in problems)


def test_round_trip_translate_build_check(course: Layout):
    extract(course, ["01_demo"], ["vi"])
    _translate(course, VI)
    assert build(course, ["vi"])
    assert _problems(course) == []
    assert build(course, ["vi"]) == []  # nothing changed, nothing written

    english = nbformat.read(course.course / "01_demo.ipynb", as_version=4)
    built = nbformat.read(course.built("vi", "01_demo"), as_version=4)
    assert built.metadata["minialloc"]["lang"] == "vi"
    assert [c.id for c in built.cells] == ["intro", "set-lang-vi", "work"]
    assert 'set_lang("vi")' in built.cells[1].source
    intro, work = built.cells[0], built.cells[2]
    assert work.metadata == english.cells[1].metadata  # tags and the exercise id kept
    assert work.outputs == [] and work.execution_count is None
    assert intro.source.startswith("# 1. Phân đoạn (segment)\n")
    assert "](02_more.ipynb)" not in intro.source  # 02 has no vi catalog: the English chapter, one folder up
    assert "](../02_more.ipynb)" in intro.source and "](../data/readme.md)" in intro.source
    assert "```python\nalloc.malloc(3 * MiB)   # code in prose is not translated\n```" in intro.source
    assert "|---|---|" in intro.source and "- một lần `malloc` lấy một khối;" in intro.source
    assert code_shape(work.source) == code_shape(english.cells[1].source)
    assert '"../data/readme.md"' in work.source and '"stays English"' in work.source
    assert "raise NotImplementedError  # viết mã của bạn ở đây" in work.source

    out = io.StringIO()
    scope: dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        exec(compile(work.source, "work", "exec"), scope)  # the translated cell runs
    assert out.getvalue() == "phân đoạn gồm 3 khối trên luồng CUDA 3\n"
    assert ast.get_docstring(ast.parse(work.source).body[-1]) == "Một phân đoạn n MiB chứa bao nhiêu khối."

    result = subprocess.run([sys.executable, "-m", "course_i18n", "--course", str(course.course), "check"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_sibling_links_stay_when_the_sibling_is_translated(course: Layout):
    extract(course, ["01_demo", "02_more"], ["vi"])
    _translate(course, VI)
    _translate(course, {"More": "Thêm"}, "02_more")
    build(course, ["vi"])
    intro = nbformat.read(course.built("vi", "01_demo"), as_version=4).cells[0].source
    assert "](02_more.ipynb)" in intro and "](../data/readme.md)" in intro
    assert _problems(course) == []


def test_changed_english_becomes_fuzzy_and_fails_the_check(course: Layout):
    extract(course, ["01_demo"], ["vi"])
    _translate(course, VI)
    build(course, ["vi"])
    _edit_english(course, "intro", "a free block stays cached.", "a free block stays in the cache.")
    problems = _problems(course)
    assert any("not in the catalog" in p and "stays in the cache" in p for p in problems)  # extract not run yet
    extract(course)  # no stems: every notebook with a catalog
    catalog = cat.read(course.catalog_path("vi", "01_demo"))
    changed = next(m for m in cat.messages(catalog) if m.id == "a free block stays in the cache.")
    assert changed.fuzzy and changed.string == VI["a free block stays cached."]
    assert changed.previous_id == ["a free block stays cached."]
    others = [m for m in cat.messages(catalog) if m is not changed]
    assert all(m.string and not m.fuzzy for m in others)  # nothing else lost its translation
    problems = _problems(course)
    assert any("fuzzy" in p and "stays in the cache" in p for p in problems)
    build(course, ["vi"])  # a fuzzy entry is built in English
    built = nbformat.read(course.built("vi", "01_demo"), as_version=4)
    assert "a free block stays in the cache." in built.cells[0].source


def test_inserted_and_removed_units_keep_the_others(course: Layout):
    extract(course, ["01_demo"], ["vi"])
    _translate(course, VI)
    _edit_english(course, "intro", "# 1. Segments\n\n", "# 1. Segments\n\nA new first paragraph.\n\n")
    _edit_english(course, "work", "label = \"kept as code\"\nshown = \"a marked label\"  # i18n\n", "")
    extract(course)
    catalog = cat.read(course.catalog_path("vi", "01_demo"))
    by_id = {m.id: m for m in cat.messages(catalog)}
    assert by_id["A new first paragraph."].string == "" and not by_id["A new first paragraph."].fuzzy
    shifted = by_id["a `malloc` takes a block;"]
    assert shifted.context == "intro:4" and shifted.string and not shifted.fuzzy  # moved one place: still valid
    assert "a marked label" not in by_id
    assert any(m.id == "a marked label" for m in catalog.obsolete.values())
    problems = _problems(course)
    assert [p for p in problems if "untranslated" in p] == [p for p in problems if "A new first paragraph" in p
                                                            and "untranslated" in p]


def test_glossary_violations_fail_the_check(course: Layout):
    extract(course, ["01_demo"], ["vi"])
    bad = dict(VI)
    bad["on stream"] = "trên luồng"  # "luồng" alone reads as a CPU thread
    _translate(course, bad)
    build(course, ["vi"])
    problems = _problems(course)
    assert any("glossary" in p and "'stream'" in p and "rules out" in p for p in problems)

    bad = dict(VI)
    bad["1. Segments"] = "1. Phân đoạn"  # the first use must show the English term
    _translate(course, bad)
    build(course, ["vi"])
    problems = _problems(course)
    assert any("glossary" in p and "'segment'" in p and "first use" in p for p in problems)
    assert not any("'stream'" in p for p in problems)


def test_a_translator_can_waive_a_term_for_one_entry(course: Layout):
    extract(course, ["01_demo"], ["vi"])
    bad = dict(VI)
    bad["a free block stays cached."] = "một mảnh trống vẫn nằm trong bộ nhớ đệm."
    _translate(course, bad)
    build(course, ["vi"])
    assert any("'block'" in p for p in _problems(course))
    path = course.catalog_path("vi", "01_demo")
    catalog = cat.read(path)
    next(m for m in cat.messages(catalog) if m.id == "a free block stays cached.").user_comments.append(
        "glossary-ok: block")
    cat.write(path, catalog)
    assert _problems(course) == []
    extract(course, ["01_demo"], ["vi"])  # an English change elsewhere: the waiver travels with its translation
    assert _problems(course) == []


def test_untranslated_structure_stale_and_orphan_fail_the_check(course: Layout):
    extract(course, ["01_demo"], ["vi"])
    partial = {k: v for k, v in VI.items() if k != "on stream"}
    _translate(course, partial)
    build(course, ["vi"])
    assert [p for p in _problems(course) if "untranslated" in p] == [
        p for p in _problems(course) if "'on stream'" in p]

    broken = dict(VI)
    broken["a `malloc` takes a block;"] = "một lần malloc lấy một khối;"  # the inline code was lost
    broken["segment of {x} blocks"] = "phân đoạn gồm {y} khối"  # a field that does not exist
    _translate(course, broken)
    build(course, ["vi"])
    problems = _problems(course)
    assert any("inline code differ" in p for p in problems)
    assert any("replacement fields differ" in p for p in problems)

    _translate(course, VI)
    assert any("out of date" in p for p in _problems(course))  # catalog changed, notebook not rebuilt
    build(course, ["vi"])
    assert _problems(course) == []
    shutil.copy(course.built("vi", "01_demo"), course.course / "vi" / "03_orphan.ipynb")
    assert any("without a catalog" in p for p in _problems(course))
    result = subprocess.run([sys.executable, "-m", "course_i18n", "--course", str(course.course), "check"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 1 and "03_orphan.ipynb" in result.stdout


def test_long_translations_keep_the_code_shape():
    units = cell_units("code", CODE)
    assert any(u.kind == "code string (# i18n)" for u in units)  # a string outside any bracket is among them
    long = [u.text + " with many more words in it" * 8 for u in units]
    translated = apply(CODE, units, long)
    assert code_shape(translated) == code_shape(CODE), translated
    assert translated.count("\n") > CODE.count("\n") + 8  # the long texts were spread over several lines


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_every_chapter_cell_survives_a_translation(path: Path):
    """Any translation (here: every unit three times longer, with quotes and braces in it) gives code of the
    English shape, so the translated chapters run the same code."""
    nb = nbformat.read(path, as_version=4)
    units_seen = 0
    for cell in nb.cells:
        units = cell_units(cell.cell_type, cell.source)
        units_seen += len(units)
        if cell.cell_type != "code" or not units:
            continue
        long = [u.text + " \"it's\" {{x}} and more words" * 3 if u.kind.startswith("code string")
                else u.text + " more words" * 12 for u in units]
        translated = apply(cell.source, units, long)
        assert code_shape(translated) == code_shape(cell.source), (cell.id, translated)
    assert units_seen > 10


def test_the_real_course_passes_the_check():
    """What CI runs: every catalog in course/locale complete, kept to its glossary, its notebook up to date.
    With no catalog yet it checks nothing and says so (the failing paths are the synthetic tests above)."""
    layout = Layout.default(ROOT / "course")
    report = check(layout)
    assert report.problems == [], "\n".join(report.problems)
    assert report.notes and (("nothing to check" in report.notes[0]) == (not layout.catalogs()))


def test_glossaries_cover_the_same_terms():
    terms = {}
    for code in ("vi", "de"):
        data = json.loads((ROOT / "course" / "locale" / code / "glossary.json").read_text(encoding="utf-8"))
        terms[code] = {t["term"] for t in data["terms"]}
    assert terms["vi"] == terms["de"]
    for needed in ("segment", "block", "pool", "stream", "page", "fragmentation", "reserved", "allocated", "cache",
                   "caching allocator", "expandable segments", "block table", "KV cache", "prefill", "decode"):
        assert needed in terms["vi"], needed


# ---------------------------------------------------------------- the labs: one nbgrader assignment per language

LAB_INTRO = """# Lab 9: counting blocks

In [Chapter 1](../../../course/01_demo.ipynb) you met the allocator. Here you count blocks.

| task | what you write | points |
|---|---|---|
| 1 | `count` | **3** |
"""
LAB_ROW = "| 1 | `count` | **3** |"
LAB_SETUP = "K = 512  # every request is rounded up to a multiple of this\n"
LAB_ANSWER = '''def count(n: int) -> int:
    """How many blocks n requests take."""
    ### BEGIN SOLUTION
    # the solution's own comment: students never see it
    return n + 1
    ### END SOLUTION
'''
LAB_TESTS = '''# visible tests
assert count(1) == 2
### BEGIN HIDDEN TESTS
assert count(2) == 3  # a hidden check
### END HIDDEN TESTS
'''
LAB_SHOW = 'print("blocks taken:", count(3))\n'
LAB_VI = {
    "Lab 9: counting blocks": "Bài thực hành 9: đếm khối",
    "In [Chapter 1](../../../course/01_demo.ipynb) you met the allocator. Here you count blocks.":
        "Trong [Chương 1](../../../course/01_demo.ipynb) bạn đã gặp bộ cấp phát. Ở đây bạn đếm các khối.",
    "| task | what you write | points |": "| bài | bạn viết gì | điểm |",
    "every request is rounded up to a multiple of this": "mọi yêu cầu được làm tròn lên bội số của số này",
    "How many blocks n requests take.": "n yêu cầu chiếm bao nhiêu khối.",
    "blocks taken:": "số khối đã dùng:",
}


def _nbgrader(cell: nbformat.NotebookNode, grade_id: str, *, grade: bool = False, solution: bool = False,
              locked: bool = False, points: int | None = None) -> nbformat.NotebookNode:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    cell.metadata["nbgrader"] = meta
    cell.id = grade_id
    return cell


@pytest.fixture
def labs(course: Layout):
    from course_i18n.labs import LabLayout

    root = course.course.parent / "labs"
    intro = nbformat.v4.new_markdown_cell(LAB_INTRO)
    intro.id = "md-01"
    show = nbformat.v4.new_code_cell(LAB_SHOW)
    show.id = "show"
    cells = [intro, _nbgrader(nbformat.v4.new_code_cell(LAB_SETUP), "setup", locked=True),
             _nbgrader(nbformat.v4.new_code_cell(LAB_ANSWER), "task1_count", solution=True),
             _nbgrader(nbformat.v4.new_code_cell(LAB_TESTS), "task1_count_tests", grade=True, locked=True, points=3),
             show]
    (root / "source" / "lab9_count").mkdir(parents=True)
    nbformat.write(_notebook(cells), root / "source" / "lab9_count" / "lab9_count.ipynb")
    return LabLayout.for_labs(root, None, course.course)


def _translate_lab(layout, table: dict[str, str]) -> None:
    _translate(layout, table, "lab9_count")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "course_i18n", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_no_lab_catalog_means_nothing_to_check(labs):
    report = check(labs)
    assert report.problems == [] and any("nothing to check" in note for note in report.notes)


def test_lab_extract_leaves_grading_out(labs):
    written = extract(labs, ["lab9_count"], ["vi"])
    assert written == [labs.locale / "vi" / "lab9_count.po"]
    assert "lab's instructions" in written[0].read_text(encoding="utf-8")
    ids = {m.id for m in cat.messages(cat.read(written[0]))}
    assert ids == set(LAB_VI) | {LAB_ROW}
    # neither a test cell's comments nor the solution's, nor a marker, are the translator's
    text = written[0].read_text(encoding="utf-8")
    assert "visible tests" not in text and "hidden check" not in text and "solution's own comment" not in text
    assert "BEGIN" not in text


def test_lab_round_trip_translate_build_grade_check(labs, course: Layout):
    extract(course, ["01_demo"], ["vi"])  # the chapter the lab links to has a Vietnamese version
    _translate(course, VI)
    build(course, ["vi"])
    extract(labs, ["lab9_count"], ["vi"])
    _translate_lab(labs, {**LAB_VI, LAB_ROW: LAB_ROW})
    assert check(labs).problems and any("missing" in p for p in check(labs).problems)
    assert build(labs, ["vi"]) == [f"wrote {labs.built('vi', 'lab9_count')}"]
    assert build(labs, ["vi"]) == []
    assert check(labs).problems == []

    english = nbformat.read(labs.source("lab9_count"), as_version=4)
    built = nbformat.read(labs.built("vi", "lab9_count"), as_version=4)
    assert labs.built("vi", "lab9_count") == labs.labs / "source" / "lab9_count_vi" / "lab9_count_vi.ipynb"
    assert built.metadata["minialloc"]["lang"] == "vi"
    assert [c.id for c in built.cells] == [c.id for c in english.cells]
    for a, b in zip(english.cells, built.cells, strict=True):
        assert a.metadata.get("nbgrader") == b.metadata.get("nbgrader")
        if a.metadata.get("nbgrader", {}).get("grade"):
            assert a.source == b.source  # the test cells, hidden tests and their comments included
        if a.cell_type == "code":
            assert code_shape(a.source) == code_shape(b.source)
            assert [line for line in a.source.splitlines() if "###" in line or "return" in line] == \
                   [line for line in b.source.splitlines() if "###" in line or "return" in line]
    assert "](../../../course/vi/01_demo.ipynb)" in built.cells[0].source  # the chapter in the lab's language
    assert "**3**" in built.cells[0].source
    assert '"""n yêu cầu chiếm bao nhiêu khối."""' in built.cells[2].source
    assert "# the solution's own comment" in built.cells[2].source
    assert built.cells[4].source == 'print("số khối đã dùng:", count(3))\n'

    # nbgrader releases the translated lab like any other assignment
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    config.CourseDirectory.root = str(labs.labs)
    config.CourseDirectory.db_url = f"sqlite:///{labs.labs / 'gradebook.db'}"
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), saved])
    try:
        result = NbGraderAPI(config=config).generate_assignment("lab9_count_vi")
    finally:
        os.environ["PATH"] = saved
    assert result["success"], result.get("log")
    release = nbformat.read(labs.labs / "release" / "lab9_count_vi" / "lab9_count_vi.ipynb", as_version=4)
    text = "\n".join(c.source for c in release.cells)
    assert "BEGIN" not in text and "return n + 1" not in text and "count(2) == 3" not in text
    assert "n yêu cầu chiếm bao nhiêu khối." in text and "raise NotImplementedError()" in text
    assert [c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells] == \
           [c.metadata.get("nbgrader", {}).get("grade_id") for c in english.cells]

    proc = _cli("--course", str(course.course), "--labs", str(labs.labs), "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 catalogs checked" not in proc.stdout and proc.stdout.count("catalogs checked") == 2


def test_lab_changed_english_goes_fuzzy_and_fails_the_check(labs):
    extract(labs, ["lab9_count"], ["vi"])
    _translate_lab(labs, {**LAB_VI, LAB_ROW: LAB_ROW})
    build(labs, ["vi"])
    assert check(labs).problems == []
    path = labs.source("lab9_count")
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = nb.cells[0].source.replace("Here you count blocks.", "Here you count the blocks.")
    nbformat.write(nb, path)
    assert any("not in the catalog" in p for p in check(labs).problems)
    proc = _cli("--labs", str(labs.labs), "--only", "labs", "extract")
    assert proc.returncode == 0 and "lab9_count.po" in proc.stdout, proc.stdout + proc.stderr
    changed = next(m for m in cat.messages(cat.read(labs.catalog_path("vi", "lab9_count")))
                   if "count the blocks" in m.id)
    assert changed.fuzzy and changed.string
    problems = check(labs).problems
    assert any("[md-01:2] fuzzy" in p for p in problems)
    assert any("out of date" in p for p in problems)
    proc = _cli("--labs", str(labs.labs), "--only", "labs", "check")
    assert proc.returncode == 1 and "fuzzy" in proc.stdout


def test_a_lab_that_would_grade_differently_fails(labs):
    extract(labs, ["lab9_count"], ["vi"])
    _translate_lab(labs, {**LAB_VI, LAB_ROW: "| 1 | `count` | ba điểm |"})  # the points in bold are gone
    assert any("cannot build" in p and "points in bold" in p for p in check(labs).problems)
    with pytest.raises(ValueError, match="would grade differently"):
        build(labs, ["vi"])
    _translate_lab(labs, {**LAB_VI, LAB_ROW: LAB_ROW})
    build(labs, ["vi"])
    out = labs.built("vi", "lab9_count")
    nb = nbformat.read(out, as_version=4)
    nb.cells[3].source = nb.cells[3].source.replace("# visible tests", "# kiểm tra")  # a test cell edited by hand
    nb.cells[3].metadata["nbgrader"]["points"] = 30
    nbformat.write(nb, out)
    problems = check(labs).problems
    assert any("a graded cell differs" in p for p in problems) and any("nbgrader metadata" in p for p in problems)
    shutil.copytree(out.parent, labs.labs / "source" / "lab8_gone_vi")
    (labs.labs / "source" / "lab8_gone_vi" / "lab9_count_vi.ipynb").rename(
        labs.labs / "source" / "lab8_gone_vi" / "lab8_gone_vi.ipynb")
    assert any("lab8_gone_vi.ipynb: generated notebook without a catalog" in p for p in check(labs).problems)


def test_glossary_applies_to_the_labs(labs):
    extract(labs, ["lab9_count"], ["vi"])
    bad = {**LAB_VI, LAB_ROW: LAB_ROW, "How many blocks n requests take.": "n yêu cầu chiếm bao nhiêu."}
    _translate_lab(labs, bad)
    build(labs, ["vi"])
    assert any("glossary" in p and "'block'" in p for p in check(labs).problems)


@pytest.mark.parametrize("lab", sorted(p.name for p in (ROOT / "labs" / "source").iterdir()
                                       if (p / f"{p.name}.ipynb").is_file() and not p.name.endswith(("_vi", "_de"))))
def test_every_lab_survives_a_translation(lab: str, tmp_path: Path):
    """Any translation of a real lab (every unit longer, with quotes and braces) builds a lab that grades as the
    English one: same cells, nbgrader metadata, test cells, solution and hidden-test blocks and code."""
    from course_i18n.labs import LabLayout, grading_problems

    shutil.copytree(ROOT / "labs" / "source" / lab, tmp_path / "labs" / "source" / lab)
    layout = LabLayout.for_labs(tmp_path / "labs", None, ROOT / "course")
    extract(layout, [lab], ["de"])
    path = layout.catalog_path("de", lab)
    catalog = cat.read(path)
    assert len(cat.messages(catalog)) > 10
    for m in cat.messages(catalog):
        m.string = m.id + (" \"it's\" {{x}} and more words" * 3 if "string" in m.auto_comments[0]
                           else " noch mehr Wörter" * 10)
    cat.write(path, catalog)
    build(layout, ["de"])
    english = nbformat.read(layout.source(lab), as_version=4)
    built = nbformat.read(layout.built("de", lab), as_version=4)
    assert grading_problems(english, built) == []
    assert built.cells[0].source != english.cells[0].source


def test_the_real_labs_pass_the_check():
    """What CI runs for the labs: every catalog in labs/locale complete, kept to its glossary, its lab built and
    grading as the English one. With no catalog yet it checks nothing and says so."""
    from course_i18n.labs import LabLayout

    layout = LabLayout.for_labs(ROOT / "labs", None, ROOT / "course")
    report = check(layout)
    assert report.problems == [], "\n".join(report.problems)
    assert report.notes and (("nothing to check" in report.notes[0]) == (not layout.catalogs()))
    drafts = LabLayout.for_labs(ROOT / "labs", ROOT / "labs" / "locale-work", ROOT / "course")
    for code in ("vi", "de"):  # every lab has a catalog, finished or a draft (which the check ignores)
        have = {p.stem for folder in (drafts.locale, layout.locale) for p in (folder / code).glob("*.po")}
        assert have >= {p.stem for p in layout.english()}, code


LAB_MESSAGES_SETUP = '''import minialloc.lang

# the lab's language
minialloc.lang.set_lang("en")
MESSAGES: dict[str, str] = {
    "too_few": "only {n} blocks: one more",
}
'''
LAB_MESSAGES_TESTS = '''assert count(1) == 2, MESSAGES["too_few"].format(n=count(1))
### BEGIN HIDDEN TESTS
assert count(2) == 3
### END HIDDEN TESTS
'''


def test_a_labs_message_table_is_translated_and_its_language_selected(course: Layout):
    """A lab's graded cells say MESSAGES["key"]: the table's values (not its keys) are units of the setup cell,
    the build puts their translation there and makes the setup's set_lang("en") choose the lab's language, and the
    graded cell stays the English one byte for byte."""
    from course_i18n.labs import LabLayout, grading_problems, lab_language

    root = course.course.parent / "labs"
    cells = [_nbgrader(nbformat.v4.new_code_cell(LAB_MESSAGES_SETUP), "setup", locked=True),
             _nbgrader(nbformat.v4.new_code_cell(LAB_ANSWER), "task1_count", solution=True),
             _nbgrader(nbformat.v4.new_code_cell(LAB_MESSAGES_TESTS), "task1_count_tests", grade=True, locked=True,
                       points=3)]
    (root / "source" / "lab8_messages").mkdir(parents=True)
    nbformat.write(_notebook(cells), root / "source" / "lab8_messages" / "lab8_messages.ipynb")
    layout = LabLayout.for_labs(root, None, course.course)
    extract(layout, ["lab8_messages"], ["vi"])
    kinds = {m.id: m.auto_comments for m in cat.messages(cat.read(layout.catalog_path("vi", "lab8_messages")))}
    assert kinds["only {n} blocks: one more"] == ["code string (MESSAGES)"]
    assert "too_few" not in kinds and "en" not in kinds  # keys and the language code are code, not text
    _translate(layout, {"only {n} blocks: one more": "chỉ có {n} khối: thiếu một", "the lab's language": "ngôn ngữ"},
               "lab8_messages")
    assert build(layout, ["vi"])
    english = nbformat.read(layout.source("lab8_messages"), as_version=4)
    built = nbformat.read(layout.built("vi", "lab8_messages"), as_version=4)
    assert grading_problems(english, built) == []
    assert built.cells[2].source == english.cells[2].source
    assert '"too_few": "chỉ có {n} khối: thiếu một",' in built.cells[0].source
    assert 'minialloc.lang.set_lang("vi")' in built.cells[0].source
    assert (lab_language(english), lab_language(built)) == ("en", "vi")
    namespace: dict = {}
    exec(built.cells[0].source.replace("minialloc.lang.set_lang", "print"), namespace)
    assert namespace["MESSAGES"]["too_few"].format(n=1) == "chỉ có 1 khối: thiếu một"
    # a translation that drops a field is refused by the check
    _translate(layout, {"only {n} blocks: one more": "thiếu một khối"}, "lab8_messages")
    assert any("replacement fields differ" in p for p in check(layout).problems)


def test_a_chapters_lab_link_points_at_the_lab_in_its_language(tmp_path: Path):
    from course_i18n.tool import lab_link

    course = tmp_path / "course"
    course.mkdir()
    for folder in ("lab9_count", "lab9_count_vi"):
        (tmp_path / "labs" / "student" / folder).mkdir(parents=True)
        (tmp_path / "labs" / "student" / folder / f"{folder}.ipynb").write_text("{}", encoding="utf-8")
    link = "../labs/student/lab9_count/lab9_count.ipynb"
    assert lab_link(link, "vi", course) == "../labs/student/lab9_count_vi/lab9_count_vi.ipynb"
    assert lab_link(link + "#task-1", "vi", course) == "../labs/student/lab9_count_vi/lab9_count_vi.ipynb#task-1"
    assert lab_link(link, "de", course) == link  # no German lab: the English one
    assert lab_link("02_more.ipynb", "vi", course) == "02_more.ipynb"


def test_the_translated_chapters_link_their_own_labs():
    """Every link from a translated chapter to a lab opens the lab in the chapter's language, and the file is there."""
    for lang in ("vi", "de"):
        links = []
        for path in sorted((ROOT / "course" / lang).glob("*.ipynb")):
            for cell in nbformat.read(path, as_version=4).cells:
                if cell.cell_type == "markdown":
                    links += [(path, t) for t in re.findall(r"\]\(([^)\s]+)", cell.source) if "labs/" in t]
        assert links, lang
        for path, target in links:
            assert f"_{lang}/" in target and (path.parent / target.split("#")[0]).is_file(), (path.name, target)


# --- A lab's MESSAGES table: what its visible tests say, translated in the locked setup cell -------------------------

def _lab_messages(path: Path) -> dict[str, str]:
    """The MESSAGES table of a lab's setup cell ({} when the lab has none)."""
    nb = nbformat.read(path, as_version=4)
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    for node in ast.parse(setup.source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "MESSAGES":
            return ast.literal_eval(node.value)
    return {}


# the labs whose translation is finished (a catalog in labs/locale/, so a built lab per language); a lab written
# English-first has its catalogs in labs/locale-work/ and no translated lab yet, which the check allows
LABS_WITH_MESSAGES = sorted(p.name for p in (ROOT / "labs" / "source").iterdir()
                            if not p.name.endswith(("_vi", "_de")) and (p / f"{p.name}.ipynb").is_file()
                            and _lab_messages(p / f"{p.name}.ipynb")
                            and all((ROOT / "labs" / "locale" / lang / f"{p.name}.po").is_file()
                                    for lang in ("vi", "de")))


def test_lab_3_has_a_messages_table():
    assert "lab3_page_mapping" in LABS_WITH_MESSAGES


@pytest.mark.parametrize("lab", LABS_WITH_MESSAGES)
def test_a_labs_messages_are_units_and_their_keys_are_not(lab: str):
    """Each message of the MESSAGES table is one unit for the translator; no key is."""
    from course_i18n.labs import lab_units

    english = _lab_messages(ROOT / "labs" / "source" / lab / f"{lab}.ipynb")
    nb = nbformat.read(ROOT / "labs" / "source" / lab / f"{lab}.ipynb", as_version=4)
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    texts = {u.text for u in lab_units(setup)}
    assert set(english.values()) <= texts, set(english.values()) - texts
    assert not set(english) & texts


@pytest.mark.parametrize("lang", ["vi", "de"])
@pytest.mark.parametrize("lab", LABS_WITH_MESSAGES)
def test_a_labs_messages_are_translated_with_their_fields(lab: str, lang: str):
    import re

    english = _lab_messages(ROOT / "labs" / "source" / lab / f"{lab}.ipynb")
    built = _lab_messages(ROOT / "labs" / "source" / f"{lab}_{lang}" / f"{lab}_{lang}.ipynb")
    assert built.keys() == english.keys()
    for key, text in english.items():
        prose = re.findall(r"\b[a-z]{3,}\b", re.sub(r"\{\w*\}|\w*_\w*", " ", text))  # not fields, not code names
        assert built[key] != text or not prose, (lang, key, "not translated")
        fields = sorted(re.findall(r"\{(\w*)\}", text))
        assert sorted(re.findall(r"\{(\w*)\}", built[key])) == fields, (lang, key, built[key])


@pytest.mark.parametrize("lab", LABS_WITH_MESSAGES)
def test_the_translated_labs_speak_their_language_to_minialloc(lab: str):
    """Each translated lab's setup cell sets minialloc's language to the lab's, as a translated chapter does, and
    every MESSAGES key a graded cell reads is in the table, with no English sentence left in it (the English table
has some: the scan finds them)."""
    from course_i18n.english_scan import english_sentences
    from course_i18n.labs import lab_language

    for lang in ("", "_vi", "_de"):
        nb = nbformat.read(ROOT / "labs" / "source" / f"{lab}{lang}" / f"{lab}{lang}.ipynb", as_version=4)
        assert lab_language(nb) == (lang[1:] or "en"), f"{lab}{lang}"
        table = _lab_messages(ROOT / "labs" / "source" / f"{lab}{lang}" / f"{lab}{lang}.ipynb")
        used = {key for c in nb.cells if c.cell_type == "code" for key in re.findall(r'MESSAGES\["(\w+)"\]', c.source)}
        assert used and used <= set(table), f"{lab}{lang}: no message for {sorted(used - set(table))}"
        english = [s for text in table.values() for s in english_sentences(text)]
        assert bool(english) == (not lang), f"{lab}{lang}: English left in its messages: {english}"
