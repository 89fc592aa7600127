"""The glossary check over every kind of text a learner reads: a breach in a chapter, a lab, the code's catalogs
(minialloc's feedback and hint tables, plot and stepper labels, command line; the quizzes package's interface) and
the quiz bank is caught and named (file, entry, term); the glossary's own rules (never, where/unless); and the real
tree passes the whole check."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from course_i18n import bank, code, glossary
from course_i18n import catalog as cat
from course_i18n.cli import main
from course_i18n.labs import LabLayout
from course_i18n.tool import Layout, build, check, extract

ROOT = Path(__file__).resolve().parent.parent

SERVING = "token|prompt|server"
TERMS = [
    {"term": "trace", "en": "traces?", "use": ["trace"], "avoid": ["dòng sự kiện"], "never": ["(?<!\\w)vết(?!\\w)"]},
    {"term": "unmap", "en": "unmap(?:s|ped|ping)?", "use": ["gỡ ánh xạ"], "never": ["bỏ ánh xạ"]},
    {"term": "request", "en": "requests?", "unless": SERVING, "use": ["yêu cầu cấp phát"]},
    {"term": "request (serving)", "en": "requests?", "where": SERVING, "use": ["yêu cầu"]},
]
GOOD = {
    "The trace ends with an unmap.": "Trace kết thúc bằng một lần gỡ ánh xạ.",
    "Each request is rounded up.": "Mỗi yêu cầu cấp phát được làm tròn lên.",
}
# one breach per entry: a word the glossary rules out everywhere, although the English says "recording"
BAD = {
    "The trace ends with an unmap.": "Trace kết thúc bằng một lần bỏ ánh xạ.",
    "Each request is rounded up.": "Mỗi yêu cầu được làm tròn lên; vết của nó còn lại.",
}


def _glossary(root: Path) -> Path:
    path = root / "course" / "locale" / "vi" / "glossary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": "minialloc-glossary", "version": 1, "lang": "vi", "terms": TERMS}),
                    encoding="utf-8")
    return path


def _fill(po: Path, table: dict[str, str]) -> None:
    catalog = cat.read(po)
    for m in cat.messages(catalog):
        m.string = table.get(m.id, m.string)
        m.flags.discard("fuzzy")
        m.flags -= set(cat.AUTO_FLAGS)
    cat.write(po, catalog)


def _expect_breaches(problems: list[str], where: str) -> None:
    """Both entries of BAD caught, each naming its file and term."""
    assert any(where in p and "'unmap' rendered as 'bỏ ánh xạ'" in p for p in problems), problems
    assert any(where in p and "'trace' rendered as 'vết'" in p and "every text" in p for p in problems), problems
    assert any(where in p and "'request' must be rendered as yêu cầu cấp phát" in p for p in problems), problems


# ---------------------------------------------------------------- the glossary's rules


def test_never_where_and_unless(tmp_path: Path) -> None:
    terms = glossary.load(_glossary(tmp_path))
    every = {t.term for t in terms}
    # a word ruled out everywhere is caught although the English holds no glossary term
    assert glossary.violations("It leaves a mark.", "Nó để lại vết.", terms, set(every)) == [
        "'trace' rendered as 'vết', which the glossary rules out in every text ((?<!\\w)vết(?!\\w))"]
    # one English word, two senses: the English around it decides which term applies
    assert glossary.violations("Each request is rounded up.", "Mỗi yêu cầu được làm tròn.", terms, set(every))
    assert not glossary.violations("Each request holds its tokens.", "Mỗi yêu cầu giữ token của nó.", terms,
                                   set(every))
    assert not glossary.violations("Each request is rounded up.", "Mỗi yêu cầu được làm tròn.", terms, set(every),
                                   context="A server keeps its requests' tokens.")
    # a translator's waiver covers a word ruled out everywhere too
    assert not glossary.violations("It leaves a mark.", "Nó để lại vết.", terms, set(every), {"trace"})


def test_a_glossary_with_an_unknown_field_is_refused(tmp_path: Path) -> None:
    path = _glossary(tmp_path)
    path.write_text(json.dumps({"format": "minialloc-glossary", "version": 1, "lang": "vi",
                                "terms": [{"term": "x", "en": "x", "use": ["x"], "nowhere": ["y"]}]}))
    with pytest.raises(ValueError, match="unknown fields \\['nowhere'\\]"):
        glossary.load(path)


# ---------------------------------------------------------------- each kind of text


def test_a_breach_in_a_chapter_is_caught(tmp_path: Path) -> None:
    _glossary(tmp_path)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("The trace ends with an unmap.\n\nEach request is rounded up.")]
    nb.cells[0].id = "intro"
    nbformat.write(nb, tmp_path / "course" / "01_demo.ipynb")
    layout = Layout.default(tmp_path / "course")
    extract(layout, ["01_demo"], ["vi"])
    _fill(layout.catalog_path("vi", "01_demo"), GOOD)
    build(layout, ["vi"])
    assert check(layout).problems == []
    _fill(layout.catalog_path("vi", "01_demo"), BAD)
    build(layout, ["vi"])
    _expect_breaches(check(layout).problems, "01_demo.po: [intro:")


def test_a_breach_in_a_lab_is_caught(tmp_path: Path) -> None:
    _glossary(tmp_path)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("The trace ends with an unmap.\n\nEach request is rounded up."),
                nbformat.v4.new_code_cell("x = 1\n")]
    nb.cells[0].id = "md-01"
    nb.cells[1].id = "setup"
    nb.cells[1].metadata["nbgrader"] = {"grade": False, "grade_id": "setup", "locked": True, "schema_version": 3,
                                        "solution": False}
    (tmp_path / "labs" / "source" / "lab9_demo").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "labs" / "source" / "lab9_demo" / "lab9_demo.ipynb")
    layout = LabLayout.for_labs(tmp_path / "labs", None, tmp_path / "course")
    extract(layout, ["lab9_demo"], ["vi"])
    _fill(layout.catalog_path("vi", "lab9_demo"), BAD)
    build(layout, ["vi"])
    _expect_breaches(check(layout).problems, "lab9_demo.po: [md-01:")


# a feedback table of minialloc/learn, a plot label table of minialloc/viz, the command line's strings, and the
# quizzes package's interface: each is a messages() table in its package's catalog
TABLES = {
    "minialloc/learn/chapter3.py": ("minialloc", "minialloc.learn.chapter3.TEXT"),
    "minialloc/viz/segment_map.py": ("minialloc", "minialloc.viz.segment_map.TEXT"),
    "minialloc/cli.py": ("minialloc", "minialloc.cli.TEXT"),
    "quizzes/widget.py": ("quizzes", "quizzes.widget.UI"),
}


@pytest.mark.parametrize("module", sorted(TABLES))
def test_a_breach_in_a_code_catalog_is_caught(tmp_path: Path, module: str) -> None:
    _glossary(tmp_path)
    package, table = TABLES[module]
    source = tmp_path / module
    source.parent.mkdir(parents=True, exist_ok=True)
    entries = ", ".join(f"{key!r}: {english!r}" for key, english in zip(("a", "b"), GOOD, strict=True))
    source.write_text(f"from minialloc.lang import messages\n\nT = messages({table!r}, {{{entries}}})\n",
                      encoding="utf-8")
    layout = code.CodeLayout(tmp_path, tmp_path / "course")
    code.extract(layout, ["vi"])
    _fill(layout.po(package, "vi"), GOOD)
    code.build(layout, ["vi"])
    assert code.check(layout, ["vi"]) == []
    _fill(layout.po(package, "vi"), BAD)
    code.build(layout, ["vi"])
    problems = code.check(layout, ["vi"])
    _expect_breaches(problems, f"{package}.po: [{table}:")


def test_a_breach_in_the_quiz_bank_is_caught(tmp_path: Path) -> None:
    path = _glossary(tmp_path)
    english = list(GOOD)
    question = {"id": "q1", "kind": "single",
                "text": {"en": english[0], "vi": BAD[english[0]], "de": "x"},
                "explanation": {"en": english[1], "vi": BAD[english[1]], "de": "x"}}
    # an option's sense comes from its whole question: these requests are a server's, where "yêu cầu" is right
    serving = {"id": "q2", "kind": "single", "text": {"en": "What does a server keep per token?", "vi": "?", "de": "?"},
               "options": [{"id": "a", "text": {"en": "each request", "vi": "mỗi yêu cầu", "de": "x"}}]}
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "ch9.json").write_text(json.dumps({"questions": [question, serving]}), encoding="utf-8")
    problems = bank.check(tmp_path / "bank", lambda lang: path, ["vi"])
    _expect_breaches(problems, "ch9.json: [q1.")
    assert any("[q1.text] vi glossary:" in p for p in problems)
    assert not any("q2" in p for p in problems)
    question["text"]["vi"], question["explanation"]["vi"] = GOOD[english[0]], GOOD[english[1]]
    (tmp_path / "bank" / "ch9.json").write_text(json.dumps({"questions": [question, serving]}), encoding="utf-8")
    assert bank.check(tmp_path / "bank", lambda lang: path, ["vi"]) == []


# ---------------------------------------------------------------- the real tree


def test_the_real_quiz_bank_follows_the_glossaries() -> None:
    layout = code.CodeLayout(ROOT, ROOT / "course")
    assert bank.check(ROOT / "quizzes" / "bank", layout.glossary, ("vi", "de")) == []


def test_the_whole_real_tree_passes_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m course_i18n check` over the chapters, the labs, the code's catalogs and the quiz bank."""
    assert main(["--course", str(ROOT / "course"), "--labs", str(ROOT / "labs"), "check"]) == 0, \
        capsys.readouterr().out


