"""The graded quiz: private bank + course secret -> prompts-only notebook; answers read as data; graded outside.

Built from the sample private bank in tests/fixtures/private_bank/ with a secret made for the test. The module's
course runs nbgrader's own generate_assignment once (about 10 s) and executes one filled release with nbclient.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.nbgraderformat import MetadataValidator

from minialloc.sizes import GiB, KiB, MiB
from quizzes.cli import main
from quizzes.graded import QuestionScore, grade_notebook, read_answers
from quizzes.graded.answers import AnswerError, AnswerForm, Unreadable, parse_answer
from quizzes.graded.build import build, build_notebook
from quizzes.graded.diagnosis import SCENARIOS, generate
from quizzes.graded.draw import draw
from quizzes.graded.pool import build_pool, load_pool
from quizzes.graded.private_bank import PrivateBankError, load_quiz
from quizzes.graded.scoring import GradingSetupError, reference_answers
from quizzes.graded.secret import SecretError, load_secret, new_secret, rng

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_BANK = ROOT / "tests" / "fixtures" / "private_bank"
STUDENTS = [f"student-{i:03d}" for i in range(300)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> dict:
    """A private bank (the sample), its secret, and the notebook build-graded writes into a course's source/."""
    root = tmp_path_factory.mktemp("graded")
    bank = root / "private"
    shutil.copytree(SAMPLE_BANK, bank)
    assert main(["build-graded", "--bank", str(bank), "--new-secret", "--out", str(root / "course" / "source")]) == 0
    secret = load_secret(bank / "course.secret")
    return {"root": root, "bank": bank, "secret": secret, "course": root / "course",
            "source": root / "course" / "source" / "quiz1" / "quiz1.ipynb", "pool": load_pool(bank, secret)}


def _submission(course: dict, answers: dict, claimed_id: str = "someone", extra: str = "") -> nbformat.NotebookNode:
    """The notebook with answers written the way the notebook asks: one literal per answer cell."""
    nb = nbformat.read(course["source"], as_version=4)
    for cell in nb.cells:
        if cell.get("id") == "student-id":
            cell.source = f'STUDENT_ID = "{claimed_id}"'
        m = re.fullmatch(r"(p\d+)-answer", cell.get("id", ""))
        if m and m.group(1) in answers:
            cell.source = f'answers["{m.group(1)}"] = {answers[m.group(1)]!r}' + extra
    return nb


def _total(scores: list[QuestionScore]) -> float:
    return round(sum(s.points for s in scores), 4)


# -- the private bank and the secret ---------------------------------------------------------------------------

def test_sample_bank_loads_and_bad_entries_are_named(tmp_path: Path):
    quiz = load_quiz(SAMPLE_BANK)
    assert quiz.name == "quiz1" and quiz.max_score == 35
    raw = json.loads((SAMPLE_BANK / "quiz1.json").read_text(encoding="utf-8"))
    for mutate, message in [
        (lambda r: r["questions"][0].update(answer="z"), r"question 'why-cache-frees': field 'answer'"),
        (lambda r: r["questions"][-1]["parts"][0]["options"].pop(0), r"exactly one option must mean"),
        (lambda r: r["questions"][-1]["parts"][0]["options"][0].update(means="fragmentatoin"), r"means"),
        (lambda r: r["tiers"][1].update(count=99), r"tiers\[1\].count.*pool of 32"),
        (lambda r: r["questions"][-1].update(scenario="nope"), r"field 'scenario'"),
    ]:
        bad = json.loads(json.dumps(raw))
        mutate(bad)
        (tmp_path / "quiz1.json").write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(PrivateBankError, match=message):
            load_quiz(tmp_path)


