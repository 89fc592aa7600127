"""Every course chapter 1..6 runs twice: as committed (predictions and exercises blank: each says "not yet" and
nothing raises) and with course/solutions/ substituted (each prediction "right", each exercise "passed"). The
Vietnamese and German chapters built from the catalogs (course/vi/, course/de/) run the same way, with the same
solutions: translation leaves every learner-editable cell's id and code in place.

The blank run is also the chapter's "does it run top to bottom" test: tests/test_notebooks.py leaves chapters
1..6 to this file so they are not executed a third time.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "course"
SOLUTIONS = COURSE / "solutions"
ENGLISH = sorted(p for n in range(1, 7) for p in COURSE.glob(f"0{n}_*.ipynb"))
TRANSLATED = sorted(p for lang in ("vi", "de") for n in range(1, 7) for p in (COURSE / lang).glob(f"0{n}_*.ipynb"))
CHAPTERS = ENGLISH + TRANSLATED
TAGS = ("predict", "exercise")
MARK = "MINIALLOC-LEARN-RESULTS:"


def tagged(nb: nbformat.NotebookNode) -> dict[str, tuple[str, nbformat.NotebookNode]]:
    """id -> (tag, cell) for every learner-editable cell of a notebook."""
    out: dict[str, tuple[str, nbformat.NotebookNode]] = {}
    for cell in nb.cells:
        tags = [t for t in cell.metadata.get("tags", []) if t in TAGS]
        if not tags:
            continue
        assert cell.cell_type == "code", f"a {tags[0]} cell must be a code cell: {cell.source[:60]!r}"
        eid = cell.metadata.get("minialloc", {}).get("id")
        assert eid, f"a {tags[0]} cell has no metadata.minialloc.id: {cell.source[:60]!r}"
        assert eid not in out, f"id {eid!r} is used by two cells"
        out[eid] = (tags[0], cell)
    return out


def solutions(chapter: Path) -> dict[str, str]:
    path = SOLUTIONS / chapter.name
    if not path.exists():
        return {}
    nb = nbformat.read(path, as_version=4)
    return {c.metadata["minialloc"]["id"]: c.source for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("minialloc", {}).get("id")}


def workdir(chapter: Path, tmp_path: Path) -> Path:
    """Where the chapter runs: a scratch course/ (its data/ linked in, a folder per language), so what a chapter
    writes (run.pickle, fragmented.pickle, ...) never lands in the checkout and two runs never share a file."""
    course = tmp_path / "course"
    course.mkdir()
    (course / "data").symlink_to(COURSE / "data", target_is_directory=True)
    here = course if chapter.parent == COURSE else course / chapter.parent.name
    here.mkdir(exist_ok=True)
    return here


def run(nb: nbformat.NotebookNode, chapter: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Execute the notebook with a last cell that prints learn.results(); return them."""
    monkeypatch.setenv("MINIALLOC_DEVICE", "sim")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import json\nfrom minialloc import learn\nprint({MARK!r} + json.dumps(learn.results()))"))
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir(chapter, tmp_path))}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith(MARK))
    return json.loads(line[len(MARK):])


IDS = [p.stem[:2] if p.parent == COURSE else f"{p.parent.name}-{p.stem[:2]}" for p in CHAPTERS]


def test_there_are_six_chapters() -> None:
    assert len(ENGLISH) == 6, [p.name for p in ENGLISH]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_chapter_has_predictions_and_exercises(chapter: Path) -> None:
    cells = tagged(nbformat.read(chapter, as_version=4))
    predict = [i for i, (tag, _) in cells.items() if tag == "predict"]
    exercise = [i for i, (tag, _) in cells.items() if tag == "exercise"]
    assert len(predict) >= 3, f"{chapter.name}: {len(predict)} predict cells, at least 3 wanted"
    assert len(exercise) >= 2, f"{chapter.name}: {len(exercise)} exercise cells, at least 2 wanted"
    for eid, (tag, cell) in cells.items():
        src = cell.source
        if tag == "predict":
            assert "= ..." in src, f"{eid}: a blank prediction is `name = ...`"
        else:
            assert "raise NotImplementedError" in src or "..." in src, f"{eid}: the exercise is not blank"
    missing = sorted(set(cells) - set(solutions(chapter)))
    assert not missing, f"{chapter.name}: no solution in course/solutions/{chapter.name} for {missing}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_chapter_runs_blank(chapter: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nb = nbformat.read(chapter, as_version=4)
    ids = set(tagged(nb))
    results = run(nb, chapter, monkeypatch, tmp_path)
    assert set(results) == ids, f"ids revealed/checked {sorted(results)} but tagged {sorted(ids)}"
    assert all(v == "not yet" for v in results.values()), results


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_chapter_runs_with_solutions(chapter: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nb = nbformat.read(chapter, as_version=4)
    cells = tagged(nb)
    filled = solutions(chapter)
    assert (SOLUTIONS / chapter.name).exists(), f"course/solutions/{chapter.name} is missing"
    for eid, (_, cell) in cells.items():
        assert eid in filled, f"no solution for {eid}"
        cell.source = filled[eid]
    results = run(nb, chapter, monkeypatch, tmp_path)
    assert set(results) == set(cells)
    bad = {k: v for k, v in results.items() if v not in ("right", "passed")}
    assert not bad, f"with the solutions filled in, these did not pass: {bad}"
