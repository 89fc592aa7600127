"""Every notebook of the course, every lab's solution and every quiz notebook runs top to bottom on the CPU.

Course chapters 1..6, in English and in the translations (course/vi/, course/de/), are run by
tests/test_course_exercises.py (blank and with their solutions), chapter 7 by tests/test_capstone.py, and
course/solutions/ holds cells, not notebooks to run: all are left out here, so no chapter runs three times. The
start page runs here in every language, and a translated one's outputs are scanned for English sentences, as the
chapters' are.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_i18n.english_scan import english_sentences, learner_texts

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_DIRS = {ROOT / "course", ROOT / "course" / "vi", ROOT / "course" / "de"}
NOTEBOOKS = sorted(
    p for folder in ("course", "labs/source", "quizzes") for p in (ROOT / folder).rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts and "solutions" not in p.relative_to(ROOT).parts
    and not (p.parent in CHAPTER_DIRS and p.name[:2] in {f"0{n}" for n in range(1, 8)})
)

# the translated labs whose tests and checks say everything in the lab's language (MESSAGES in the setup cell);
SPEAKING_LABS = ("lab1_best_fit", "lab2_fragmentation_oom", "lab3_page_mapping", "lab4_block_table_cow")
TRANSLATED = ("vi", "de")
BLANK_LABS = [ROOT / "labs" / "student" / f"{lab}_{lang}" / f"{lab}_{lang}.ipynb"
              for lab in SPEAKING_LABS for lang in TRANSLATED]
ALLOWED_ENGLISH = (
    # PyTorch's out-of-memory message, byte for byte as a learner meets it in real life (chapter 0 says so)
    re.compile(r"CUDA out of memory\. Tried to allocate [^\n]*"),
)


def english_in_outputs(nb: nbformat.NotebookNode) -> list[str]:
    return [s for _, text in learner_texts(nb.cells) for s in english_sentences(text, ALLOWED_ENGLISH)]


def speaks_its_language(path: Path) -> bool:
    return any(path.parent.name == f"{lab}_{lang}" for lab in SPEAKING_LABS for lang in TRANSLATED)


def execute(path: Path, monkeypatch, allow_errors: bool = False) -> nbformat.NotebookNode:
    monkeypatch.setenv("MINIALLOC_DEVICE", "sim")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("MINIALLOC_LANG", raising=False)  # the notebook chooses its language itself
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error (unless allow_errors)
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch):
    nb = execute(path, monkeypatch)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    if speaks_its_language(path):  # a translated lab with its solutions, read as a learner reads it
        assert english_in_outputs(nb) == []
    if path.name == "00_start_here.ipynb":  # the start page shows chapter 2's failure, not its answers
        from test_course_exercises import answers_in_sight

        # (its first taste, a 3 MiB request in a 20 MiB segment, is chapter 1's first rule, taught on purpose)
        shown = answers_in_sight(ROOT / "course" / "02_fragmentation.ipynb", nb)
        assert not shown, f"{path.relative_to(ROOT)} shows a prediction's answer:\n" + "\n".join(shown)
    if path.parent in CHAPTER_DIRS - {ROOT / "course"}:  # a translated start page: no English sentence in sight
        from test_course_exercises import untranslated_outputs

        english = untranslated_outputs(nb.cells)
        assert not english, f"{path.relative_to(ROOT)}: English in the outputs:\n" + "\n".join(english)


@pytest.mark.parametrize("path", BLANK_LABS, ids=[p.parent.name for p in BLANK_LABS])
def test_a_blank_translated_lab_speaks_its_language(path: Path, monkeypatch):
    """The student version, run as a learner first runs it (no answer yet): its tests fail, in the lab's language."""
    nb = execute(path, monkeypatch, allow_errors=True)
    failed = [o.ename for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert "NotImplementedError" in failed  # the run reached the tests and they failed on the blank answers
    assert english_in_outputs(nb) == []


def test_the_output_scan_reads_what_a_learner_reads():
    """The scan finds an English check in a translated notebook's output, and leaves Python's and PyTorch's own
    English alone."""
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [
        nbformat.v4.new_output("stream", text="Schritt 3: reserviert 2 MiB\n"),
        nbformat.v4.new_output("error", ename="NameError", evalue="name 'trace' is not defined", traceback=[]),
        nbformat.v4.new_output("stream", text="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                              "capacity of 8.00 GiB of which 1.44 GiB is free.\n"),
    ]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert english_in_outputs(nb) == []
    cell.outputs.append(nbformat.v4.new_output("error", ename="AssertionError",
                                               evalue="every event succeeded: the last one must fail", traceback=[]))
    assert english_in_outputs(nb) == ["the last one must fail"]
    assert all(speaks_its_language(p) for p in BLANK_LABS) and len(BLANK_LABS) == 2 * len(SPEAKING_LABS)


def test_there_are_notebooks():
    assert any(p.parts[-2] == "course" for p in NOTEBOOKS)
