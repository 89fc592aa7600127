"""The code's learner-facing strings in gettext catalogs (course_i18n.code, minialloc.lang.messages): extract, build
and check on a small synthetic package, the real catalogs complete and compiled, and the run-time lookup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_i18n import catalog as cat
from course_i18n import code
from minialloc.lang import Text, messages, pick, using

ROOT = Path(__file__).resolve().parents[1]

SOURCE = '''"""A module with a table of learner-facing messages."""
from minialloc.lang import messages

TEXT = messages("minialloc.demo.TEXT", {
    "freed": "the allocator freed {n} segments",
    "calls": "device.malloc was called",
})
'''
GLOSSARY = {"format": "minialloc-glossary", "version": 1, "lang": "vi", "terms": [
    {"term": "segment", "en": "segments?", "use": ["phân đoạn"], "first": ["phân đoạn \\(segments?\\)"]},
    {"term": "device", "en": "devices?", "use": ["thiết bị"]},
]}


@pytest.fixture
def repo(tmp_path: Path) -> code.CodeLayout:
    (tmp_path / "minialloc").mkdir()
    (tmp_path / "minialloc" / "demo.py").write_text(SOURCE, encoding="utf-8")
    (tmp_path / "course" / "locale" / "vi").mkdir(parents=True)
    (tmp_path / "course" / "locale" / "vi" / "glossary.json").write_text(json.dumps(GLOSSARY), encoding="utf-8")
    return code.CodeLayout(tmp_path, tmp_path / "course")


def _translate(layout: code.CodeLayout, table: dict[str, str]) -> None:
    path = layout.po("minialloc", "vi")
    catalog = cat.read(path)
    for m in cat.messages(catalog):
        if m.context in table:
            m.string = table[m.context]
            m.flags.discard("fuzzy")
        m.flags -= set(cat.AUTO_FLAGS)  # Babel guesses these on reading; extract leaves them out
    cat.write(path, catalog)


def test_extract_build_check_round_trip(repo: code.CodeLayout) -> None:
    assert code.extract(repo, ["vi"]) == [repo.po("minialloc", "vi")]
    found = {m.context: m.id for m in cat.messages(cat.read(repo.po("minialloc", "vi")))}
    assert found == {"minialloc.demo.TEXT:freed": "the allocator freed {n} segments",
                     "minialloc.demo.TEXT:calls": "device.malloc was called"}
    problems = code.check(repo, ["vi"])
    assert sum("untranslated" in p for p in problems) == 2 and any("out of date" in p for p in problems)
    # a glossary term read as such in each message alone (no "first use" rendering), dotted code names left alone
    _translate(repo, {"minialloc.demo.TEXT:freed": "bộ cấp phát đã giải phóng {n} phân đoạn",
                      "minialloc.demo.TEXT:calls": "device.malloc đã được gọi"})
    assert code.build(repo, ["vi"]) == [f"wrote {repo.mo('minialloc', 'vi')}"]
    assert code.check(repo, ["vi"]) == []
    assert code.extract(repo, ["vi"]) == [] and code.build(repo, ["vi"]) == []  # nothing changed: nothing written


def test_check_fails_on_glossary_fields_fuzzy_and_stale_compilation(repo: code.CodeLayout) -> None:
    code.extract(repo, ["vi"])
    _translate(repo, {"minialloc.demo.TEXT:freed": "bộ cấp phát đã giải phóng {n} đoạn",
                      "minialloc.demo.TEXT:calls": "device.malloc đã được gọi {x}"})
    code.build(repo, ["vi"])
    problems = code.check(repo, ["vi"])
    assert any("freed] glossary: 'segment' must be rendered as phân đoạn" in p for p in problems), problems
    assert any("calls] fields ['x'], the English has []" in p for p in problems), problems
    source = repo.root / "minialloc" / "demo.py"
    source.write_text(SOURCE.replace("{n} segments", "{n} cached segments"), encoding="utf-8")
    code.extract(repo, ["vi"])
    problems = code.check(repo, ["vi"])
    assert any("freed] fuzzy" in p for p in problems) and any("out of date" in p for p in problems), problems


def test_a_table_extract_cannot_read_is_an_error(repo: code.CodeLayout) -> None:
    (repo.root / "minialloc" / "other.py").write_text('NAME = "x"\nT = messages(NAME, {"a": "b"})\n')
    with pytest.raises(ValueError, match=r"other.py:2: messages\(\) needs a literal table name"):
        code.find(repo.root, "minialloc")
    (repo.root / "minialloc" / "other.py").write_text('T = lang.messages("minialloc.demo.T", {"a": "b"})\n')
    with pytest.raises(ValueError, match="must be named minialloc.other.<NAME>"):
        code.find(repo.root, "minialloc")


def test_the_real_code_catalogs_are_complete_and_compiled() -> None:
    layout = code.CodeLayout(ROOT, ROOT / "course")
    problems = [p.replace(f"{ROOT}/", "") for p in code.check(layout, ("vi", "de"))]
    assert problems == []  # glossary breaches included
    assert len(code.find(ROOT, "minialloc")) > 300 and len(code.find(ROOT, "quizzes")) > 30


def test_a_message_reads_its_catalog_when_asked() -> None:
    table = messages("quizzes.i18n.UI", {"check": "Check", "unknown": "Not in any catalog"})
    assert dict(table["check"]) == {"en": "Check", "vi": "Kiểm tra", "de": "Prüfen"}
    # a message the catalog does not hold has English only, and pick falls back to it
    assert list(table["unknown"]) == ["en"] and "vi" not in table["unknown"]
    with using("de"):
        assert pick(table["check"]) == "Prüfen" and pick(table["unknown"]) == "Not in any catalog"
    with pytest.raises(KeyError):
        table["unknown"]["vi"]
    assert isinstance(table["check"], Text) and repr(table["check"]) == "Text('quizzes.i18n.UI:check', 'Check')"
