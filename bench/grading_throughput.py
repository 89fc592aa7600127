"""Students graded per minute against the number of workers, and the same grades as a serial run, bit for bit.

A synthetic class (tools/synthetic_class.py: right, partly right, wrong, and the hostile submissions of
tests/test_nbgrader_hostile.py on a small 3-point assignment) is graded with the repository's nbgrader_config.py,
sandbox included, by grading.batch (what `python -m grading autograde` runs): first serially into a SQLite
gradebook, as `nbgrader autograde` grades today, then with each number of workers into a PostgreSQL gradebook
(Debian's server, started on a private socket by tools/scratch_postgres.py). Every grade cell of every student
must equal the serial run's (floats compared with ==); the bench fails otherwise.

Printed per run: the wall time of the batch, students per minute, the mean wall time of one student's worker,
and the CPU time per student (the workers' and their kernels' user + system time, from getrusage of the reaped
children). The CPU time per student is what a machine with more cores divides: the last lines extrapolate it to
500 students on 16 and 64 cores, an estimate that assumes one worker per core and a gradebook that keeps up.

    python bench/grading_throughput.py                     # 20 students; 1 and 2 workers
    python bench/grading_throughput.py --students 40 --workers 1,2,4
    python bench/grading_throughput.py --quick             # 6 students (make bench BENCH_FLAGS=--quick)

Needs bubblewrap and PostgreSQL's server (make system-packages) and the postgres extra (pip install -e
".[course,postgres]").
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
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


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def course_with_class(top: Path, name: str, db_url: str, kinds: dict[str, str]) -> Path:
    course = top / name
    sc.write_source(course)
    made = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", sc.NAME,
                           f"--CourseDirectory.root={course}", f"--CourseDirectory.db_url={db_url}",
                           f"--Exchange.root={course / 'exchange'}"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PATH": sc.venv_path()})
    if made.returncode:
        sys.exit(f"generate_assignment failed: {made.stderr[-2000:]}")
    sc.write_class(course, kinds)
    return course


def grades(db_url: str) -> dict[str, dict[str, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        return {s.student.id: {g.name: g.score for nb in s.notebooks for g in nb.grades}
                for s in gb.find_assignment(sc.NAME).submissions}


def run(course: Path, db_url: str, workers: int) -> dict:
    config = load_config(ROOT / "nbgrader_config.py", [*TIMEOUTS, f"--Exchange.root={course / 'exchange'}"],
                         root=str(course), db_url=db_url)
    cpu = children_cpu_s()
    report = grade_batch(config, sc.NAME, workers=workers)
    cpu = children_cpu_s() - cpu
    graded = report.of("graded")
    if report.failed:
        sys.exit("not graded: " + "; ".join(r.line() for r in report.failed))
    return {"seconds": report.seconds, "students": len(graded), "per_minute": 60 * len(graded) / report.seconds,
            "worker_s": sum(r.seconds for r in graded) / len(graded), "cpu_s": cpu / len(graded),
            "grades": grades(db_url)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts for PostgreSQL runs")
    parser.add_argument("--quick", action="store_true", help="6 students (every kind of the bench needs 13)")
    args = parser.parse_args()
    if not shutil.which("bwrap"):
        sys.exit("bubblewrap is not installed: the grader's sandbox needs it (make system-packages)")
    students = 6 if args.quick else args.students
    counts = [int(w) for w in args.workers.split(",")]
    logging.basicConfig(level=logging.WARNING, format="[%(name)s %(levelname)s] %(message)s")
    kinds = sc.class_of(students)
    print(f"{students} students of kinds: " + ", ".join(f"{k} x{list(kinds.values()).count(k)}"
                                                        for k in dict.fromkeys(kinds.values())))
    print(f"machine: {os.cpu_count()} CPUs; cell timeout 5 s (the hang submission waits for it)")
    top = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    rows = []
    try:
        with ScratchPostgres() as pg:
            serial_db = f"sqlite:///{top / 'serial' / 'gradebook.db'}"
            serial = run(course_with_class(top, "serial", serial_db, kinds), serial_db, 1)
            rows.append(("1, SQLite (serial)", serial))
            for workers in counts:
                db_url = pg.create_database(f"w{workers}")
                rows.append((f"{workers}, PostgreSQL", run(course_with_class(top, f"w{workers}", db_url, kinds),
                                                           db_url, workers)))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"{'workers, gradebook':<22}{'batch s':>9}{'students/min':>14}{'s/student (worker)':>20}"
          f"{'CPU s/student':>15}  grades")
    same = True
    for label, row in rows:
        equal = row["grades"] == serial["grades"]
        same &= equal
        print(f"{label:<22}{row['seconds']:>9.1f}{row['per_minute']:>14.1f}{row['worker_s']:>20.2f}"
              f"{row['cpu_s']:>15.2f}  {'same as serial, bit for bit' if equal else 'DIFFERENT from serial'}")
    cpu = max(row["cpu_s"] for _, row in rows)
    for cores in (16, 64):
        minutes = CLASS_FOR_ESTIMATE * cpu / cores / 60
        print(f"estimate: {CLASS_FOR_ESTIMATE} students on {cores} cores at {cpu:.2f} CPU s each: "
              f"{minutes:.1f} min (one worker per core, linear)")
    return 0 if same else 1


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"bench took {time.monotonic() - started:.0f} s")
    sys.exit(code)
