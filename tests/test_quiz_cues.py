"""The option-length cue rule: `python -m quizzes check` and `build-graded` refuse a bank a learner passes by
picking the longest (or the shortest) option of its single-choice questions, in any language."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quizzes import LANGS, load_bank
from quizzes.bank import BANK_DIR
from quizzes.cli import main
from quizzes.cues import MAX_CUE_RATE, ChoiceItem, cue_reports, measure, practice_items, private_items, shown_length
from quizzes.graded.build import build
from quizzes.graded.private_bank import PrivateBankError, load_quiz

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_BANK = ROOT / "tests" / "fixtures" / "private_bank"
PADDING = {"en": ", in every case that matters here", "vi": ", trong mọi trường hợp quan trọng ở đây",
           "de": ", in jedem Fall, auf den es hier ankommt"}


def test_measure_counts_the_longest_and_the_shortest_and_shares_ties():
    items = [
        ChoiceItem("q1", {"a": "a long right answer", "b": "short", "c": "tiny"}, "a"),  # longest wins
        ChoiceItem("q2", {"a": "same", "b": "also", "c": "much longer one"}, "a"),  # shortest tied with b: half
        ChoiceItem("q3", {"a": "abc", "b": "abcdef", "c": "abcd"}, "c"),  # neither
    ]
    report = measure("en", items)
    assert (report.questions, report.longest, report.shortest) == (3, 1.0, 0.5)
    assert report.longest_rate == pytest.approx(1 / 3) and report.passes


def test_markup_is_not_counted():
    assert shown_length("`empty_cache()`   **frees**") == len("empty_cache() frees")


def test_the_practice_bank_passes_in_every_language():
    reports = cue_reports(practice_items(load_bank()))
    assert [r.lang for r in reports] == list(LANGS)
    for r in reports:
        assert r.questions >= 40 and r.passes, r.line()


def test_the_sample_private_bank_passes():
    reports = cue_reports(private_items(load_quiz(SAMPLE_BANK).questions))
    assert reports and all(r.passes for r in reports), [r.line() for r in reports]


def _cued(options: list[dict], answer: str, langs: tuple[str, ...]) -> None:
    """Make the right option the longest, as the bank was before it was rewritten."""
    right = next(o for o in options if o["id"] == answer)
    for lang in langs:
        if lang in right["text"]:
            right["text"][lang] += PADDING[lang]


def test_check_fails_a_practice_bank_whose_longest_option_is_right(tmp_path: Path, capsys):
    data = json.loads((BANK_DIR / "ch2_fragmentation.json").read_text(encoding="utf-8"))
    for q in data["questions"]:
        if q["kind"] == "single":
            _cued(q["options"], q["answer"], ("vi",))  # one language is enough to fail
    path = tmp_path / "cued.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert len(errors) == 1 and "practice bank" in errors[0] and "vi: picking the longest option scores" in errors[0]
    assert "en:" not in errors[0] and "Traceback" not in captured.err
    assert f"limit {MAX_CUE_RATE:.0%}" in errors[0]


def test_check_passes_the_practice_bank_and_the_sample_private_bank(capsys):
    assert main(["check", "--private-bank", str(SAMPLE_BANK)]) == 0
    out = capsys.readouterr().out
    assert "bank OK" in out and "private bank quiz1, en: picking the longest option scores" in out


def _cued_private_bank(tmp_path: Path) -> Path:
    bank = tmp_path / "private"
    shutil.copytree(SAMPLE_BANK, bank)
    path = bank / "quiz1.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for q in data["questions"]:
        if q["kind"] == "single":
            _cued(q["options"], q["answer"], LANGS)
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