@pytest.mark.parametrize("lang", ["vi", "de"])
def test_the_glossaries_hold_the_terms_the_course_settles(lang: str) -> None:
    """One term per idea: the words the translations once mixed are ruled out, the settled ones required."""
    terms = {t.term: t for t in glossary.load(ROOT / "course" / "locale" / lang / "glossary.json")}
    wanted = {"vi": {"trace": "trace", "batch": "batch", "tensor": "tensor", "kernel": "kernel",
                     "best fit": "best fit", "prefill": "prefill", "compaction": "dồn bộ nhớ",
                     "pinned": "bị ghim", "unmap": "gỡ ánh xạ", "snapshot": "ảnh chụp bộ nhớ",
                     "host memory": "bộ nhớ host", "crash": "bị sập", "stream": "luồng"},
              "de": {"trace": "Trace", "batch": "Batch", "tensor": "Tensor", "kernel": "Kernel",
                     "best fit": "Best Fit", "prefill": "Prefill", "request": "Anforderung",
                     "request (serving)": "Anfrage", "map": "einblenden", "unmap": "ausblenden",
                     "history": "Verlauf", "allocated block": "belegter Block"}}[lang]
    for name, rendering in wanted.items():
        assert any(p.search(rendering) for p in terms[name].use + terms[name].first), (name, rendering)
    ruled_out = {"vi": {"trace": ["vết", "dòng sự kiện", "chuỗi thao tác", "chuỗi sự kiện"],
                        "pinned": ["bị giữ chặt"], "unmap": ["bỏ ánh xạ"], "snapshot": ["ảnh chụp nhanh"],
                        "host memory": ["bộ nhớ của máy chủ"], "crash": ["bị treo"], "compaction": ["nén bộ nhớ"],
                        "gradient": ["độ dốc"], "offloading": ["giảm tải"]},
                 "de": {"map": ["gemappt"], "unmap": ["unmappt", "nicht gemappte Seiten", "koppelt sie ab"],
                        "peak": ["höchstens"], "scratch space": ["Arbeitsspeicher"], "gradient": ["Farbverläufe"],
                        "request": ["Anfrage"]}}[lang]
    for name, words in ruled_out.items():
        for word in words:
            assert any(p.search(word) for p in terms[name].avoid + terms[name].never), (name, word)
    if lang == "vi":  # "luồng CUDA (stream)" on first use, "luồng" after
        assert any(p.fullmatch("luồng CUDA (stream)") for p in terms["stream"].first)
