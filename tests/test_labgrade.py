"""Lab answers scored as data (grading/labgrade.py, labrun.py, labdriver.py, copied.py, labspecs/), piece by
piece and fast: the grading copy of minialloc withholds the implementation, the sandboxed program keeps the
kernel's per-cell semantics (timeouts, an ignored interrupt, a dead process) and the grader's limits, what the
student's code writes on the channel cannot stand in for a probe, lab 1's checks tell right from wrong answers,
and the copy check flags delegation and pasted code but none of the labs' solutions. The whole pipeline, with the
published cheats, is in tests/test_nbgrader_hostile.py and tests/test_labs.py. bwrap must be installed.
"""

from __future__ import annotations

import ast
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading import copied, labspecs
from grading.labrun import STUB_MODULE, Step, grading_package, run_steps

ROOT = Path(__file__).resolve().parent.parent
LABS = sorted(p.name for p in (ROOT / "labs" / "source").iterdir() if not p.name.endswith(("_vi", "_de")))
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


REFERENCES: dict[int, dict] = {}  # a probe step's whole inputs (what the check reads), by the step's id


def lab1_steps(rng: random.Random, replace: tuple[str, str] | None = None,
               append: tuple[str, str] | None = None, lab: str = "lab1_best_fit") -> list[Step]:
    """A lab's program as LabGrade builds it, from the source notebook (the solution), one answer edited: a text
    replaced, or code appended to the answer cell of a grade id."""
    spec = labspecs.spec_for(lab)
    steps = []
    for cell in json.loads((ROOT / "labs" / "source" / lab / f"{lab}.ipynb").read_text())["cells"]:
        meta = cell["metadata"].get("nbgrader")
        if cell["cell_type"] != "code" or not meta:
            continue
        source = "".join(cell["source"])
        if meta.get("grade") and not meta.get("solution"):
            args = spec.inputs(meta["grade_id"], rng)
            steps.append(Step(meta["grade_id"], probe=meta["grade_id"], args=labspecs.probe_args(spec, args)))
            REFERENCES[id(steps[-1])] = args
        else:
            if replace and meta.get("solution") and replace[0] in source:
                source = source.replace(*replace)
            if append and meta["grade_id"] == append[0]:
                source += "\n\n" + append[1]
            steps.append(Step(meta["grade_id"], source=source))
    return steps


def verdicts(steps: list[Step], lab: str = "lab1_best_fit", **limits) -> dict[str, str | None]:
    spec = labspecs.spec_for(lab)
    run = run_steps(steps, labspecs.probes_source(lab), **{
        "cell_timeout": 10, "grace": 2, "total_timeout": 120, **limits})
    out = {}
    for step, outcome in zip(steps, run.outcomes, strict=True):
        if not step.probe:
            continue
        if outcome.error is not None:
            out[step.name] = outcome.error
        elif not outcome.ran:
            out[step.name] = "not run"
        else:
            out[step.name] = spec.check(step.name, REFERENCES[id(step)], outcome.result)
    return out


def test_the_grading_copy_withholds_the_implementation(tmp_path: Path):
    folder = grading_package(tmp_path)
    code = (
        "import minialloc\n"
        "from minialloc import CachingAllocator, MiB, SimulatedGPU\n"
        "from minialloc.expandable import ExpandableSegment\n"
        "from minialloc.paging import BlockManager\n"
        "gpu = SimulatedGPU('1GiB')\n"
        "print(gpu.malloc(2 * MiB) > 0)\n"
        "for cls in (CachingAllocator, ExpandableSegment, BlockManager):\n"
        "    try:\n"
        "        cls(gpu)\n"
        "    except minialloc._withheld.Withheld as e:\n"
        "        print('WITHHELD', cls.__name__)\n"
        "class Sub(CachingAllocator):\n"
        "    pass\n"
        "try:\n"
        "    Sub(gpu)\n"
        "except RuntimeError:\n"
        "    print('WITHHELD Sub')\n"
        "import os\n"
        "print(sorted(os.listdir(os.path.dirname(minialloc.__file__))))\n")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(folder)!r})\n" + code],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "True"
    assert lines[1:5] == ["WITHHELD CachingAllocator", "WITHHELD ExpandableSegment", "WITHHELD BlockManager",
                          "WITHHELD Sub"]
    # the stubs are there to import; the implementation's text is not
    assert "allocator.py" in lines[5] and "blocks.py" in lines[5]
    assert not [p for p in folder.rglob("*.py") if "class CachingAllocator" in p.read_text()
                or "class ExpandableSegment" in p.read_text() or "class BlockManager" in p.read_text()]
    assert (folder / "minialloc" / "allocator.py").read_text() == STUB_MODULE.format(dots=".")


