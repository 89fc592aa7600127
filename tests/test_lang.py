"""The course's words on screen in three languages: the pictures' labels, the exercise checks' feedback and the quiz
follow minialloc.lang, every message has all three languages with the same {fields}, and the glossaries hold."""

from __future__ import annotations

import importlib
import io
import string
import warnings
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from course_i18n import glossary  # noqa: E402
from course_i18n.code import CODE_NAME  # noqa: E402
from minialloc import CachingAllocator, MiB, SimulatedGPU, learn  # noqa: E402
from minialloc.lang import LANGS, get_lang, pick, set_lang, using  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# every module's table of learner-facing messages: id -> {"en", "vi", "de"}
TABLES = [
    ("minialloc.learn", "TEXT"),
    *((f"minialloc.learn.chapter{n}", table) for n in range(1, 8) for table in ("TEXT", "WHY")),
    ("minialloc.viz._common", "KIND_TEXT"),
    ("minialloc.viz.segment_map", "TEXT"),
    ("minialloc.viz.stepper", "TEXT"),
    ("minialloc.viz.timeline", "TEXT"),
    ("minialloc.viz.block_table", "TEXT"),
    ("minialloc.viz.replay", "TEXT"),
    ("minialloc.viz.export", "TEXT"),
]


pytestmark = pytest.mark.usefixtures("english_by_default")  # tests/conftest.py


def _messages() -> Iterator[tuple[str, str, dict[str, str]]]:
    for module, name in TABLES:
        for key, entry in getattr(importlib.import_module(module), name).items():
            yield module, key, entry


def _fields(text: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}


def test_every_message_has_three_languages_with_the_same_fields() -> None:
    count = 0
    for module, key, entry in _messages():
        where = f"{module} {key!r}"
        assert set(entry) == set(LANGS), where
        for lang in LANGS:
            assert isinstance(entry[lang], str) and entry[lang].strip(), f"{where} [{lang}] is empty"
            assert _fields(entry[lang]) == _fields(entry["en"]), f"{where} [{lang}]: other {{fields}} than English"
        count += 1
    assert count > 200


@pytest.mark.parametrize("lang", ["vi", "de"])
def test_translations_follow_the_glossary(lang: str) -> None:
    """Every message keeps its language's glossary as `python -m course_i18n check` reads it: a word a term rules
    out where the English holds the term ("avoid"), or anywhere ("never"); each message stands alone."""
    path = ROOT / "course" / "locale" / lang / "glossary.json"
    if not path.exists():
        pytest.skip(f"no {lang} glossary")
    terms = glossary.load(path)
    every_term = {t.term for t in terms}
    problems = [f"{module} {key!r} [{lang}]: {problem}" for module, key, entry in _messages()
                for problem in glossary.violations(CODE_NAME.sub(" ", entry["en"]), CODE_NAME.sub(" ", entry[lang]),
                                                   terms, set(every_term))
                if "rules out" in problem]
    assert not problems, "\n".join(problems)


def _fragmented() -> CachingAllocator:
    """Every kind of block, a pending free, and the largest cached free block to outline."""
    a = CachingAllocator(SimulatedGPU("1GiB"), "")
    p = {name: a.malloc(size) for name, size in (("a", 4 * MiB), ("b", 3 * MiB), ("c", 5 * MiB))}
    q = a.malloc(30 * MiB)
    a.free(p["b"])
    a.record_stream(p["c"], 1)
    a.free(p["c"])
    a.free(q)
    return a


