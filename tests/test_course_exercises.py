"""Every course chapter 1..6 runs twice: as committed (predictions and exercises blank: each says "not yet" and
nothing raises) and with course/solutions/ substituted (each prediction "right", each exercise "passed"). The
Vietnamese and German chapters built from the catalogs (course/vi/, course/de/) run the same way, with the same
solutions: translation leaves every learner-editable cell's id and code in place.

The blank run is also the chapter's "does it run top to bottom" test: tests/test_notebooks.py leaves chapters
1..6 to this file so they are not executed a third time.
"""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from course_i18n.english_scan import english_sentences, learner_texts

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
    if chapter.parent != COURSE:  # the same run, read as a learner of that language: no English sentence
        english = untranslated_outputs(nb.cells[:-1])
        assert not english, f"{chapter.parent.name}/{chapter.name}: English in the outputs:\n" + "\n".join(english)
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith(MARK))
    return json.loads(line[len(MARK):])


# What a translated chapter may show in English: PyTorch's own OOM message and memory_summary() (what the learner
# meets in real life, byte for byte; chapter 0 says so and the chapters gloss their fields), the lines PyTorch's
# memory viewer prints, and code (chapter 1 prints minialloc's functions with inspect.getsource).
ALLOWED_ENGLISH = [
    re.compile(r"^( *)def \w+\(.*(?:\n(?:\1 +\S.*)?)*", re.M),  # a printed function: its def and indented body
    re.compile(r"CUDA out of memory\. Tried to allocate .*?(?:\(https?://\S+\)|$)", re.S | re.M),
    re.compile(r"^\|.*\|$", re.M),  # memory_summary()'s table rows
    re.compile(r"^(?:segments|total)\b.*$", re.M),  # torch.cuda._memory_viz stats
    # the message's and the table's own words, quoted where the text glosses them (the glossaries allow
    # "out of memory" as a term in both languages)
    "Tried to allocate", "reserved but unallocated", "out of memory", "Allocated memory", "Active memory",
    "Requested memory", "GPU reserved memory", "Non-releasable memory",
]


def untranslated_outputs(cells: list[nbformat.NotebookNode]) -> list[str]:
    """'[cell n] sentence' for every English sentence in the outputs a learner reads."""
    return [f"[cell {n}] {sentence}" for n, text in learner_texts(cells)
            for sentence in english_sentences(text, ALLOWED_ENGLISH)]


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
    # the same run, read as a learner who pressed Run All: nothing before a prediction gives its answer away
    spoilers = [problem for pid, cell in predictions(nb) for problem in spoiled(nb, pid, cell, answer_of(chapter, pid))]
    # ... nor anywhere after it: Run All leaves every prediction blank, so no later output, markdown or source may
    # state an answer either (a later exhibit that shows it waits for the prediction)
    spoilers += [problem for pid, cell in predictions(nb)
                 for problem in spoiled_later(nb, pid, cell, answer_of(chapter, pid))]
    assert not spoilers, "\n".join(spoilers)


# --- predict-first: no answer in sight before the learner commits ------------------------------------------------


def predictions(nb: nbformat.NotebookNode) -> list[tuple[str, int]]:
    """(id, index of the predict cell) of every prediction, in order."""
    return [(cell.metadata["minialloc"]["id"], i) for i, cell in enumerate(nb.cells)
            if "predict" in cell.metadata.get("tags", [])]


def reveal_cell(nb: nbformat.NotebookNode, pid: str, at: int) -> int:
    """The cell after prediction ``pid`` that reveals it."""
    return next(i for i in range(at + 1, len(nb.cells))
                if nb.cells[i].cell_type == "code" and f'learn.reveal("{pid}"' in nb.cells[i].source)