def test_the_grading_copy_lets_a_translated_lab_choose_its_language(tmp_path: Path):
    """A translated lab's setup cell calls minialloc.lang.set_lang: the grading copy has the real module (it holds
    no implementation), so the lab's locked cells run there as in the student's kernel."""
    folder = grading_package(tmp_path)
    code = ("import minialloc.lang\nfrom minialloc import GiB, format_size\nminialloc.lang.set_lang('vi')\n"
            "print(minialloc.lang.get_lang(), format_size(3 * GiB))\n")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(folder)!r})\n" + code],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["vi", "3.00", "GiB"]

def test_the_solution_passes_and_wrong_answers_fail_where_they_are_wrong():
    rng = random.Random(7)
    assert set(verdicts(lab1_steps(rng)).values()) == {None}
    wrong = verdicts(lab1_steps(rng, ("return rounded <= K_SMALL_SIZE\n", "return rounded < K_SMALL_SIZE\n")))
    assert wrong["task1_sizes_tests"] == "is_small(1048576) returned False, expected True"
    assert wrong["task2_best_fit_tests"] is None
    assert all(wrong[k] for k in wrong if k.startswith(("task3_", "task4_")))
    retries = verdicts(lab1_steps(rng, ("self.num_alloc_retries += 1", "self.num_alloc_retries += 2")))
    assert [k for k, v in retries.items() if v] == ["task4_retry_tests"]
    assert "num_alloc_retries 2, minialloc 1" in retries["task4_retry_tests"]


@pytest.mark.parametrize("lab", labspecs.SCORED)
def test_every_scored_labs_solution_passes_on_fresh_inputs(lab: str):
    for seed in (1, 2):
        assert set(verdicts(lab1_steps(random.Random(seed), lab=lab), lab=lab).values()) == {None}, (lab, seed)


def test_an_object_equal_to_everything_is_no_answer():
    anything = ("    return max(K_MIN_BLOCK_SIZE, -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)\n",
                "    class _Any(int):\n        def __eq__(self, other):\n            return True\n"
                "        __hash__ = int.__hash__\n"
                "    return _Any(max(K_MIN_BLOCK_SIZE, -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE))\n")
    got = verdicts(lab1_steps(random.Random(1), anything))
    assert got["task1_sizes_tests"] == "round_size(1) returned an object of the answer's own class, expected 512"


def test_cells_keep_the_kernels_timeout_semantics():
    rng = random.Random(3)
    # a loop after the answers is interrupted like a kernel cell: what the cell defined before it still scores
    interrupted = verdicts(lab1_steps(rng, append=("task1_sizes", "while True:\n    pass\n")), cell_timeout=2)
    assert set(interrupted.values()) == {None}
    # a loop that ignores the interrupt ends the program: nothing after it runs
    deaf = "import signal\n\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"
    assert set(verdicts(lab1_steps(rng, append=("task1_sizes", deaf)), cell_timeout=2).values()) == {"not run"}
    # a process that leaves: the tests before it keep their results, the later ones did not run
    dead = verdicts(lab1_steps(rng, append=("task2_best_fit", "import os\n\nos._exit(0)\n")))
    assert dead["task1_sizes_tests"] is None and {v for k, v in dead.items() if k != "task1_sizes_tests"} == {"not run"}


# Student code that finds the driver's channel the way an attacker would: every pipe it holds open beyond 0-2.
FIND_CHANNEL = (
    "import os as _os\nimport stat as _stat\n"
    "_fds = []\n"
    "for _f in _os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        if int(_f) > 2 and _stat.S_ISFIFO(_os.fstat(int(_f)).st_mode):\n"
    "            _fds.append(int(_f))\n"
    "    except OSError:\n"
    "        pass\n")