def _legend(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


@pytest.mark.parametrize(
    ("lang", "live", "largest", "stats"),
    [
        ("en", "live block (allocated)", "largest cached free block (outlined)", "allocated "),
        ("vi", "khối đang dùng (đã cấp phát)", "khối trống lớn nhất trong bộ nhớ đệm (có viền)", "đã cấp phát "),
        ("de", "belegter Block (zugewiesen)", "größter freier Block im Cache (umrandet)", "zugewiesen "),
    ],
)
def test_segment_map_legend_speaks_the_notebook_language(lang: str, live: str, largest: str, stats: str) -> None:
    from minialloc.viz import figure_texts, plot_segment_map
    from minialloc.viz._common import KIND_TEXT

    a = _fragmented()
    set_lang(lang)  # after the import: the words are chosen when the picture is drawn
    fig = plot_segment_map(a)
    legend = _legend(fig)
    assert live in legend and largest in legend
    assert KIND_TEXT["pending"][lang] in legend and KIND_TEXT["free_whole"][lang] in legend
    if lang != "en":  # no English label left behind
        assert not set(legend) & {entry["en"] for entry in KIND_TEXT.values()}
    texts = figure_texts(fig)
    assert any(t.startswith(stats) for t in texts), texts


def test_pictures_have_every_glyph() -> None:
    """DejaVu Sans draws Vietnamese and German text: no 'Glyph ... missing from font' on any picture."""
    from minialloc.paging import BlockManager
    from minialloc.viz import Stepper, plot_block_table, plot_segment_map, plot_side_by_side, plot_timeline
    from minialloc.viz._common import discard

    a = _fragmented()
    a.record_memory_history()
    a.free(a.malloc(2 * MiB))
    m = BlockManager(num_blocks=6, block_size=4)
    m.allocate(1, [1, 2, 3, 4, 5])
    m.fork(1, 2)
    for lang in ("vi", "de"):
        with using(lang), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stepper = Stepper([(4 * MiB, 0, "x"), (3 * MiB, 1, "y"), ("free", "x")], "")
            figures = [plot_segment_map(a), plot_side_by_side(a, a), plot_timeline(a), plot_block_table(m),
                       stepper.figure(2)]
            for fig in figures:
                fig.savefig(io.BytesIO(), format="png", dpi=60)
                discard(fig)
        missing = [str(w.message) for w in caught if "missing from" in str(w.message)]
        assert not missing, (lang, missing)


def test_stepper_and_replay_speak_the_notebook_language() -> None:
    pytest.importorskip("ipywidgets")
    from minialloc.viz import Stepper

    stepper = Stepper([(4 * MiB, 0, "x"), (3 * MiB, 0, "y"), ("free", "x")], "")
    stepper.replay.goto(1)
    with using("vi"):
        text = stepper.stats_text()
        assert text.startswith("bước 1/3: malloc 4.00 MiB trên luồng CUDA 0, tên 'x'")
        assert "khối trống lớn nhất trong bộ nhớ đệm" in text
        assert "khối trống lớn nhất trong bộ nhớ đệm" in stepper._stats_html()
        box = stepper.widget()
        assert box.children[0].children[1].tooltip == "lùi một bước"
    stepper.replay.goto(1)  # the widget showed its own step, 0
    with using("de"):
        assert stepper.stats_text().startswith("Schritt 1 von 3: malloc 4.00 MiB auf Stream 0 als 'x'")
    assert stepper.stats_text().startswith("step 1 of 3: malloc 4.00 MiB on stream 0 as 'x'")


def test_replay_outcome_of_an_oom_in_each_language() -> None:
    from minialloc.viz import Replay

    replay = Replay([(600 * MiB, 0, "a"), (600 * MiB, 0, "b"), ("free", "b")], "", capacity="1GiB")
    replay.goto(2)
    assert "OUT OF MEMORY" in replay.outcome
    with using("vi"):
        assert "HẾT BỘ NHỚ" in replay.outcome and "luồng CUDA" in replay.outcome
    with using("de"):
        replay.goto(3)
        assert replay.outcome == "free 'b': übersprungen, sein malloc scheiterte an Speichermangel"


def _retry_never(device, cache, size):  # chapter 1's exercise, a plausible wrong answer
    return device.malloc(size)


@pytest.mark.parametrize(
    ("lang", "failed", "hint", "says"),
    [
        ("en", "not passed:", "\nhint: ", "your driver calls were"),
        ("vi", "chưa đạt:", "\ngợi ý: ", "các lần gọi trình điều khiển của bạn là"),
        ("de", "nicht bestanden:", "\nHinweis: ", "Ihre Treiberaufrufe waren"),
    ],
)
def test_exercise_feedback_speaks_the_notebook_language(lang: str, failed: str, hint: str, says: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from minialloc.learn import chapter1

    set_lang(lang)
    text = learn.check("c1-retry", _retry_never, chapter1.check_get_segment)
    assert learn.results() == {"c1-retry": "failed"}  # the outcome itself is the same in every language
    assert text.startswith(f"[c1-retry] {failed}") and hint in text and says in text
    assert says in capsys.readouterr().out
    if lang != "en":
        assert "not passed" not in text and "hint:" not in text and "your" not in text


@pytest.mark.parametrize(
    ("lang", "blank", "right", "wrong"),
    [
        ("en", "not yet", "right", "wrong: you predicted"),
        ("vi", "chưa làm", "đúng", "sai: bạn dự đoán"),
        ("de", "noch nicht", "richtig", "falsch: Ihre Vorhersage war"),
    ],
)
def test_predictions_speak_the_notebook_language(lang: str, blank: str, right: str, wrong: str) -> None:
    with using(lang):
        assert learn.reveal("p", ..., 3, "why").startswith(f"[p] {blank}:")
        assert learn.reveal("p", 3, 3, "why").startswith(f"[p] {right}: 3")
        assert learn.reveal("p", 4, 3, "why").startswith(f"[p] {wrong} 4")
        assert learn.check("e", lambda: ..., lambda fn: learn.call(fn)).startswith(f"[e] {blank}")


def test_chapter_six_stories_and_replays_follow_the_language() -> None:
    from minialloc.learn import chapter6

    english = chapter6.FAILURES["A"].story
    with using("de"):
        assert chapter6.FAILURES["A"].story.startswith("Ein Training auf einer 8-GiB-GPU")
        saved, what = chapter6.try_fix("C", "empty_cache")
        assert saved and what.startswith("Job 2: keine Zuweisung scheitert")
    assert chapter6.FAILURES["A"].story == english and english.startswith("Training on an 8 GiB GPU")


def test_three_languages_one_setting() -> None:
    import quizzes.i18n

    assert LANGS == ("en", "vi", "de")
    assert quizzes.i18n.LANGS == LANGS  # the quiz and the course speak the same three languages
    with using("de"):
        assert get_lang() == "de"
        assert pick({"en": "block", "de": "Block"}) == "Block"
        assert pick({"en": "block"}) == "block"  # untranslated: English
    assert get_lang() == "en"
    with pytest.raises(ValueError, match="unknown language"):
        set_lang("fr")


def test_a_bad_environment_language_falls_back_to_english(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIALLOC_LANG", "vi")
    assert get_lang() == "vi"
    monkeypatch.setenv("MINIALLOC_LANG", "klingon")
    assert get_lang() == "en"  # a bad shell setting never stops a chapter
    with using("de"):
        assert get_lang() == "de"


def test_environment_variable_sets_the_language(monkeypatch: pytest.MonkeyPatch) -> None:
    from minialloc.learn import chapter3

    monkeypatch.setenv("MINIALLOC_LANG", "de")
    assert get_lang() == "de"
    text = learn.check("c3", lambda offset, size, page: "x", chapter3.check_pages_touched)
    assert "nicht bestanden" in text and "Hinweis:" in text


def test_practice_quiz_defaults_to_the_notebook_language() -> None:
    import quizzes

    assert quizzes.practice(chapter=2, mode="text", seed=1).session.lang == "en"
    with using("vi"):
        assert quizzes.practice(chapter=2, mode="text", seed=1).session.lang == "vi"
        assert quizzes.practice(chapter=2, mode="text", seed=1, lang="de").session.lang == "de"  # asked for


def test_set_lang_exports_the_language_to_the_commands_a_chapter_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys

    monkeypatch.setenv("MINIALLOC_LANG", "de")  # the learner's shell said German; the chapter says Vietnamese
    set_lang("vi")
    child = [sys.executable, "-c", "from minialloc.lang import get_lang; print(get_lang())"]
    assert subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip() == "vi"
    with using("en"):
        assert os.environ["MINIALLOC_LANG"] == "en"
    assert os.environ["MINIALLOC_LANG"] == "vi"
    set_lang(None)  # back to the shell's setting, not to the one set_lang exported
    assert os.environ["MINIALLOC_LANG"] == "de" and get_lang() == "de"
    monkeypatch.delenv("MINIALLOC_LANG")
    set_lang("de")
    set_lang(None)
    assert "MINIALLOC_LANG" not in os.environ and get_lang() == "en"
