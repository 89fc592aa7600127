"""The cue rule: `python -m quizzes check` and `build-graded` refuse a bank whose single-choice questions a learner
passes without the idea, by any length rank, any position or the most qualified-looking option, in any language;
and the practice quiz and the graded quiz show the right option at every position equally often."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from quizzes import LANGS, PracticeSession, load_bank
from quizzes.bank import BANK_DIR
from quizzes.cli import main
from quizzes.cues import (
    MAX_CUE_RATE,
    ChoiceItem,
    cue_reports,
    measure,
    practice_items,
    private_items,
    qualification,
    shown_length,
    strategies,
)
from quizzes.graded.build import build
from quizzes.graded.draw import balanced_keys
from quizzes.graded.pool import build_pool
from quizzes.graded.private_bank import PrivateBankError, load_quiz

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_BANK = ROOT / "tests" / "fixtures" / "private_bank"
PADDING = {"en": ", in every case that matters here", "vi": ", trong mọi trường hợp quan trọng ở đây",
           "de": ", in jedem Fall, auf den es hier ankommt"}


def test_measure_counts_every_length_rank_and_shares_ties():
    items = [
        ChoiceItem("q1", {"a": "a long right answer", "b": "short", "c": "tiny", "d": "a b"}, "a"),  # longest
        ChoiceItem("q2", {"a": "same", "b": "also", "c": "much longer one", "d": "xy"}, "a"),  # 2nd, tied with b
        ChoiceItem("q3", {"a": "abc", "b": "abcdef", "c": "abcd", "d": "abcde"}, "c"),  # third-longest
    ]
    report = measure("en", items)
    assert report.questions == 3
    assert report.scores["the longest option"] == 1.0
    assert report.scores["the second-longest option"] == 0.5  # q2's "same" and "also" tie: a guess between them
    assert report.scores["the second-shortest option"] == 0.5 + 1.0
    # with four options everywhere, the third-longest picks what the second-shortest picks: reported once
    assert "the third-longest option" not in report.scores
    assert report.scores["option 1 as listed"] == 2.0 and report.scores["option 3 as listed"] == 1.0
    assert report.worst == "option 1 as listed" and not report.passes


def test_a_rank_or_position_a_question_lacks_counts_as_a_guess():
    items = [ChoiceItem("q1", {"a": "one", "b": "three"}, "b"),
             ChoiceItem("q2", {"a": "zzz", "b": "x", "c": "yy"}, "a")]
    report = measure("en", items)
    assert report.scores["option 3 as listed"] == pytest.approx(1 / 2)  # q1 has no third option: 1/2 by guessing
    assert report.scores["the third-shortest option"] == pytest.approx(1 / 2 + 1)


def test_markup_is_not_counted():
    assert shown_length("`empty_cache()`   **frees**") == len("empty_cache() frees")


@pytest.mark.parametrize(("lang", "plain", "careful"), [
    ("en", "It is reused right away", "Only when the stream is idle, because it may still be in use"),
    ("vi", "Nó được dùng lại ngay", "Chỉ khi luồng rảnh, vì nó có thể vẫn đang được dùng"),
    ("de", "Er wird sofort genutzt", "Nur wenn der Stream ruht, weil er noch benutzt werden kann"),
])
def test_qualification_counts_clauses_and_hedges_in_each_language(lang, plain, careful):
    assert qualification(plain, lang) == 0
    assert qualification(careful, lang) == 4  # a comma and three clause words ("only", "when", "because")
    qualified = next(s for s in strategies(4) if "qualified" in s.name)
    item = ChoiceItem("q", {"a": plain, "b": careful, "c": plain + " " + "x" * 80, "d": plain + "!"}, "b")
    assert qualified.weights(item, lang) == {"b": 1.0}  # not the longest (c): the careful-looking one


def test_the_practice_bank_passes_in_every_language():
    reports = cue_reports(practice_items(load_bank()))
    assert [r.lang for r in reports] == list(LANGS)
    for r in reports:
        assert r.questions >= 45 and r.passes, r.line()
        assert max(r.rate(s) for s in r.scores) <= MAX_CUE_RATE


def test_the_sample_private_bank_passes_in_every_language():
    reports = cue_reports(private_items(load_quiz(SAMPLE_BANK).questions))
    assert [r.lang for r in reports] == list(LANGS)  # its concept questions are written in all three
    assert all(r.passes for r in reports), [r.line() for r in reports]


def _single_questions(data: dict) -> list[dict]:
    return [q for q in data["questions"] if q["kind"] == "single"]


def _plant_second_longest(q: dict, lang: str) -> None:
    """The flaw issue 33 measured: the key padded to the second-longest option, and one distractor past it."""
    right = next(o for o in q["options"] if o["id"] == q["answer"])
    other = next(o for o in q["options"] if o["id"] != q["answer"])
    longest = max(shown_length(o["text"][lang]) for o in q["options"])
    right["text"][lang] += " " + "x" * (longest - shown_length(right["text"][lang]) + 2)
    other["text"][lang] += " " + "y" * (shown_length(right["text"][lang]) - shown_length(other["text"][lang]) + 2)


def _planted(tmp_path: Path, plant) -> list[str]:
    """A copy of the whole practice bank with `plant(question)` applied to every single-choice question."""
    paths = []
    for source in sorted(BANK_DIR.glob("*.json")):
        data = json.loads(source.read_text(encoding="utf-8"))
        for q in _single_questions(data):
            plant(q)
        path = tmp_path / source.name
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        paths.append(str(path))
    return paths


def test_check_refuses_a_bank_whose_second_longest_option_is_right(tmp_path: Path, capsys):
    files = _planted(tmp_path, lambda q: _plant_second_longest(q, "de"))  # one language is enough to fail
    assert main(["check", *files]) == 1
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and "practice bank" in errors[0]
    assert "de: picking the second-longest option scores 100%" in errors[0]
    assert "en:" not in errors[0] and "Traceback" not in captured.err and f"limit {MAX_CUE_RATE:.0%}" in errors[0]


def test_check_refuses_a_bank_whose_key_sits_at_one_position(tmp_path: Path, capsys):
    files = _planted(tmp_path, lambda q: q["options"].sort(key=lambda o: o["id"] != q["answer"]))  # key first
    assert main(["check", *files]) == 1
    err = capsys.readouterr().err
    assert all(f"{lang}: picking option 1 as listed scores 100%" in err for lang in LANGS)


def test_check_refuses_a_bank_whose_key_looks_the_most_careful(tmp_path: Path, capsys):
    def hedge(q: dict) -> None:  # the right option gets clauses the others lack; every option grows alike
        clause = ", but only if, and only because"
        for o in q["options"]:
            o["text"]["en"] += clause if o["id"] == q["answer"] else " " + "x" * (len(clause) - 1)
    assert main(["check", *_planted(tmp_path, hedge)]) == 1
    err = capsys.readouterr().err
    assert "en: picking the most qualified-looking option" in err and "vi:" not in err and "de:" not in err


def test_check_passes_the_practice_bank_and_the_sample_private_bank(capsys):
    assert main(["check", "--private-bank", str(SAMPLE_BANK)]) == 0
    out = capsys.readouterr().out
    assert "bank OK" in out and "private bank quiz1, de: at most: picking" in out


def _cued_private_bank(tmp_path: Path) -> Path:
    bank = tmp_path / "private"
    shutil.copytree(SAMPLE_BANK, bank)
    path = bank / "quiz1.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for q in data["questions"]:
        if q["kind"] == "single":
            right = next(o for o in q["options"] if o["id"] == q["answer"])
            for lang in LANGS:
                right["text"][lang] += PADDING[lang]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return bank


def test_check_fails_a_cued_private_bank(tmp_path: Path, capsys):
    assert main(["check", "--private-bank", str(_cued_private_bank(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert "quiz 'quiz1'" in err and "longest option scores 100%" in err and "Traceback" not in err


def test_build_graded_refuses_a_cued_private_bank_unless_allowed(tmp_path: Path, capsys):
    bank = _cued_private_bank(tmp_path)
    out = tmp_path / "source"
    assert main(["build-graded", "--bank", str(bank), "--new-secret", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "longest option scores 100%" in err and "--allow-cues" in err
    assert not (bank / "course.secret").exists() and not out.exists()  # refused before anything was written
    with pytest.raises(PrivateBankError, match="--allow-cues"):
        build(bank, bytes(range(32)), out_dir=out, progress=False)
    assert main(["build-graded", "--bank", str(bank), "--new-secret", "--out", str(out), "--allow-cues"]) == 0
    assert (out / "quiz1" / "quiz1.ipynb").is_file() and "wrote" in capsys.readouterr().out


# -- the draw balances where the right option is shown ------------------------------------------------------------

def _spread(positions: list[int]) -> int:
    counts = Counter(positions)
    return max(counts.values()) - min(counts.values())


def test_balanced_keys_use_every_position_equally_often():
    positions = balanced_keys([4] * 21 + [3] * 6, random.Random(5))
    fours, threes = positions[:21], positions[21:]
    assert set(fours) == {0, 1, 2, 3} and _spread(fours) <= 1
    assert set(threes) == {0, 1, 2} and _spread(threes) == 0


@pytest.mark.parametrize("seed", [0, 1, "alice"])
def test_a_practice_session_shows_the_key_at_every_position_equally_often(seed):
    bank = load_bank()
    singles = [q for q in bank if q.kind == "single"]
    session = PracticeSession(singles, seed=seed)
    for _ in range(2):  # this round, and the next one "Start again" shuffles anew
        shown = [[oid for oid, _ in item.options].index(bank[item.qid].answer) for item in session.items]
        assert len(shown) == len(singles) and _spread(shown) <= 1  # all have four options
        session.retry()


def test_the_graded_pool_shows_the_key_at_every_position_equally_often():
    quiz = load_quiz(SAMPLE_BANK)
    pool = build_pool(quiz, bytes(range(32)))
    singles = {x.id for x in quiz.questions if x.kind == "single"}
    letters = [q.expected[0] for q in pool.questions if q.source in singles]
    assert _spread(["abcd".index(x) for x in letters]) <= 1
    for question in (q for q in quiz.questions if q.kind == "diagnosis"):
        variants = [p for p in pool.questions if p.source.startswith(question.id + "#")]
        for index, part in enumerate(question.parts):
            if part.options:  # across the variants, the right letter of this part takes every place alike
                places = ["abcdefgh".index(v.expected[index]) for v in variants]
                assert _spread(places) <= 1 and len(set(places)) == min(len(part.options), len(variants)), part.id