def test_the_channel_is_bounded_and_forged_lines_do_not_score():
    rng = random.Random(5)
    steps = lab1_steps(rng, ("### END SOLUTION\n\n\ndef is_small", (
        "### END SOLUTION\n\n\n" + FIND_CHANNEL +
        "for _fd in _fds:\n"
        "    try:\n"
        "        _os.write(_fd, b'{\"step\": 99, \"result\": []}\\nnot json\\n[1]\\n{\"step\": 0, \"x\": 1}\\n')\n"
        "    except OSError:\n"
        "        pass\n\n\ndef is_small")))
    got = verdicts(steps)
    assert set(got.values()) == {None}  # lines that are not the driver's are ignored; the real probes decide
    flood = lab1_steps(rng, ("### END SOLUTION\n\n\ndef is_small", (
        "### END SOLUTION\n\n\n" + FIND_CHANNEL +
        "for _fd in _fds:\n"
        "    try:\n"
        "        _os.write(_fd, b'x' * 3_000_000)\n"
        "    except OSError:\n"
        "        pass\n\n\ndef is_small")))
    flooded = verdicts(flood, max_bytes=1_000_000)
    assert set(flooded.values()) == {"not run"}


def test_the_probe_gets_inputs_only():
    """Lab 1 task 1's probe once carried the rounded sizes (round_size's answers); an answer that read them from its
    caller's frame scored with no implementation. Now no input of any probe holds a value the check expects."""
    rng = random.Random(11)
    spec = labspecs.spec_for("lab1_best_fit")
    args = spec.inputs("task1_sizes_tests", rng)
    given = labspecs.probe_args(spec, args)
    assert set(given) == {"sizes", "classified"}
    from minialloc.allocator import round_size
    answers = [round_size(s, 0) for s in given["sizes"]]
    assert answers != given["classified"][:len(answers)]
    lab2 = labspecs.spec_for("lab2_fragmentation_oom")
    assert "refs" not in labspecs.probe_args(lab2, lab2.inputs("task2_free_tests", rng))
    oracle = (
        "    import sys as _sys\n"
        "    _f = _sys._getframe(1)\n"
        "    while _f is not None:\n"
        "        _a = _f.f_locals.get('args')\n"
        "        if isinstance(_a, dict) and 'sizes' in _a:\n"
        "            _known = dict(zip(_a['sizes'], _a.get('rounded') or _a.get('classified')))\n"
        "            return _known.get(size, 0)\n"
        "        _f = _f.f_back\n"
        "    return 0\n")
    honest = "    return max(K_MIN_BLOCK_SIZE, -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)\n"
    got = verdicts(lab1_steps(random.Random(1), (honest, oracle)))
    assert (got["task1_sizes_tests"] or "").startswith("round_size(")  # with the old input it scored


SEEN_PROBE = """
def seen(ns, args):
    return ns.get("SEEN")
"""


def test_nothing_of_the_grader_in_argv_environment_or_files():
    """What the student's code sees of its process: no path, descriptor number or file of the grader, the
    kernel's environment, and bubblewrap's command line without the policy."""
    cell = ("import os, sys\n"
            "SEEN = {'argv': sys.argv, 'orig_argv': sys.orig_argv,\n"
            "        'cmdline': open('/proc/self/cmdline', 'rb').read().decode(errors='replace'),\n"
            "        'first': open('/proc/1/cmdline', 'rb').read().decode(errors='replace'),\n"
            "        'env': sorted(os.environ), 'cwd': sorted(os.listdir('.')),\n"
            "        'stdin': sys.stdin.read() if sys.stdin else ''}\n")
    run = run_steps([Step("look", source=cell), Step("seen", probe="seen", args=None)], SEEN_PROBE,
                    cell_timeout=10, grace=2, total_timeout=60)
    seen = run.outcomes[1].result
    assert run.outcomes[1].ran and isinstance(seen, dict), run
    # a kernel's arguments, as nbclient starts one in the sandbox, not the grader's
    assert seen["argv"][0].endswith("ipykernel_launcher.py") and seen["argv"][1] == "-f"
    assert seen["argv"][2].endswith("/conn/kernel.json") and seen["argv"][3] == "--HistoryManager.hist_file=:memory:"
    assert seen["orig_argv"][1:3] == ["-m", "ipykernel_launcher"] and seen["orig_argv"][3:] == seen["argv"][1:]
    assert seen["cmdline"].split("\0")[1:] == ["-I", "-", ""]
    first = seen["first"].split("\0")
    assert first[1] == "--args" and first[2].isdigit() and first[3] == "--", first[:6]  # the policy is not there
    assert not [part for part in first if "labgrade" in part or "--ro-bind" in part]
    assert seen["stdin"] == ""
    from grading.sandbox import PASS_ENV
    allowed = {"HOME", "USER", "PATH", "IPYTHONDIR", "MPLCONFIGDIR", "PYTHONDONTWRITEBYTECODE", "OPENBLAS_NUM_THREADS",
               "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_ARENA_MAX", "PWD", *PASS_ENV}
    assert set(seen["env"]) <= allowed, seen["env"]
    assert seen["cwd"] == ["packages"]


