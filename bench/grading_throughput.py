"""Students graded per minute against the number of workers, and the same grades as a serial run, bit for bit.

A synthetic class (tools/synthetic_class.py: right, partly right, wrong, and the hostile submissions of
tests/test_nbgrader_hostile.py on a small 3-point assignment) is graded with the repository's nbgrader_config.py,
sandbox included, by grading.batch (what `python -m grading autograde` runs): first serially into a SQLite
gradebook, as `nbgrader autograde` grades today, then with each number of workers into a PostgreSQL gradebook
(Debian's server, started on a private socket by tools/scratch_postgres.py). Every grade cell of every student
must equal the serial run's (floats compared with ==); the bench fails otherwise.

Printed per run: the wall time of the batch, students per minute, and the mean wall time of one student's
worker. One worker's time per student, serially, is the cost a machine with more cores divides: the last lines
extrapolate it to 500 students on 16 and 64 cores, an estimate that assumes one worker per core scales as
measured from 1 to 2 workers here at best (linearly) and a gradebook that keeps up. (The CPU time of a student
is not printed: the kernels run in bubblewrap's pid namespace and are killed, not reaped, so getrusage misses
them.) `--lab NAME` grades copies of one of the repository's labs instead: the instructor's solution and the
release untouched, alternately, with the lab's own grader (LabGrade) and no shortened timeouts.

    python bench/grading_throughput.py                     # 20 students; 1 and 2 workers
    python bench/grading_throughput.py --students 40 --workers 1,2,4
    python bench/grading_throughput.py --quick             # 6 students (make bench BENCH_FLAGS=--quick)
    python bench/grading_throughput.py --lab lab1_best_fit --students 8

Needs bubblewrap and PostgreSQL's server (make system-packages) and the postgres extra (pip install -e
".[course,postgres]").
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grading.batch import grade_batch, load_config  # noqa: E402
from tools import synthetic_class as sc  # noqa: E402
from tools.scratch_postgres import ScratchPostgres  # noqa: E402

# the hostile test's cell timeout (tests/test_nbgrader_hostile.py): a looping cell costs 5 s here, not 30
TIMEOUTS = ["--Execute.timeout=5", "--ExecutePreprocessor.timeout=5", "--GuardedExecute.interrupt_grace=3"]
CLASS_FOR_ESTIMATE = 500


def course_with_class(top: Path, name: str, db_url: str, kinds: dict[str, str], lab: str | None) -> Path:
    """A course with the assignment generated into `db_url` and one submission per student."""
    course = top / name
    assignment = lab or sc.NAME
    if lab:
        shutil.copytree(ROOT / "labs" / "source" / lab, course / "source" / lab)
    else:
        sc.write_source(course)
    course_id = [] if db_url.startswith("sqlite") else ["--CourseDirectory.course_id=bench"]
    made = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", assignment,
                           f"--CourseDirectory.root={course}", f"--CourseDirectory.db_url={db_url}",
                           f"--Exchange.root={course / 'exchange'}", *course_id], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PATH": sc.venv_path()})
    if made.returncode:
        sys.exit(f"generate_assignment failed: {made.stderr[-2000:]}")
    if not lab:
        sc.write_class(course, kinds)
        return course
    import nbformat

    source = nbformat.read(course / "source" / lab / f"{lab}.ipynb", as_version=4)
    release = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
    for student, kind in kinds.items():
        folder = course / "submitted" / student / lab
        folder.mkdir(parents=True)
        nbformat.write(copy.deepcopy(source if kind == "right" else release), folder / f"{lab}.ipynb")
        (folder / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    return course


def grades(db_url: str, assignment: str) -> dict[str, dict[str, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        return {s.student.id: {g.name: g.score for nb in s.notebooks for g in nb.grades}
                for s in gb.find_assignment(assignment).submissions}


def run(course: Path, db_url: str, workers: int, lab: str | None) -> dict:
    options = [f"--Exchange.root={course / 'exchange'}"] + ([] if lab else TIMEOUTS)
    if not db_url.startswith("sqlite"):
        options.append("--CourseDirectory.course_id=bench")  # PostgreSQL checks an assignment's course exists
    config = load_config(ROOT / "nbgrader_config.py", options, root=str(course), db_url=db_url)
    # each student's nbgrader log in the course's logs/ (the hostile kinds make nbgrader warn at length)
    report = grade_batch(config, lab or sc.NAME, workers=workers, log_dir=course / "logs")
    graded = report.of("graded")
    if report.failed:
        sys.exit("not graded: " + "; ".join(r.line() for r in report.failed))
    return {"seconds": report.seconds, "students": len(graded), "per_minute": 60 * len(graded) / report.seconds,
            "worker_s": sum(r.seconds for r in graded) / len(graded), "grades": grades(db_url, lab or sc.NAME)}


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _has_postgres() -> bool:
    from tools.scratch_postgres import PostgresUnavailable, server_bindir

    try:
        return bool(server_bindir())
    except PostgresUnavailable:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts for PostgreSQL runs")
    parser.add_argument("--quick", action="store_true", help="6 students (every kind of the bench needs 13)")
    parser.add_argument("--lab", help="grade copies of this lab of labs/source (solution and release, alternately)")
    args = parser.parse_args()
    # `make bench` runs every bench on the course's layer alone: say what is missing, measure nothing, go on
    missing = [what for what, ok in (
        ("bubblewrap (make system-packages)", shutil.which("bwrap")),
        ("PostgreSQL's server (make system-packages)", _has_postgres()),
        ("psycopg2 (pip install -e \".[course,postgres]\")", _has_module("psycopg2"))) if not ok]
    if missing:
        print(f"grading throughput not measured: it needs {', '.join(missing)}")
        return 0
    if args.lab and not (ROOT / "labs" / "source" / args.lab / f"{args.lab}.ipynb").is_file():
        sys.exit(f"--lab {args.lab!r}: no labs/source/{args.lab}/{args.lab}.ipynb")
    students = 6 if args.quick else args.students
    counts = [int(w) for w in args.workers.split(",")]
    logging.basicConfig(level=logging.WARNING, format="[%(name)s %(levelname)s] %(message)s")
    if args.lab:
        kinds = {f"s{i:03d}": ("right", "release")[i % 2] for i in range(students)}
        print(f"{students} copies of {args.lab}: the solution and the release, alternately; the repository's timeouts")
    else:
        kinds = sc.class_of(students)
        print(f"{students} students of kinds: " + ", ".join(f"{k} x{list(kinds.values()).count(k)}"
                                                            for k in dict.fromkeys(kinds.values())))
        print("cell timeout 5 s (the hang submission waits for it)")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    top = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    rows = []
    try:
        with ScratchPostgres() as pg:
            serial_db = f"sqlite:///{top / 'serial' / 'gradebook.db'}"
            serial = run(course_with_class(top, "serial", serial_db, kinds, args.lab), serial_db, 1, args.lab)
            rows.append(("1, SQLite (serial)", serial))
            for workers in counts:
                db_url = pg.create_database(f"w{workers}")
                course = course_with_class(top, f"w{workers}", db_url, kinds, args.lab)
                rows.append((f"{workers}, PostgreSQL", run(course, db_url, workers, args.lab)))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'workers, gradebook':<22}{'batch s':>9}{'students/min':>14}{'s/student (worker)':>20}  grades")
    same = True
    for label, row in rows:
        equal = row["grades"] == serial["grades"]
        same &= equal
        print(f"{label:<22}{row['seconds']:>9.1f}{row['per_minute']:>14.1f}{row['worker_s']:>20.2f}"
              f"  {'same as serial, bit for bit' if equal else 'DIFFERENT from serial'}")
    cost = serial["seconds"] / serial["students"]
    for cores in (16, 64):
        print(f"estimate: {CLASS_FOR_ESTIMATE} students on {cores} cores at {cost:.2f} s each (serial): "
              f"{CLASS_FOR_ESTIMATE * cost / cores / 60:.1f} min (one worker per core, if it scales linearly)")
    return 0 if same else 1


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"bench took {time.monotonic() - started:.0f} s")
    sys.exit(code)
