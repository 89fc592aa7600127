"""A built wheel of the project holds no hidden test, no solution and no graded answer.

The wheel is built with pip from a copy of the working tree (so the build's own build/ and *.egg-info stay out of
the checkout), exactly as `pip wheel --no-deps .` builds it, and every file in it is scanned: by name (no
notebook, no lab source, no course solution, no private bank, no secret, no build record) and by content (no
nbgrader solution or hidden-test region, no hidden-test assertion of the labs, no text of the sample private
bank, no private bank file whatever its name).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_BANK = ROOT / "tests" / "fixtures" / "private_bank"
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".pytest_cache",
                              ".ruff_cache", ".hypothesis", "test-artifacts", ".ipynb_checkpoints")
MARKER = re.compile(r"^[ \t]*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)[ \t]*$", re.M)
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, tmp / "src", ignore=SKIP)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           str(tmp / "src"), "-w", str(tmp / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = (tmp / "out").glob("minialloc-*.whl")
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_wheel_has_the_packages(wheel: dict[str, bytes]):
    names = set(wheel)
    for needed in ("minialloc/allocator.py", "quizzes/graded/scoring.py", "quizzes/graded/diagnosis.py",
                   "quizzes/bank/ch2_fragmentation.json", "minialloc/locale/vi/LC_MESSAGES/minialloc.mo",
                   "minialloc/locale/de/LC_MESSAGES/minialloc.mo", "quizzes/locale/vi/LC_MESSAGES/quizzes.mo",
                   "quizzes/locale/de/LC_MESSAGES/quizzes.mo"):
        assert needed in names  # the scan below is of a real wheel, not an empty one


def test_no_notebook_no_lab_no_private_file(wheel: dict[str, bytes]):
    for name in wheel:
        assert not name.endswith(".ipynb"), name
        parts = name.split("/")
        for bad in ("labs", "tests", "course", "solutions", "source", "release", "autograded", "private_bank",
                    ".built"):
            assert bad not in parts[:-1], name
        assert parts[-1] not in ("course.secret", "gradebook.db"), name


def test_no_solution_region_hidden_test_or_private_bank(wheel: dict[str, bytes]):
    hidden_asserts = set()
    for nb_path in (ROOT / "labs" / "source").glob("*/*.ipynb"):
        for cell in nbformat.read(nb_path, as_version=4).cells:
            for block in HIDDEN.findall(cell.source):
                hidden_asserts |= {ln.strip() for ln in block.splitlines() if ln.strip().startswith("assert")
                                   and len(ln.strip()) >= 30}
    raw = json.loads((SAMPLE_BANK / "quiz1.json").read_text(encoding="utf-8"))
    # the bank's prose (questions, options, parts): sentences of five words or more, not shared settings names
    bank_texts = {s for s in _strings(raw["questions"]) if len(s.split()) >= 5}
    assert hidden_asserts and len(bank_texts) > 40  # the scan looks for something real
    for name, data in wheel.items():
        text = data.decode("utf-8", errors="replace")
        assert not MARKER.search(text), f"{name}: an nbgrader solution or hidden-test region"
        leaked = [s for s in hidden_asserts | bank_texts if s in text]
        assert not leaked, f"{name}: {leaked[:2]}"
        if name.endswith(".json"):
            assert '"minialloc-private-quiz"' not in text, f"{name}: a private bank file"