def answer_of(chapter: Path, pid: str) -> Any:
    """The reference answer of prediction ``pid``: the value course/solutions/ assigns ("20 MiB" and 20 * MiB
    alike read as a byte count)."""
    from minialloc import sizes

    def as_bytes(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(as_bytes(v) for v in value)
        if isinstance(value, str):
            try:
                return sizes.parse_size(value)
            except ValueError:
                return value
        return value

    expression = solutions(chapter)[pid].split("=", 1)[1]
    units = {"KiB": sizes.KiB, "MiB": sizes.MiB, "GiB": sizes.GiB}
    return as_bytes(eval(compile(ast.parse(expression.strip(), mode="eval"), pid, "eval"), units))  # noqa: S307


def answer_forms(answer: Any) -> list[str]:
    """How an answer would read if some text printed it: byte counts in PyTorch's and minialloc's units, shares as
    percentages, tuples whole. Short numbers, booleans, page lists and words are left to the reveal cell's own rule
    below (nothing printed after its "not yet" line)."""
    from minialloc.sizes import format_size, readable_size

    if isinstance(answer, tuple):  # a byte count alone may be a rule's example (2 MiB segments): the whole tuple
        from minialloc.learn import _show

        return [repr(answer), _show(answer)]
    if isinstance(answer, int) and not isinstance(answer, bool) and answer >= 1024:
        return sorted({format_size(answer), readable_size(answer)})
    if isinstance(answer, float) and 0 < answer <= 1:
        return [f"{answer:.0%}", f"{answer:.1%}"]
    return []


def _output_text(output: nbformat.NotebookNode) -> str:
    return output.get("text", "") if output.output_type == "stream" else output.get("data", {}).get("text/plain", "")


def _html_text(output: nbformat.NotebookNode) -> str:
    """An output's HTML as the words it shows (a widget's static fallback: the stepper's key frames' captions)."""
    markup = output.get("data", {}).get("text/html", "") if output.output_type != "stream" else ""
    markup = re.sub(r'src="data:[^"]*"', "", markup)  # the embedded pictures' bytes are no words
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def _text_of(cell: nbformat.NotebookNode) -> list[str]:
    return [cell.source, *(_output_text(o) for o in cell.get("outputs", []))]


def spoiled(nb: nbformat.NotebookNode, pid: str, at: int, answer: Any) -> list[str]:
    """What a learner sees before committing to prediction ``pid`` that gives it away: the answer in any markdown,
    source or output leading up to the reveal cell's own verdict; an explanation in the reveal cell's visible
    source; or output after the "not yet" line that a blank reveal cell still prints."""
    problems = []
    reveal = reveal_cell(nb, pid, at)
    # what leads up to this prediction: everything since the previous reveal (a size taught chapters ago, such as
    # the 20 MiB segment, is a rule to apply, not a spoiler)
    start = max((reveal_cell(nb, p, i) + 1 for p, i in predictions(nb) if i < at), default=0)
    seen = [text for cell in nb.cells[start:reveal] for text in _text_of(cell)] + [nb.cells[reveal].source]
    for form in answer_forms(answer):
        if any(re.search(rf"(?<![\d.,]){re.escape(form)}", text) for text in seen):
            problems.append(f"{pid}: the answer {form!r} is in sight before the prediction")
    if "why(" not in nb.cells[reveal].source:
        problems.append(f"{pid}: the reveal cell's source holds its explanation (use chapterN.why)")
    outputs = nb.cells[reveal].get("outputs", [])
    verdict = [i for i, o in enumerate(outputs) if f"[{pid}]" in _output_text(o)]
    if not verdict:
        problems.append(f"{pid}: the blank reveal cell printed no 'not yet' line")
    elif [o for o in outputs[verdict[-1] + 1:] if o.output_type != "execute_result"]:
        problems.append(f"{pid}: the blank reveal cell prints more after 'not yet' (hold it back until predicted)")
    return problems


def later_forms(nb: nbformat.NotebookNode, at: int, answer: Any) -> list[str]:
    """The forms of an answer a later cell must not show: the whole answer's, and for a tuple each byte count in
    it that no cell up to the prediction states (a size given in the question, or taught before it, is a rule to
    apply; one first printed after it is the learner's to work out)."""
    forms = answer_forms(answer)
    if isinstance(answer, tuple):
        before = "\n".join(text for cell in nb.cells[:at + 1] for text in _text_of(cell))
        for part in answer:
            part_forms = answer_forms(part) if isinstance(part, int) and part >= 1024 * 1024 else []
            if part_forms and not any(re.search(rf"(?<![\d.,]){re.escape(f)}", before) for f in part_forms):
                forms += part_forms
    return forms


def spoiled_later(nb: nbformat.NotebookNode, pid: str, at: int, answer: Any) -> list[str]:
    """The answer of prediction ``pid`` anywhere after its reveal cell, in a blank Run All: any output, markdown or
    source; and a word answer quoted in the reveal cell's own source (a check that holds its answer)."""
    problems = []
    reveal = reveal_cell(nb, pid, at)
    for n in range(reveal, len(nb.cells)):
        texts = _text_of(nb.cells[n])[1:] if n == reveal else _text_of(nb.cells[n])
        texts += [_html_text(o) for o in nb.cells[n].get("outputs", [])]  # what a page without widgets shows
        for form in later_forms(nb, at, answer):
            if any(re.search(rf"(?<![\d.,]){re.escape(form)}", text) for text in texts):
                problems.append(f"{pid}: the answer {form!r} is shown in cell {n}, after the prediction, before it "
                                "is made")
    # the answer written into the check itself (learn.reveal("c6-canary", canary_decision, "roll back", ...)), not
    # computed: a word answer among the choices a computation picks from ("lower" if ... else "higher") is fine
    literal = rf"""learn\.reveal\(\s*["']{re.escape(pid)}["']\s*,\s*\w+\s*,\s*["']{re.escape(str(answer))}["']"""
    if isinstance(answer, str) and re.search(literal, nb.cells[reveal].source, re.I):
        problems.append(f"{pid}: the check cell's source holds the answer {answer!r}")
    return problems


def answers_in_sight(chapter: Path, nb: nbformat.NotebookNode) -> list[str]:
    """The answers of ``chapter``'s predictions that notebook ``nb`` (another one, such as the start page) shows in
    its markdown or outputs: the whole answer's forms and each byte count of a tuple answer."""
    problems = []
    for pid, _ in predictions(nbformat.read(chapter, as_version=4)):
        answer = answer_of(chapter, pid)
        parts = [p for p in answer if isinstance(p, int) and p >= 1024 * 1024] if isinstance(answer, tuple) else []
        for form in answer_forms(answer) + [f for p in parts for f in answer_forms(p)]:
            for n, cell in enumerate(nb.cells):
                texts = _text_of(cell) if cell.cell_type == "markdown" else _text_of(cell)[1:]
                if any(re.search(rf"(?<![\d.,]){re.escape(form)}", text) for text in texts):
                    problems.append(f"{pid}: its answer {form!r} is in cell {n}")
    return problems


# --- every check cell idempotent: the same answer, checked twice, before and after, gets the same verdict ---------


def checker_cell(nb: nbformat.NotebookNode, eid: str, at: int) -> int:
    return next(i for i in range(at + 1, len(nb.cells))
                if nb.cells[i].cell_type == "code" and f'"{eid}"' in nb.cells[i].source)


@pytest.mark.parametrize("chapter", ENGLISH, ids=[p.stem[:2] for p in ENGLISH])
def test_every_check_cell_gives_the_same_verdict_twice(chapter: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """Each prediction or exercise, in its place in the chapter: blank, checked twice; filled with the solution,
    checked twice; blank again, checked once more. The verdicts must be not yet, not yet, right, right, not yet:
    a check cell that changes state an earlier cell built (and so judges a rerun differently) fails here."""
    nb = nbformat.read(chapter, as_version=4)
    filled = solutions(chapter)
    cells = list(nb.cells)
    plan: list[tuple[int, str, str, int]] = []  # (index of the tagged cell, id, blank source, index of its check)
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and set(cell.metadata.get("tags", [])) & set(TAGS):
            eid = cell.metadata["minialloc"]["id"]
            plan.append((i, eid, cell.source, checker_cell(nb, eid, i)))
    probe = "learn_verdicts.setdefault({eid!r}, []).append(__import__('minialloc').learn.results().get({eid!r}))"
    new_cells = [nbformat.v4.new_code_cell("learn_verdicts = {}")]
    for i, cell in enumerate(cells):
        new_cells.append(cell)
        for _, eid, blank, check in plan:
            if i != check:
                continue
            rounds = [(None, 2), (filled[eid], 2), (blank, 1)]
            for source, times in rounds:
                if source is not None:
                    new_cells.append(nbformat.v4.new_code_cell(source))
                for _ in range(times):
                    new_cells.append(nbformat.v4.new_code_cell(cells[check].source))
                    new_cells.append(nbformat.v4.new_code_cell(probe.format(eid=eid)))
            new_cells.append(nbformat.v4.new_code_cell(filled[eid]))  # leave it solved for the cells after it
            new_cells.append(nbformat.v4.new_code_cell(cells[check].source))
    new_cells.append(nbformat.v4.new_code_cell(
        f"import json\nprint({MARK!r} + json.dumps(learn_verdicts))"))
    nb.cells = new_cells
    monkeypatch.setenv("MINIALLOC_DEVICE", "sim")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir(chapter, tmp_path))}})
    client.execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    verdicts = json.loads(next(ln for ln in text.splitlines() if ln.startswith(MARK))[len(MARK):])
    assert set(verdicts) == {eid for _, eid, _, _ in plan}
    for eid, seen in verdicts.items():
        good = "right" if eid in {pid for pid, _ in predictions(nbformat.read(chapter, as_version=4))} else "passed"
        assert seen == ["not yet", "not yet", good, good, "not yet"], f"{eid}: verdicts {seen}"


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


