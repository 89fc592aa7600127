"""replay, --check, diagnose (one file and across ranks) and serve-sim speak the notebook's language: no English
sentence in Vietnamese or German, the same figures, JSON with its English keys, and a command a translated chapter
starts answers in the chapter's language."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_diagnose import diverging_snapshot, oom_snapshot, write_rank_snapshots

from course_i18n.english_scan import english_sentences
from minialloc.cli import main
from minialloc.lang import set_lang, using
from minialloc.sizes import format_size, pytorch_format_size

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("english_by_default")  # tests/conftest.py


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("snapshots")
    out = {"oom": folder / "oom.pickle", "diverging": folder / "diverging.pickle"}
    out["oom"].write_bytes(pickle.dumps(oom_snapshot()))
    out["diverging"].write_bytes(pickle.dumps(diverging_snapshot()))
    ranks = folder / "ranks"
    ranks.mkdir()
    write_rank_snapshots(ranks)
    out["ranks"] = ranks
    return out


COMMANDS = {
    "replay": ["replay", "{oom}", "--conf", "", "--no-fit"],  # every config fails: the failure lines, fragmentation
    "replay-fits": ["replay", "{oom}", "--no-fit"],  # re-laid rows, a setting that saves the run
    "replay-capacity": ["replay", "{oom}", "--capacity", "1GB", "--conf", "", "--no-fit"],  # the decimal hint
    "check": ["replay", "{oom}", "--check"],  # the recorded OOM reproduced
    "check-diverging": ["replay", "{diverging}", "--check"],  # a divergence, explained
    "diagnose": ["diagnose", "{oom}"],  # at the failure, with a verdict
    "diagnose-diverging": ["diagnose", "{diverging}", "--no-replay"],  # the warning
    "ranks": ["diagnose", "{ranks}"],  # the table across ranks and which one failed
    "serve-sim": ["serve-sim", "--requests", "60", "--sharing-requests", "20"],  # chapter 4's table
}


def _run(command: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main([arg.format(**files) for arg in COMMANDS[command]])
    return status, capsys.readouterr().out


@pytest.mark.parametrize("lang", ["vi", "de"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_reports_speak_the_notebooks_language(command: str, lang: str, files: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    english_status, english = _run(command, files, capsys)
    assert english_sentences(english), f"the English report has no sentence to compare: {english}"
    with using(lang):
        status, translated = _run(command, files, capsys)
    assert status == english_status
    assert english_sentences(translated) == [], translated
    # the same figures (a sentence may order them differently): only words changed
    assert _figures(translated, files) == _figures(english, files)


def _figures(text: str, files: dict[str, Path]) -> list[str]:
    for path in files.values():
        text = text.replace(str(path.parent), "")  # the scratch folder's name has digits of its own
    text = re.sub(r"\(\d+\.\d s\)$", "", text.strip())  # serve-sim's own running time differs between runs
    return sorted(re.findall(r"\d+(?:\.\d+)?", text))


def test_json_keeps_its_english_keys(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["diagnose", str(files["oom"]), "--json"])
    english = json.loads(capsys.readouterr().out)
    with using("de"):
        main(["diagnose", str(files["oom"]), "--json"])
    german = json.loads(capsys.readouterr().out)
    (dev_en,), (dev_de,) = english["devices"], german["devices"]
    assert dev_de.keys() == dev_en.keys() and dev_de["moment"] == "failure"
    assert [h["frame"] for h in dev_de["holders"]] == [h["frame"] for h in dev_en["holders"]]
    assert [r["label"] for r in dev_de["rows"]] == [r["label"] for r in dev_en["rows"]]


def test_bytes_are_a_word_of_the_language_and_pytorchs_stay_english() -> None:
    with using("de"):
        assert format_size(0) == "0 Byte" and format_size(3 * 2**20) == "3.00 MiB"
        assert pytorch_format_size(512) == "512 bytes"  # PyTorch's OOM message, byte for byte
    assert format_size(512) == "512 bytes"


def test_a_command_a_translated_chapter_starts_answers_in_its_language(files: dict[str, Path]) -> None:
    set_lang("vi")  # what the chapter's first cell does; the subprocess inherits nothing else
    out = subprocess.run([sys.executable, "-m", "minialloc", "replay", str(files["oom"]), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert "lần cấp phát nằm ở địa chỉ đã ghi" in out.stdout and english_sentences(out.stdout) == [], out