def test_no_report_extends_a_deadline_and_none_reaches_a_verdict():
    """The attack of the last round: the driver's alarm off, SIGINT ignored, a forged report every 0.2 s (the old
    "start", well-formed ends for the next steps' numbers, errors of 300 characters). The step is ended by the
    grader's clock; the steps after it did not run; no text of a report is in any outcome."""
    forger = (FIND_CHANNEL +
              "import json, signal, time\n"
              "signal.setitimer(signal.ITIMER_REAL, 0)\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
              "_bad = 'FORGED ' + 'x' * 293\n"
              "while True:\n"
              "    for _fd in _fds:\n"
              "        for _m in ({'step': 0, 'event': 'start'}, {'step': 5, 'failed': 'raised', 'type': _bad},\n"
              "                   {'step': 0, 'failed': 'raised', 'type': _bad}):\n"
              "            _os.write(_fd, (json.dumps(_m) + '\\n').encode())\n"
              "    time.sleep(0.2)\n")
    steps = [Step("hold", source=forger), Step("later", source="x = 1"), Step("seen", probe="seen", args=None)]
    run = run_steps(steps, SEEN_PROBE, cell_timeout=2, grace=1, total_timeout=120)
    first, later, probe = run.outcomes
    # the forged failure of step 0 was the first well-formed report for it: it ends step 0, in the grader's words
    assert first.ran and first.error == "the answer raised an exception of the answer's own class"
    assert not later.ran and later.error.startswith("CellTimeoutError: the step ran past the grader's time limit")
    assert not probe.ran and probe.error is None
    assert "FORGED" not in repr(run.outcomes) and "FORGED" not in (run.stopped or "")
    held = [Step("hold", source="import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
                                "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"),
            Step("seen", probe="seen", args=None)]
    run = run_steps(held, SEEN_PROBE, cell_timeout=2, grace=1, total_timeout=120)
    assert run.outcomes[0].error.startswith("CellTimeoutError") and not run.outcomes[1].ran
    assert "grader's time limit" in run.stopped


def test_forged_reports_past_the_last_step_are_ignored():
    """Well-formed failures forged for every step number, the last one's and beyond: each step the grader waits
    for ends (as a failure, in the grader's words), and the reports past the last step change nothing."""
    forger = (FIND_CHANNEL + "import json\n"
              "for _fd in _fds:\n"
              "    for _step in range(10):\n"
              "        _os.write(_fd, (json.dumps({'step': _step, 'failed': 'raised', 'type': 'X' * 300}) + '\\n')"
              ".encode())\n")
    steps = [Step("forge", source=forger), Step("later", source="x = 1"), Step("seen", probe="seen", args=None)]
    run = run_steps(steps, SEEN_PROBE, cell_timeout=5, grace=1, total_timeout=60)
    assert [o.error for o in run.outcomes] == ["the answer raised an exception of the answer's own class"] * 3


def lab_answers(lab: str) -> dict[str, str]:
    nb = json.loads((ROOT / "labs" / "source" / lab / f"{lab}.ipynb").read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in nb["cells"]
            if c["metadata"].get("nbgrader", {}).get("solution")}


def test_the_copy_check_flags_delegation_and_pasted_code():
    for lab in LABS:
        answers = lab_answers(lab)
        reasons, copies = copied.review(answers)
        # the labs' solutions are public (the repository): pasted as they are, each is flagged with its evidence;
        # none of them looks copied from minialloc, nor uses what is withheld
        assert answers and reasons == [] and copies, lab
        assert all(c.where.startswith(f"the public solution labs/source/{lab}/") for c in copies), lab
        assert all(c.answer in answers[c.cell] and c.passage for c in copies), lab
    delegate = "class BestFitAllocator:\n    def __init__(self, d):\n        self.inner = CachingAllocator(d, '')\n"
    assert copied.copied_work({"task3_allocator": delegate}) == [
        "task3_allocator: uses CachingAllocator (minialloc's implementation)"]
    hidden = "import importlib\nm = importlib.import_module('mini' + 'alloc.allocator')\n"
    assert copied.copied_work({"a": hidden}) == ["a: imports importlib, which can run or read other code"]
    # minialloc's own function pasted with every name changed
    source = (ROOT / "minialloc" / "allocator.py").read_text()
    function = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "free")
    renamed = ast.unparse(function).replace("self", "me").replace("block", "piece").replace("def free", "def give")
    found = copied.copied_work({"task3_allocator": renamed})
    assert found and found[0].startswith("task3_allocator: alike minialloc's allocator (free) (100%"), found