def _shown_text(cell: nbformat.NotebookNode) -> str:
    """What a cell printed, as text (a figure's or a widget's repr left out: it names an object, not a verdict)."""
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.get("text", ""))
        elif o.output_type in ("display_data", "execute_result") and not any(
                k.startswith(("image/", "application/vnd.jupyter.widget")) for k in o.get("data", {})):
            parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.mark.parametrize("chapter", ENGLISH, ids=[p.stem[:2] for p in ENGLISH])
def test_every_check_cell_judges_the_same_out_of_order(chapter: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """With the solutions filled in and the chapter run once, every check cell runs again in reverse order, each
    one after the cells that follow it (a learner who scrolls back and re-runs, as a "not yet" line invites), then
    once more in order: each gives the same verdict and prints the same text, its explanation included, as the
    first time."""
    nb = nbformat.read(chapter, as_version=4)
    filled = solutions(chapter)
    order: list[tuple[str, int]] = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and set(cell.metadata.get("tags", [])) & set(TAGS):
            eid = cell.metadata["minialloc"]["id"]
            cell.source = filled[eid]
            order.append((eid, checker_cell(nb, eid, i)))
    probe = "learn_again.append((__import__('minialloc').learn.results().get({eid!r}), {eid!r}))"
    reruns: list[tuple[str, int, int]] = []  # (id, index of the first run, index of the rerun)
    nb.cells.append(nbformat.v4.new_code_cell("learn_again = []"))
    for eid, check in [*reversed(order), *order]:  # backwards, then forwards: c2-step1 again before c2-largest-free
        nb.cells.append(nbformat.v4.new_code_cell(nb.cells[check].source))
        reruns.append((eid, check, len(nb.cells) - 1))
        nb.cells.append(nbformat.v4.new_code_cell(probe.format(eid=eid)))
    nb.cells.append(nbformat.v4.new_code_cell(f"import json\nprint({MARK!r} + json.dumps(learn_again))"))
    monkeypatch.setenv("MINIALLOC_DEVICE", "sim")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(workdir(chapter, tmp_path))}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    again = json.loads(next(ln for ln in text.splitlines() if ln.startswith(MARK))[len(MARK):])
    kinds = tagged(nb)
    assert [v for v, _ in again] == ["right" if kinds[eid][0] == "predict" else "passed" for _, eid in again], again
    for eid, first, rerun in reruns:
        assert _shown_text(nb.cells[rerun]) == _shown_text(nb.cells[first]), f"{eid}: rerun out of order differs"


@pytest.mark.parametrize("chapter", ENGLISH, ids=[p.stem[:2] for p in ENGLISH])
def test_no_chapter_cell_starts_minialloc_in_a_new_process(chapter: Path) -> None:
    """A chapter's cells call minialloc's tools in the kernel, on what the chapter has already read: a new
    `python -m minialloc ...` process per run loads and validates the snapshot again (chapter 5 took 52 s so)."""
    for cell in nbformat.read(chapter, as_version=4).cells:
        if cell.cell_type == "code":
            assert not re.search(r"""["']-m["'],\s*["']minialloc["']""", cell.source), cell.source[:200]
