"""Every notebook of the course, every lab's solution and every quiz notebook runs top to bottom on the CPU.

Course chapters 1..6, in English and in the translations (course/vi/, course/de/), are run by
tests/test_course_exercises.py (blank and with their solutions), and course/solutions/ holds cells, not notebooks to
run: both are left out here, so no chapter runs three times. The start page runs here in every language, and a
translated one's outputs are scanned for English sentences, as the chapters' are.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_DIRS = {ROOT / "course", ROOT / "course" / "vi", ROOT / "course" / "de"}
NOTEBOOKS = sorted(
    p for folder in ("course", "labs/source", "quizzes") for p in (ROOT / folder).rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts and "solutions" not in p.relative_to(ROOT).parts
    and not (p.parent in CHAPTER_DIRS and p.name[:2] in {f"0{n}" for n in range(1, 7)})
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch):
    monkeypatch.setenv("MINIALLOC_DEVICE", "sim")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    if path.parent in CHAPTER_DIRS - {ROOT / "course"}:  # a translated start page: no English sentence in sight
        from test_course_exercises import untranslated_outputs

        english = untranslated_outputs(nb.cells)
        assert not english, f"{path.relative_to(ROOT)}: English in the outputs:\n" + "\n".join(english)


def test_there_are_notebooks():
    assert any(p.parts[-2] == "course" for p in NOTEBOOKS)