class _Wrapped(ast.NodeTransformer):
    """The last round's rewrite: every returned value, assigned value and comparison wrapped in an identity call."""

    def _wrap(self, node):
        return ast.Call(ast.Name("same", ast.Load()), [node], [])

    def visit_Return(self, node):
        self.generic_visit(node)
        if node.value is not None:
            node.value = self._wrap(node.value)
        return node

    def visit_Assign(self, node):
        self.generic_visit(node)
        node.value = self._wrap(node.value)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        return self._wrap(node)


def test_a_mechanical_rewrite_does_not_defeat_the_copy_check():
    """minialloc's BlockManager pasted into lab 4 with every expression wrapped in an identity function, names
    changed and its methods in another order: flagged as minialloc's, by both comparisons."""
    tree = ast.parse((ROOT / "minialloc" / "paging" / "block_manager.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "BlockManager")
    cls.body.reverse()
    wrapped = ast.unparse(ast.fix_missing_locations(_Wrapped().visit(cls)))
    paste = ("same = lambda value: value\n\n\n" + wrapped.replace("self", "me").replace("block", "piece")
             .replace("BlockManager", "MyManager"))
    _, copies = copied.review({"task2_manager": paste})
    assert {c.method for c in copies if c.where.startswith("minialloc's paging.block_manager")} >= {"syntax tree"}, \
        [c.reason for c in copies]
    # the public solution of lab 2 pasted into a submission of lab 2, and a classmate's answer (collusion)
    lab2 = lab_answers("lab2_fragmentation_oom")
    _, copies = copied.review(lab2)
    assert copies and all("lab2_fragmentation_oom" in c.where for c in copies)
    mine = {"task3_allocator": lab_answers("lab1_best_fit")["task3_allocator"].replace("self", "this")}
    _, copies = copied.review(mine, {"bob": {"task3_allocator": lab_answers("lab1_best_fit")["task3_allocator"]}})
    assert [c for c in copies if c.where.startswith("student 'bob'")], [c.reason for c in copies]


def test_honest_work_of_ones_own_is_not_called_a_copy():
    """An answer written differently from every known passage (lab 1's sizes and best fit, by another route)."""
    own = {"task1_sizes": (
        "def round_size(size):\n"
        "    if size < 512:\n"
        "        return 512\n"
        "    whole, part = divmod(size, 512)\n"
        "    return 512 * (whole + (1 if part else 0))\n"
        "\n\ndef is_small(rounded):\n    return not rounded > 1024 * 1024\n"
        "\n\ndef segment_size(rounded):\n"
        "    if is_small(rounded):\n        return 2 * 1024 * 1024\n"
        "    return 20 * 1024 * 1024 if rounded < 10 * 1024 * 1024 else -(-rounded // (2 << 20)) * (2 << 20)\n"),
        "task2_best_fit": (
        "def best_fit(free, want):\n"
        "    best = None\n"
        "    for number, (size, _ptr) in enumerate(free):\n"
        "        if size >= want and (best is None or size < free[best][0]):\n"
        "            best = number\n"
        "    return best\n")}
    assert copied.review(own) == ([], [])
    # the release's skeleton, which every student starts from, is nobody's copy (here: of a classmate's skeleton)
    release = json.loads((ROOT / "labs" / "student" / "lab1_best_fit" / "lab1_best_fit.ipynb").read_text())
    stubs = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in release["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")}
    assert copied.review(stubs, {"bob": stubs}, boilerplate=stubs) == ([], [])
    _, copies = copied.review(lab_answers("lab1_best_fit"), {"bob": lab_answers("lab1_best_fit")}, boilerplate=stubs)
    assert [c for c in copies if c.where.startswith("student 'bob'")]  # the work beyond the skeleton still counts


def test_every_scored_lab_has_a_check_for_each_graded_cell():
    for lab in labspecs.SCORED:
        nb = json.loads((ROOT / "labs" / "source" / lab / f"{lab}.ipynb").read_text())
        graded = {c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
                  if c["metadata"].get("nbgrader", {}).get("grade")}
        assert graded == set(labspecs.spec_for(lab).GRADED), lab
        assert labspecs.spec_for(f"{lab}_vi") is labspecs.spec_for(lab)