def test_secret_file_is_private_and_never_replaced(tmp_path: Path):
    path = new_secret(tmp_path / "s")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(load_secret(path)) == 32
    with pytest.raises(SecretError, match="exists"):
        new_secret(path)
    path.chmod(0o644)
    with pytest.raises(SecretError, match="other users"):
        load_secret(path)
    with pytest.raises(SecretError, match="inside the git work tree"):
        new_secret(SAMPLE_BANK / "course.secret")
    assert not (SAMPLE_BANK / "course.secret").exists()
    (tmp_path / "short").write_text("abcd")
    (tmp_path / "short").chmod(0o600)
    with pytest.raises(SecretError, match="at least 32 bytes"):
        load_secret(tmp_path / "short")


# -- the pool: 40+ questions per quiz, diagnosis made on minialloc, keyed by the secret ---------------------------

def test_pool_size_and_draw_plan(course: dict):
    pool = course["pool"]
    assert len(pool.questions) >= 40
    assert pool.sheet().slot_count >= 15
    assert len({q.markdown for q in pool.questions}) == len(pool.questions)  # no two prompts alike


def test_pool_depends_on_the_secret_and_only_on_it():
    quiz = load_quiz(SAMPLE_BANK)
    a1, a2, b = build_pool(quiz, bytes(32)), build_pool(quiz, bytes(32)), build_pool(quiz, bytes([1]) * 32)
    assert [q.markdown for q in a1.questions] == [q.markdown for q in a2.questions] and a1.fingerprint == a2.fingerprint
    differ = sum(x.markdown != y.markdown for x, y in zip(a1.questions, b.questions, strict=True))
    assert differ >= 0.9 * len(a1.questions)  # option order and scenarios follow the secret


def test_no_prompt_shows_code_whose_output_is_the_answer(course: dict):
    for q in course["pool"].questions:
        # exhibits are messages, maps and snapshot data; nothing in a prompt builds an allocator or calls malloc
        assert "```python" not in q.markdown and not re.search(r"^\s*(import|from) \w", q.markdown, re.M), q.key
        for needle in ("malloc(", "CachingAllocator(", "SimulatedGPU(", "BlockManager(", "empty_cache()\n"):
            assert needle not in q.markdown, (q.key, needle)


