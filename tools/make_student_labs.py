"""Regenerate labs/student/: the labs as students receive them, for self-learners (on Binder, in a clone).

Each lab in labs/source goes through nbgrader's own `generate_assignment`, in a temporary course directory
configured by the repository's nbgrader_config.py (its root and gradebook moved there, so nothing is written
under labs/ but labs/student/). The release holds no solution and no hidden test; it is what an instructor hands
out, so a learner who opens labs/student/ gets exercises, not their answers.

The translated labs are labs like the others: `python -m course_i18n build` writes labs/source/<lab>_<lang>/
(Vietnamese `_vi`, German `_de`) from the catalogs labs/locale/<lang>/<lab>.po, and this script makes their
student versions labs/student/<lab>_<lang>/ with the English ones. Build the translations first: a translated lab
whose source is gone loses its student version too.

    python tools/make_student_labs.py            # rewrite labs/student/ from labs/source/
    python tools/make_student_labs.py --check    # exit 1 when labs/student/ is not what the sources generate

tests/test_labs.py checks in CI that the committed student versions are up to date (the same comparison as
--check, on the release it generates anyway).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "labs" / "source"
STUDENT = ROOT / "labs" / "student"


def labs() -> list[str]:
    """Every lab in labs/source, English and translated (<lab>_<lang>)."""
    return sorted(p.name for p in SOURCE.iterdir() if (p / f"{p.name}.ipynb").is_file())


def generate(dest: Path, names: list[str] | None = None) -> list[Path]:
    """Run generate_assignment for each lab and write its release notebooks under dest/<lab>/; the paths written."""
    # imported here: `--help` and the module's constants need no nbgrader
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    names = labs() if names is None else names
    written: list[Path] = []
    saved_path = os.environ.get("PATH", "")
    # nbgrader runs the `alembic` script by name: this interpreter's scripts first (a venv need not be activated)
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), saved_path])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            shutil.copytree(SOURCE, root / "source")
            config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
            config.CourseDirectory.root = str(root)
            config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
            api = NbGraderAPI(config=config)
            for lab in names:
                result = api.generate_assignment(lab)
                if not result["success"]:
                    raise RuntimeError(f"generate_assignment {lab} failed:\n{result.get('log') or result.get('error')}")
                target = dest / lab
                if target.exists():
                    shutil.rmtree(target)
                target.mkdir(parents=True)
                for notebook in sorted((root / "release" / lab).glob("*.ipynb")):
                    nb = nbformat.read(notebook, as_version=4)
                    nbformat.write(nb, target / notebook.name)
                    written.append(target / notebook.name)
    finally:
        os.environ["PATH"] = saved_path
    return written


def cell_sources(path: Path) -> list[tuple[str, str, dict]]:
    """What a learner sees of a notebook, and what grading relies on: each cell's type, source and nbgrader data."""
    nb = nbformat.read(path, as_version=4)
    return [(c.cell_type, c.source, dict(c.metadata.get("nbgrader", {}))) for c in nb.cells]


def differences(expected_dir: Path, actual_dir: Path, names: list[str]) -> list[str]:
    """Labs whose notebooks under actual_dir differ from those under expected_dir (or are missing)."""
    out = []
    for lab in names:
        want = sorted(p.name for p in (expected_dir / lab).glob("*.ipynb"))
        have = sorted(p.name for p in (actual_dir / lab).glob("*.ipynb")) if (actual_dir / lab).is_dir() else []
        if want != have:
            out.append(f"{lab}: notebooks {have}, expected {want}")
            continue
        out += [f"{lab}/{name}" for name in want
                if cell_sources(expected_dir / lab / name) != cell_sources(actual_dir / lab / name)]
    extra = sorted(p.name for p in actual_dir.iterdir() if p.is_dir() and p.name not in names) \
        if actual_dir.is_dir() else []
    return out + [f"{name}: no such lab in labs/source" for name in extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with labs/student/ instead of writing it")
    args = parser.parse_args(argv)
    names = labs()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp), names)
            stale = differences(Path(tmp), STUDENT, names)
        for line in stale:
            print(f"out of date: {line}", file=sys.stderr)
        if stale:
            print("run `make student-labs` (python tools/make_student_labs.py) and commit labs/student/",
                  file=sys.stderr)
        return 1 if stale else 0
    for name in [p.name for p in STUDENT.iterdir() if p.is_dir()] if STUDENT.is_dir() else []:
        if name not in names:
            shutil.rmtree(STUDENT / name)  # a lab removed from labs/source
    for path in generate(STUDENT, names):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
