"""The question bank: schema, three complete languages, coverage of the course's claims, and clear errors."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from course_i18n import bank as bank_glossary
from course_i18n import glossary
from quizzes import LANGS, BankError, load_bank
from quizzes.bank import BANK_DIR, placeholders
from quizzes.cli import main
from quizzes.i18n import CERT, UI

BANK = load_bank()
ROOT = Path(__file__).resolve().parents[1]

# The five questions of the course page's own quiz (its English FAQ), word for word.
FAQ = {
    "What is GPU memory fragmentation?",
    "Why do frameworks like PyTorch use a caching memory allocator?",
    "You see 5 GB free but cannot allocate a 2 GB tensor. What is the likely cause?",
    "Which PyTorch setting helps reduce fragmentation by allowing memory segments to grow flexibly?",
    "What does vLLM's PagedAttention manage to reduce memory waste during inference?",
}

# Every claim the course teaches, as the bank's `topic` names it.
TOPICS = {
    "why a caching allocator", "driver calls are slow", "rounding to 512 bytes", "small and large pools",
    "segment sizes 2 MiB / 20 MiB / rounded", "best fit per stream", "splitting rules",
    "merging and returning segments",
    "fragmentation", "fragmentation: 5 GB free, 2 GB fails", "split blocks that cannot merge",
    "what empty_cache does and does not do", "reading the OOM message", "reserved vs allocated", "memory_summary",
    "memory_summary and snapshots", "expandable segments", "virtual memory mapping", "max_split_size_mb",
    "garbage_collection_threshold", "record_stream", "PagedAttention fixed-size blocks", "block tables",
    "copy-on-write", "prefix sharing", "preemption", "the paper's waste numbers",
    "smaller batches and gradient checkpointing",
}


def _texts(q) -> list[tuple[str, dict]]:
    fields = [("text", q.text), ("explanation", q.explanation)]
    fields += [(f"options[{i}].text", o.text) for i, o in enumerate(q.options)]
    if q.unit is not None:
        fields.append(("unit", q.unit))
    return fields


def test_bank_size_and_kinds():
    assert len(BANK) >= 40
    kinds = {q.kind for q in BANK}
    assert kinds == {"single", "multi", "numeric", "computed"}
    assert sum(q.kind == "computed" for q in BANK) >= 5
    for chapter in range(1, 7):
        assert len(BANK.chapter(chapter)) >= 4, f"chapter {chapter} has too few questions"


@pytest.mark.parametrize("qid", list(BANK.questions))
def test_every_language_of_every_field(qid):
    q = BANK[qid]
    for field, text in _texts(q):
        assert set(text) == set(LANGS), f"{qid}.{field}"
        for lang in LANGS:
            assert text[lang].strip(), f"{qid}.{field}.{lang} is empty"
    rendered = q.render(seed=3)  # computed templates filled: nothing left unfilled in any language
    for lang in LANGS:
        for field in (rendered.text, rendered.explanation):
            assert field[lang].strip() and "{" not in field[lang], f"{qid}.{lang}"


@pytest.mark.parametrize("qid", list(BANK.questions))
def test_translations_are_translations(qid):
    """The question and its explanation are written in each language, not copied from English."""
    q = BANK[qid]
    for field in (q.text, q.explanation):
        assert field["vi"] != field["en"] and field["de"] != field["en"], qid
        assert re.search(r"[À-ỹ]", field["vi"]), \
            f"{qid}: the Vietnamese text has no Vietnamese letters"


GLOSSARIES = {lang: glossary.load(ROOT / "course" / "locale" / lang / "glossary.json") for lang in ("vi", "de")}


@pytest.mark.parametrize("lang", sorted(GLOSSARIES))
def test_translations_follow_the_course_glossary(lang):
    """The bank says "luồng", "Allokator", ... as the translated chapters do, and never a word the glossary rules
    out; the same check `python -m course_i18n check` runs (an option's sense comes from its whole question). A text
    written the same in every language (a setting, a memory_summary row name) is a literal."""
    problems = bank_glossary.check(BANK_DIR, lambda code: ROOT / "course" / "locale" / code / "glossary.json", [lang])
    assert not problems, "\n".join(problems)


def test_interface_strings_in_every_language():
    for table in (UI, CERT):
        for key, text in table.items():
            assert set(text) == set(LANGS) and all(text[lang].strip() for lang in LANGS), key


def test_every_explanation_differs_from_the_question():
    for q in BANK:
        assert q.explanation["en"] != q.text["en"], q.id


def test_faq_questions_are_in_the_bank():
    faq = [q for q in BANK if "faq" in q.tags]
    assert {q.text["en"] for q in faq} == FAQ
    assert all(q.kind == "single" for q in faq)


def test_every_claim_of_the_course_has_a_question():
    topics = {q.topic for q in BANK}
    assert TOPICS <= topics, f"no question for: {sorted(TOPICS - topics)}"


def test_every_question_names_its_idea_and_every_wrong_option_its_misconception():
    """The review (docs/quiz-review.md) is built from these fields; the loader refuses a bank without them."""
    for q in BANK:
        assert len(q.idea) >= 30, q.id
        right = {q.answer} if isinstance(q.answer, str) else set(q.answer) if isinstance(q.answer, frozenset) else set()
        for o in q.options:
            assert (o.misconception is None) == (o.id in right), (q.id, o.id)
        if q.kind == "numeric":
            assert q.misconceptions, q.id


def test_no_question_is_in_two_chapter_quizzes():
    """A chapter's practice quiz never repeats another chapter's question (chapter 6 once opened with chapter 3's);
    coming back to an earlier chapter is done by review questions of its own."""
    for q in BANK:
        assert q.chapters == (int(Path(q.file).name[2]),), q.id


def test_later_chapters_come_back_to_earlier_ones():
    first_taught: dict[str, int] = {}
    for q in BANK:
        if "review" not in q.tags:
            first_taught.setdefault(q.topic, q.chapters[0])
    reviews = {c: [q for q in BANK.chapter(c) if "review" in q.tags] for c in range(3, 7)}
    for chapter, questions in reviews.items():
        assert questions, f"chapter {chapter} has no review question"
        for q in questions:
            assert first_taught.get(q.topic, chapter) < chapter, (q.id, q.topic)


def test_questions_that_read_a_message_or_a_snapshot():
    """Real exhibits: OOM messages in PyTorch's words, snapshot excerpts with PyTorch's block states."""
    exhibits = [q for q in BANK if q.exhibit]
    messages = [q for q in exhibits if q.exhibit.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to")]
    snapshots = [q for q in exhibits if q.exhibit.startswith("segment 0x")]
    assert len(messages) >= 4 and len(snapshots) >= 3 and len(messages) + len(snapshots) == len(exhibits)
    for q in messages:
        assert "If reserved but unallocated memory is large try setting" in q.exhibit, q.id
    for q in snapshots:
        assert all(s in ("active_allocated", "inactive", "active_pending_free") for s in
                   re.findall(r"block\s+(\w+)", q.exhibit)), q.id


def test_choice_answers_are_options():
    for q in BANK:
        ids = {o.id for o in q.options}
        if q.kind == "single":
            assert q.answer in ids
        elif q.kind == "multi":
            assert q.answer and set(q.answer) <= ids


def test_computed_templates_use_only_generator_parameters():
    for q in BANK:
        if q.kind == "computed":
            for lang in LANGS:
                assert placeholders(q.text[lang]) | placeholders(q.explanation[lang])


def test_check_command(capsys):
    assert main(["check"]) == 0
    assert "bank OK" in capsys.readouterr().out


# -- malformed entries name the file, the question and the field ----------------------------------------------------

def _valid_file() -> dict:
    return json.loads((BANK_DIR / "ch2_fragmentation.json").read_text(encoding="utf-8"))


def _question(data: dict, qid: str) -> dict:
    return next(q for q in data["questions"] if q["id"] == qid)


def _drop_vi(d):
    del _question(d, "c2-oom-hint")["text"]["vi"]


def _drop_option_de(d):
    del _question(d, "c2-oom-hint")["options"][2]["text"]["de"]


def _bad_kind(d):
    _question(d, "c2-oom-hint")["kind"] = "essay"


def _answer_not_option(d):
    _question(d, "c2-oom-hint")["answer"] = "z"


def _numeric_no_tolerance(d):
    del _question(d, "c2-frag-figure")["tolerance"]


def _unknown_generator(d):
    _question(d, "c2-computed-oom")["generator"] = "no_such_thing"


def _unknown_placeholder(d):
    _question(d, "c2-computed-oom")["text"]["de"] += " {gpu_name}"


def _typo_field(d):
    _question(d, "c2-oom-hint")["explanaton"] = {"en": "x", "vi": "x", "de": "x"}


def _brace_in_static(d):
    _question(d, "c2-oom-hint")["explanation"]["en"] += " {x}"


def _empty_text(d):
    _question(d, "c2-oom-hint")["text"]["en"] = "  "


def _multi_repeats(d):
    _question(d, "c2-empty-cache")["answer"] = ["a", "a"]


def _bool_answer(d):
    _question(d, "c2-frag-figure")["answer"] = True


def _no_idea(d):
    del _question(d, "c2-oom-hint")["idea"]


def _distractor_without_misconception(d):
    q = _question(d, "c2-oom-hint")
    wrong = next(i for i, o in enumerate(q["options"]) if o["id"] != q["answer"])
    del q["options"][wrong]["misconception"]
    d["_expected_field"] = f"options[{wrong}].misconception"


def _wrong_rule_gives_the_answer(d):
    q = _question(d, "c2-frag-figure")
    q["misconceptions"][1]["answer"] = q["answer"]


@pytest.mark.parametrize(("mutate", "qid", "field"), [
    (_drop_vi, "c2-oom-hint", "text.vi"),
    (_drop_option_de, "c2-oom-hint", "options[2].text.de"),
    (_bad_kind, "c2-oom-hint", "kind"),
    (_answer_not_option, "c2-oom-hint", "answer"),
    (_numeric_no_tolerance, "c2-frag-figure", "tolerance"),
    (_unknown_generator, "c2-computed-oom", "generator"),
    (_unknown_placeholder, "c2-computed-oom", "text.de"),
    (_typo_field, "c2-oom-hint", "explanaton"),
    (_brace_in_static, "c2-oom-hint", "explanation.en"),
    (_empty_text, "c2-oom-hint", "text.en"),
    (_multi_repeats, "c2-empty-cache", "answer"),
    (_bool_answer, "c2-frag-figure", "answer"),
    (_no_idea, "c2-oom-hint", "idea"),
    (_distractor_without_misconception, "c2-oom-hint", None),
    (_wrong_rule_gives_the_answer, "c2-frag-figure", "misconceptions[1].answer"),
])
def test_malformed_entry_names_file_question_and_field(tmp_path: Path, mutate, qid, field):
    data = copy.deepcopy(_valid_file())
    mutate(data)
    field = data.pop("_expected_field", field)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(BankError) as info:
        load_bank([path])
    err = info.value
    assert (err.qid, err.field) == (qid, field)
    assert "broken.json" in str(err) and repr(qid) in str(err) and repr(field) in str(err)


def test_duplicate_id_across_files(tmp_path: Path):
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(_valid_file(), ensure_ascii=False), encoding="utf-8")
    with pytest.raises(BankError, match=r"b\.json: question 'c2-what-is-fragmentation': field 'id': duplicate"):
        load_bank([tmp_path / "a.json", tmp_path / "b.json"])


@pytest.mark.parametrize(("content", "message"), [
    ('{"format": "minialloc-quiz-bank", ', "invalid JSON at line 1"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"format": "x", "version": 1, "chapter": 1, "title": {}, "questions": []}', "field 'format'"),
    ('{"a": 1, "a": 2}', "duplicate key"),
])
def test_malformed_file(tmp_path: Path, content: str, message: str):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BankError, match=message) as info:
        load_bank([path])
    assert "bad.json" in str(info.value)


def test_check_command_reports_a_bad_file(tmp_path: Path, capsys):
    data = _valid_file()
    _drop_vi(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "broken.json" in err and "c2-oom-hint" in err and "text.vi" in err and "Traceback" not in err


def _real_segments() -> dict[int, list[tuple[str, dict]]]:
    import pickle

    found: dict[int, list[tuple[str, dict]]] = {}
    for path in sorted((ROOT / "tests" / "fixtures" / "real_snapshots").glob("*.pickle")):
        with path.open("rb") as f:
            snapshot = pickle.load(f)  # the project's own fixtures (real PyTorch snapshots), not user input
        for segment in snapshot.get("segments", []):
            if "address" in segment:
                found.setdefault(segment["address"], []).append((path.name, segment))
    return found


def test_snapshot_excerpts_are_real():
    """Every snapshot excerpt a question reads is a segment of one of the real snapshots, block for block (runs
    reuse addresses, so the segment is looked up by its address, size and blocks)."""
    segments = _real_segments()
    excerpts = [q for q in BANK if q.exhibit.startswith("segment 0x")]
    assert excerpts
    for q in excerpts:
        for part in re.split(r"\n(?=segment 0x)", q.exhibit):
            head, *rows = part.splitlines()
            address, total = re.match(r"segment (0x[0-9a-f]+)\s+total_size (\d+)", head).groups()
            shown = []
            for row in rows:
                state, size, times = re.match(r"\s*block\s+(\w+)\s+size\s+(\d+).*?(?:x (\d+))?$", row).groups()
                shown += [(state, int(size))] * int(times or 1)
            assert any(segment["total_size"] == int(total)
                       and shown == [(b["state"], b["size"]) for b in segment["blocks"]]
                       for _, segment in segments.get(int(address, 16), [])), (q.id, address)