_SIZE = re.compile(r"([\d.]+) (bytes|KiB|MiB|GiB)")
_UNIT = {"bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}


def _bytes(text: str) -> float:
    m = _SIZE.fullmatch(text.strip())
    assert m, text
    return float(m.group(1)) * _UNIT[m.group(2)]


def _read_oom(message: str) -> dict[str, float]:
    flat = " ".join(message.split())
    grab = {
        "tried": r"Tried to allocate ([\d.]+ \w+)\.", "total": r"total capacity of ([\d.]+ \w+) of",
        "free": r"of which ([\d.]+ \w+) is free", "in_use": r"this process has ([\d.]+ \w+) memory in use",
        "allocated": r"memory ([\d.]+ \w+) is allocated", "unalloc": r"and ([\d.]+ \w+) is reserved by PyTorch",
    }
    out = {k: _bytes(re.search(p, flat).group(1)) for k, p in grab.items()}
    allowed = re.search(r"([\d.]+ \w+) allowed;", flat)
    out["allowed"] = _bytes(allowed.group(1)) if allowed else None
    return out


def _diagnose_oom(m: dict) -> str:
    """The reasoning a student is asked for, from the message alone."""
    if m["allowed"] is not None and m["free"] >= m["tried"]:
        return "fraction"
    if m["free"] + m["unalloc"] >= m["tried"]:
        return "fragmentation"
    if m["in_use"] < 0.5 * (m["total"] - m["free"]):
        return "other_process"
    return "capacity"


def test_oom_exhibits_answerable_from_the_message_alone():
    seen = set()
    for seed in range(60):
        scenario = generate("oom_message", rng(b"k" * 32, str(seed)))
        assert "minialloc" not in scenario.exhibit and "largest free block" not in scenario.exhibit
        assert _diagnose_oom(_read_oom(scenario.exhibit)) == scenario.facts["cause"], scenario.exhibit
        seen.add(scenario.facts["cause"])
    assert seen == set(SCENARIOS["oom_message"].parts["cause"])


def _reason_segments(segments: list[dict], device_free: int, request: int) -> tuple[str, float]:
    """PyTorch's malloc rules applied by hand to the snapshot excerpt (large pool, stream 0, no options set)."""
    reserved = sum(s["total_size"] for s in segments)
    fits = [b for s in segments if s["stream"] == 0 and s["segment_type"] == "large" for b in s["blocks"]
            if b["state"] == "inactive" and b["size"] >= request]
    if fits:
        return "cached_block", reserved / MiB
    segment = 20 * MiB if request < 10 * MiB else -(-request // (2 * MiB)) * 2 * MiB
    if device_free >= segment:
        return "new_segment", (reserved + segment) / MiB
    released = sum(s["total_size"] for s in segments if len(s["blocks"]) == 1 and s["blocks"][0]["state"] == "inactive")
    if device_free + released >= segment:
        return "release_then_new", (reserved - released + segment) / MiB
    return "oom", (reserved - released) / MiB


def test_snapshot_exhibits_answerable_by_the_allocator_rules():
    seen = set()
    for seed in range(40):
        scenario = generate("snapshot_excerpt", rng(b"k" * 32, str(seed)))
        head, _, body = scenario.exhibit.partition("\n[")
        free = int(re.search(r"\((\d+), \d+\)", head).group(1))
        outcome, reserved = _reason_segments(json.loads("[" + body), free, int(scenario.params["request_bytes"]))
        assert (outcome, reserved) == (scenario.facts["outcome"], scenario.facts["reserved_after"]), scenario.exhibit
        seen.add(outcome)
    assert seen == set(SCENARIOS["snapshot_excerpt"].parts["outcome"])


def _read_map(text: str) -> tuple[list[dict], int]:
    """The segment map's rows back into snapshot-like segments."""
    free = int(_bytes(re.search(r"in total, (.+?) free on the device", text).group(1)))
    segments = []
    for line in text.splitlines()[2:]:
        m = re.match(r"[A-Z]\s+(\w+)\s+(\d+)\s+([\d.]+ \w+)\s+\|(.*)\|$", line)
        assert m, line
        blocks = [{"size": int(_bytes(b.rsplit(" ", 1)[0] if b.endswith(" free") else b.removesuffix(" in use"))),
                   "state": "inactive" if b.endswith(" free") else "active_allocated"}
                  for b in (x.strip() for x in m.group(4).split("|"))]
        segments.append({"segment_type": m.group(1), "stream": int(m.group(2)), "total_size": int(_bytes(m.group(3))),
                         "blocks": blocks})
    return segments, free


def test_segment_maps_answerable_by_the_allocator_rules():
    for seed in range(30):
        scenario = generate("segment_map", rng(b"m" * 32, str(seed)))
        segments, free = _read_map(scenario.exhibit)
        outcome = _reason_segments(segments, free, int(scenario.params["request"]) * MiB)
        assert outcome == (scenario.facts["outcome"], scenario.facts["reserved_after"]), scenario.exhibit


# -- the draw ---------------------------------------------------------------------------------------------------

def test_draw_is_per_student_with_equal_points(course: dict):
    sheet = course["pool"].sheet()
    sets = []
    for sid in STUDENTS:
        slots = draw(sheet, sid)
        assert [s.grade_id for s in slots] == [f"slot{i:02d}" for i in range(1, 16)]
        assert sum(s.points for s in slots) == 35 and slots == draw(sheet, sid)
        sets.append(frozenset(s.key for s in slots))
    shared = [len(a & b) for a, b in combinations(sets, 2)]
    identical = sum(n == 15 for n in shared)
    mean = sum(shared) / len(shared)
    # measured on the sample bank (5 of 12, 10 of 32): about 5.2 questions of 15 shared on average, no equal sets
    print(f"draw overlap over {len(shared)} pairs: mean {mean:.2f} of 15 shared ({mean / 15:.0%}), "
          f"max {max(shared)}, identical sets {identical}")
    assert identical == 0 and mean < 0.4 * 15


def test_passing_needs_the_diagnosis_questions(course: dict):
    quiz = course["pool"].quiz
    pass_points = quiz.pass_mark * quiz.max_score
    concepts = next(t for t in quiz.tiers if t.name == "concepts")
    assert concepts.count * concepts.points < 0.2 * pass_points  # all 5 easy questions: 5 of the 28 needed
    # all concepts right and 3 of every 4 diagnosis parts still falls short of the pass mark
    diagnosis = next(t for t in quiz.tiers if t.name == "diagnosis")
    assert concepts.count * concepts.points + 0.75 * diagnosis.count * diagnosis.points < pass_points


# -- reading answers ----------------------------------------------------------------------------------------------

def test_read_answers_takes_literals_from_source_and_survives_garbage():
    cells = [
        {"cell_type": "code", "source": 'answers["p01"] = "b"\nanswers["p02"] = {"a", "c"}'},
        {"cell_type": "code", "source": ['answers["p03"] = ', '("a", 12.5)']},
        {"cell_type": "code", "source": 'answers["p04"] = compute()'},  # computed: unreadable
        {"cell_type": "code", "source": "%time x = 1\nanswers['p05'] = 'a'"},  # a magic: the cell does not parse
        {"cell_type": "markdown", "source": 'answers["p06"] = "a"'},
        {"cell_type": "code", "source": "answers['p07'] = " + "[" * 500 + "]" * 500},  # too deep to parse
        {"cell_type": "code", "source": "x = 1\n" * 20000 + 'answers["p08"] = "a"'},  # too large to parse
        {"cell_type": "code", "source": 42},
        {"cell_type": "code", "source": 'answers["p09"] = "a" * 10**9'},  # never evaluated: unreadable
        "not a cell",
        {"cell_type": "code", "source": 'answers["p01"] = "d"'},  # later assignment wins
    ]
    found = read_answers({"cells": cells})
    assert found["p01"] == "d" and found["p02"] == {"a", "c"} and found["p03"] == ("a", 12.5)
    assert isinstance(found["p04"], Unreadable) and isinstance(found["p09"], Unreadable)
    assert not {"p05", "p06", "p07", "p08"} & set(found)
    for garbage in (None, [], {"cells": "x"}, {"cells": [None, 1, {"cell_type": "code"}]}):
        assert read_answers(garbage) == {}


def test_parse_answer_shapes():
    single, multi = AnswerForm("single", "abcd"), AnswerForm("multi", "abcd")
    parts = AnswerForm("parts", "", (("choice", "abcd"), ("number", "MiB")))
    assert parse_answer(" B ", single) == ("b",)
    assert parse_answer(["a", "C"], multi) == (frozenset("ac"),) == parse_answer("a, c", multi)
    assert parse_answer(("d", "12,5"), parts) == ("d", 12.5)
    for value, form in [("e", single), (True, single), (["a"] * 9, multi), (("a",), parts), (("a", "x"), parts),
                        (("a", float("nan")), parts), (("a", 10**400), parts), (Unreadable("x"), single),
                        (None, single), ({("a",)}, multi)]:
        with pytest.raises(AnswerError):
            parse_answer(value, form)


# -- grading --------------------------------------------------------------------------------------------------------

def test_reference_answers_score_full_marks(course: dict):
    for sid in STUDENTS[:20]:
        right = reference_answers(course["bank"], course["secret"], sid)
        scores = grade_notebook(_submission(course, right), sid, course["bank"], course["secret"])
        assert _total(scores) == 35 and all(s.feedback.endswith("right") for s in scores)


def test_only_the_graders_draw_counts(course: dict):
    bank, secret = course["bank"], course["secret"]
    mine, theirs = STUDENTS[0], STUDENTS[1]
    friend = reference_answers(bank, secret, theirs)
    # a copy of a friend's notebook, id and all: only the questions both drew count
    copied = grade_notebook(_submission(course, friend, claimed_id=theirs), mine, bank, secret)
    both = set(friend) & set(reference_answers(bank, secret, mine))
    assert _total(copied) == sum(s.max_points for s in copied if s.question in both) < 35
    assert "not graded, not among your questions" in copied[0].feedback
    # every pool question answered with every letter earns nothing extra: a form error or a wrong answer
    shotgun = {q.key: "a" for q in course["pool"].questions}
    assert _total(grade_notebook(_submission(course, shotgun), mine, bank, secret)) <= 5


def test_partial_credit_and_feedback_never_reveals(course: dict):
    bank, secret, sid = course["bank"], course["secret"], STUDENTS[2]
    right = reference_answers(bank, secret, sid)
    diag = sorted((k for k, v in right.items() if isinstance(v, tuple)),
                  key=lambda k: not isinstance(right[k][1], float))  # first one with a number part
    wrong = dict(right)
    wrong[diag[0]] = (right[diag[0]][0], right[diag[0]][1] + 7)  # the number part off
    wrong[diag[1]] = "garbage"
    scores = {s.question: s for s in grade_notebook(_submission(course, wrong), sid, bank, secret)}
    assert scores[diag[0]].points == 1.5 and "1 of 2 parts right" in scores[diag[0]].feedback
    assert scores[diag[1]].points == 0 and "must be a tuple" in scores[diag[1]].feedback
    for s in scores.values():
        expected = course["pool"].question(s.question).expected
        for value in expected:
            shown = [f"{value:g}"] if isinstance(value, float) else [repr(x) for x in sorted(value)] \
                if isinstance(value, frozenset) else [repr(value), f'"{value}"']
            said = s.feedback.removeprefix(f"{s.question}: ")  # the key itself ("p38") may hold any digits
            assert not any(x in said for x in shown), s.feedback


def test_kernel_tricks_change_nothing(course: dict):
    """The grader never runs the notebook: patched modules, outputs and metadata are not read."""
    bank, secret, sid = course["bank"], course["secret"], STUDENTS[3]
    right = reference_answers(bank, secret, sid)
    assert _total(grade_notebook(_submission(course, right), sid, bank, secret)) == 35
    nb = _submission(course, {}, claimed_id=STUDENTS[4])
    # the right answers are there to read, in the outputs only: a grader that read them would give full marks
    printed = "".join(f'answers["{k}"] = {v!r}\n' for k, v in right.items())
    nb.cells.append(nbformat.v4.new_code_cell(
        "import quizzes.graded.scoring as s\ns.grade_notebook = lambda *a, **k: []\nanswers.update(EVERYTHING)",
        outputs=[nbformat.v4.new_output("stream", text=printed),
                 nbformat.v4.new_output("execute_result", data={"text/plain": printed}, execution_count=1)]))
    nb.metadata["minialloc_quiz"] = {"quiz": "quiz1", "fingerprint": "0" * 64}
    assert _total(grade_notebook(nb, sid, bank, secret)) == 0
    for garbage in ("not a notebook", {"cells": [{"cell_type": "code", "source": 'answers["p01"] = ("a", 1e999)'}]}):
        scores = grade_notebook(garbage, sid, bank, secret)
        assert len(scores) == 15 and _total(scores) == 0


def test_grading_refuses_a_pool_that_was_not_released(course: dict, tmp_path: Path):
    bank = tmp_path / "bank"
    shutil.copytree(course["bank"], bank)
    nb = _submission(course, {})
    with pytest.raises(GradingSetupError, match="differ from the released"):
        grade_notebook(nb, "x", bank, bytes(32))  # another secret
    raw = json.loads((bank / "quiz1.json").read_text(encoding="utf-8"))
    raw["questions"][0]["text"]["en"] += " (edited)"
    (bank / "quiz1.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(GradingSetupError, match="differ from the released"):
        grade_notebook(nb, "x", bank, course["secret"])
    shutil.rmtree(bank / ".built")
    with pytest.raises(GradingSetupError, match="no record of a build"):
        grade_notebook(nb, "x", bank, course["secret"])


# -- the notebook and the release -----------------------------------------------------------------------------------

def test_notebook_holds_prompts_only(course: dict):
    nb = nbformat.read(course["source"], as_version=4)
    MetadataValidator().validate_nb(nb)
    grades = [c.metadata["nbgrader"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [g["grade_id"] for g in grades] == [f"slot{i:02d}" for i in range(1, 16)]
    assert sum(g["points"] for g in grades) == 35
    raw = course["source"].read_text(encoding="utf-8")
    for marker in ("BEGIN SOLUTION", "HIDDEN TESTS", '"means"', '"answer"', "course.secret", "distractor"):
        assert marker not in raw, marker
    answer_cells = [c.source for c in nb.cells if re.fullmatch(r"p\d+-answer", c.get("id", ""))]
    assert len(answer_cells) == len(course["pool"].questions)
    template = re.compile(r'answers\["p\d+"\] = None  # only if p\d+ is one of your questions')
    assert all(template.fullmatch(a) for a in answer_cells)  # no answer in any student cell
    assert nb == build_notebook(course["pool"])  # the build is deterministic for one bank and secret


def test_cli_refuses_a_missing_or_exposed_secret(tmp_path: Path, capsys):
    bank = tmp_path / "bank"
    shutil.copytree(SAMPLE_BANK, bank)
    assert main(["build-graded", "--bank", str(bank), "--out", str(tmp_path / "src")]) == 1
    assert "no course secret" in capsys.readouterr().err
    new_secret(bank / "course.secret").chmod(0o640)
    assert main(["build-graded", "--bank", str(bank), "--out", str(tmp_path / "src")]) == 1
    assert "other users" in capsys.readouterr().err
    path, _ = build(bank, bytes(range(32)), out_dir=tmp_path / "src", progress=False)
    assert path == tmp_path / "src" / "quiz1" / "quiz1.ipynb"


def test_release_through_nbgrader_runs_and_grades(course: dict):
    root = course["course"]
    config = f"c = get_config()  # noqa: F821\nc.CourseDirectory.root = {str(root)!r}\n"
    (root / "nbgrader_config.py").write_text(config, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "quiz1"], cwd=root, env=_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    release = root / "release" / "quiz1" / "quiz1.ipynb"
    source_cells = [(c.cell_type, c.source) for c in nbformat.read(course["source"], as_version=4).cells]
    assert [(c.cell_type, c.source) for c in nbformat.read(release, as_version=4).cells] == source_cells
    sid = STUDENTS[5]
    right = reference_answers(course["bank"], course["secret"], sid)
    nb = _submission({"source": release}, right, claimed_id=sid)
    env = _env()
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(release.parent)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors[:1]
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "Your 15 questions" in printed and printed.count("in a form the grader reads") == 15
    assert _total(grade_notebook(nb, sid, course["bank"], course["secret"])) == 35


def test_every_oom_cause_maker_draws_again_instead_of_raising():
    """Each cause's scenario maker rejects a draw that does not show its cause (None); it never lets the allocator's
    own out-of-memory error escape, whatever the secret's random stream (a key once drew an 8 GiB GPU that the
    "other process" had filled to 90%, and building the graded quiz stopped)."""
    import random

    from quizzes.graded.diagnosis import _MAKERS

    for cause, make in _MAKERS.items():
        for seed in range(300):
            report = make(random.Random(seed))
            assert report is None or report.alloc_size > 0, (cause, seed)
