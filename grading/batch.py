"""Autograde a class in parallel: N workers, each one student's nbgrader autograde, into one shared gradebook.

`nbgrader autograde A` grades one student after another in one process. Here each student is graded by a worker
process of their own, forked from this one once the course's nbgrader_config.py is loaded (so a worker starts in
milliseconds, not the seconds an `nbgrader` command takes to import and configure): the worker calls
`NbGraderAPI.autograde(A, student, force=True)`, which is nbgrader's own autograde with everything the config
installs (the intake checks of grading.intake, the bubblewrap sandbox, the preprocessors), exactly as the
serial command runs it. At most N workers run at once.

What one student can cost: a worker that dies (the grader's process killed by the out-of-memory killer, a crash)
or runs past its deadline (`timeout`; killed, with its process group) costs that student's grade alone: what it
left (its autograded folder, its submission's rows in the gradebook) is removed, so no half-graded score stays in
the gradebook, and the student is named in the log (escaped: ids are folder names the student may have chosen).
A student nbgrader refuses or fails is handled the same way. The others are graded on.

A rerun grades only what is missing: a student counts as graded when the gradebook holds their submission, every
notebook of the assignment is in their autograded folder (nbgrader writes a notebook there only after its grades
are saved) and the submission's timestamp.txt is the one that was graded; everyone else is graded again
(`force` regrades all). `shard` takes a deterministic part of the class: student ids are assigned to shards by a
hash of the id, so a shard does not change when other students are added, and shards 0..N-1 cover the class once.

SQLite takes one writer at a time (nbgrader's docs: the SQLite gradebook is not safe for concurrent graders), so
more than one worker on a sqlite:/// gradebook is refused with a line saying what to do; a PostgreSQL gradebook
(any SQLAlchemy URL nbgrader accepts) takes them all.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import re
import shutil
import signal
import stat
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from grading.intake import folder_problems, id_problem

log = logging.getLogger("grading.batch")

DEFAULT_TIMEOUT_S = 1800.0  # GuardedExecute.notebook_timeout (600 s) plus LabGrade.total_timeout (600 s), and margin
SHARD = re.compile(r"(\d+)/(\d+)")


class BatchError(Exception):
    """A batch that cannot start (bad arguments, a gradebook that cannot take it); the message says what to do."""


@dataclass(frozen=True)
class Shard:
    """Part `index` of `count` (0 <= index < count): Kubernetes' JOB_COMPLETION_INDEX numbering."""

    index: int = 0
    count: int = 1

    def holds(self, student_id: str) -> bool:
        digest = hashlib.sha256(student_id.encode("utf-8", "surrogateescape")).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index


def parse_shard(text: str) -> Shard:
    match = SHARD.fullmatch(text.strip())
    if not match or not int(match[2]) or int(match[1]) >= int(match[2]):
        raise BatchError(f"--shard {text!r}: write K/N with 0 <= K < N, e.g. 0/4 to 3/4 for four shards")
    return Shard(int(match[1]), int(match[2]))


def shown(text: str, limit: int = 200) -> str:
    """A name or a log line the student may have written, safe to print on one line: control characters,
    bidi overrides and other non-printable characters escaped, cut at `limit`."""
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def db_shown(db_url: str) -> str:
    """The gradebook's URL without its password, for the log."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except Exception:  # not a URL: SQLAlchemy says so when it is opened
        return shown(db_url)


@dataclass
class StudentResult:
    student: str
    status: str  # graded, failed, died, timed out, refused, already graded
    seconds: float = 0.0
    detail: str = ""
    score: float | None = None

    def line(self) -> str:
        took = f" in {self.seconds:.1f} s" if self.seconds else ""
        score = f", score {self.score:g}" if self.score is not None else ""
        detail = f": {shown(self.detail, 400)}" if self.detail else ""
        return f"{ascii(self.student)} {self.status}{took}{score}{detail}"


@dataclass
class BatchReport:
    assignment: str
    workers: int
    shard: Shard
    seconds: float = 0.0
    results: list[StudentResult] = field(default_factory=list)

    def of(self, *statuses: str) -> list[StudentResult]:
        return [r for r in self.results if r.status in statuses]

    @property
    def failed(self) -> list[StudentResult]:
        return [r for r in self.results if r.status not in ("graded", "already graded")]

    def summary(self) -> str:
        graded, skipped = self.of("graded"), self.of("already graded")
        names = ", ".join(ascii(r.student) for r in self.failed[:20]) + (" ..." if len(self.failed) > 20 else "")
        rate = f", {60 * len(graded) / self.seconds:.1f} students per minute" if graded and self.seconds else ""
        return (f"{self.assignment} shard {self.shard.index}/{self.shard.count}: {len(graded)} graded, "
                f"{len(self.failed)} not graded{' (' + names + ')' if names else ''}, {len(skipped)} already graded; "
                f"{self.seconds:.1f} s with {self.workers} worker(s){rate}")


def load_config(config_file: Path | str, overrides: Iterable[str] = (), root: str | None = None,
                db_url: str | None = None):
    """The course's nbgrader configuration (loading it installs the grader's classes), then `--Class.trait=value`
    overrides as nbgrader's command line takes them, then the course root and the gradebook's URL."""
    from traitlets.config.loader import KVArgParseConfigLoader, PyFileConfigLoader

    path = Path(config_file).resolve()
    if not path.is_file():
        raise BatchError(f"no nbgrader configuration at {path}: run from the course's folder, or give --config FILE")
    config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    overrides = list(overrides)
    if overrides:
        bad = [o for o in overrides if not re.fullmatch(r"--[A-Za-z_][\w]*\.[A-Za-z_]\w*=.*", o, re.S)]
        if bad:
            raise BatchError(f"unknown argument {bad[0]!r}: options of nbgrader's classes are written "
                             "--Class.trait=value")
        config.merge(KVArgParseConfigLoader(argv=overrides).load_config())
    if root:
        config.CourseDirectory.root = str(Path(root).resolve())
    if db_url:
        config.CourseDirectory.db_url = db_url
    return config


def is_sqlite(db_url: str) -> bool:
    return db_url.split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"


def _read_timestamp(folder: str) -> str | None:
    """timestamp.txt of a folder, read without following a link or blocking on a FIFO (the submitted folder is
    the student's); None when it is missing or not a plain file."""
    try:
        fd = os.open(os.path.join(folder, "timestamp.txt"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None
        return os.read(fd, 200).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


class Course:
    """The course directory and gradebook of one configuration, as the batch reads them."""

    def __init__(self, config) -> None:
        from nbgrader.coursedir import CourseDirectory

        self.config = config
        self.coursedir = CourseDirectory(config=config)
        self.db_url = self.coursedir.db_url

    def gradebook(self):
        from nbgrader.api import Gradebook

        return Gradebook(self.db_url, self.coursedir.course_id or "default_course")

    def submitted_students(self, assignment: str) -> list[str]:
        """The names of the folders submitted/<student>/ that hold the assignment (anything of that name: the
        intake check decides what may be read), in sorted order."""
        top = Path(self.coursedir.root) / self.coursedir.submitted_directory
        if not top.is_dir():
            return []
        return sorted(e.name for e in os.scandir(top) if os.path.lexists(os.path.join(e.path, assignment)))

    def notebooks(self, assignment: str) -> list[str]:
        """The assignment's notebooks as the gradebook holds them (generate_assignment put them there). Opening
        the gradebook here, once, also creates a new database's tables before any worker writes to it."""
        from nbgrader.api import MissingEntry

        with self.gradebook() as gb:
            try:
                return sorted(nb.name for nb in gb.find_assignment(assignment).notebooks)
            except MissingEntry:
                raise BatchError(f"the gradebook {db_shown(self.db_url)} has no assignment {assignment!r}: run "
                                 f"nbgrader generate_assignment {assignment} with this gradebook first") from None

    def graded(self, assignment: str, students: list[str], notebooks: list[str]) -> set[str]:
        """Those of `students` whose current submission is fully graded (see the module's docstring)."""
        from nbgrader.api import MissingEntry

        done = set()
        with self.gradebook() as gb:
            for student in students:
                if id_problem("student id", student) is not None:
                    continue
                try:
                    gb.find_submission(assignment, student)
                except MissingEntry:
                    continue
                dest = self.coursedir.format_path(self.coursedir.autograded_directory, student, assignment)
                src = self.coursedir.format_path(self.coursedir.submitted_directory, student, assignment)
                if not all(os.path.isfile(os.path.join(dest, f"{nb}.ipynb")) for nb in notebooks):
                    continue
                if folder_problems(src):  # changed since it was graded: let the worker's check say what
                    continue
                if _read_timestamp(src) == _read_timestamp(dest):
                    done.add(student)
        return done

    def forget(self, assignment: str, student: str) -> None:
        """Remove what a failed worker may have left: the student's autograded folder and gradebook rows."""
        from nbgrader.api import MissingEntry

        dest = self.coursedir.format_path(self.coursedir.autograded_directory, student, assignment)
        if os.path.lexists(dest):
            shutil.rmtree(dest, ignore_errors=True)
        with self.gradebook() as gb:
            try:
                gb.remove_submission(assignment, student)
            except MissingEntry:
                pass

    def score(self, assignment: str, student: str) -> float | None:
        from nbgrader.api import MissingEntry

        with self.gradebook() as gb:
            try:
                return float(gb.find_submission(assignment, student).score)
            except MissingEntry:
                return None


def _worker(config, assignment: str, student: str, conn: Connection, log_dir: str | None) -> None:
    """One student's autograde, in a forked process: nbgrader's own, as `nbgrader autograde A --student S
    --force` runs it with the course's configuration. Sends {success, log, error} back."""
    os.setsid()  # a process group of its own: past its deadline the whole group is killed
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # nbgrader's own gradebook code trips SQLAlchemy's session warnings; they say nothing about the submission
    warnings.filterwarnings("ignore", module="nbgrader")
    # the worker's log: each line names its student (ids reaching here are safe: id_problem), the whole of it in
    # log_dir/<student>.log when there is one, else warnings and errors only on the batch's stderr
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    handler = (logging.FileHandler(os.path.join(log_dir, f"{student}.log"), encoding="utf-8") if log_dir
               else logging.StreamHandler())
    handler.setFormatter(logging.Formatter(f"[{student} %(name)s %(levelname)s] %(message)s"))
    handler.setLevel(logging.INFO if log_dir else logging.WARNING)
    root.addHandler(handler)
    from nbgrader.apps import NbGraderAPI

    try:
        result = NbGraderAPI(config=config).autograde(assignment, student, force=True, create=True)
    except BaseException as error:  # noqa: BLE001 -- anything reaches the parent as this student's failure
        result = {"success": False, "error": f"{type(error).__name__}: {error}", "log": ""}
    conn.send({"success": bool(result.get("success")), "log": str(result.get("log") or "")[-20_000:],
               "error": str(result.get("error") or "")[-4_000:]})
    conn.close()


def _failure_detail(message: dict) -> str:
    """The reason nbgrader gave, from its log and traceback: the last error lines, escaped."""
    lines = [ln for ln in (message.get("log", "") + "\n" + message.get("error", "")).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "[ERROR]" in ln or "Error" in ln or "refused" in ln] or lines
    return " | ".join(shown(ln.strip(), 300) for ln in errors[-3:])


@dataclass
class _Running:
    student: str
    process: multiprocessing.process.BaseProcess
    conn: Connection
    started: float
    message: dict | None = None


def grade_batch(config, assignment: str, *, workers: int = 1, shard: Shard = Shard(),
                timeout: float = DEFAULT_TIMEOUT_S, force: bool = False, log_dir: Path | str | None = None,
                on_start: Callable[[str, int], None] | None = None) -> BatchReport:
    """Autograde every submission of `assignment` in `shard` that is not graded yet, `workers` at a time.

    Each worker's whole nbgrader log goes to `log_dir`/<student>.log when given, else its warnings and errors
    to stderr. `on_start(student, pid)` is called as each worker starts (the log line says the same)."""
    if workers < 1:
        raise BatchError(f"--workers {workers}: at least 1")
    if timeout <= 0:
        raise BatchError(f"--timeout {timeout}: a positive number of seconds per student")
    if (problem := id_problem("assignment name", assignment)) is not None:
        raise BatchError(problem)
    course = Course(config)
    if workers > 1 and is_sqlite(course.db_url):
        raise BatchError(f"the gradebook {db_shown(course.db_url)} is SQLite, which takes one writer at a time: run "
                         "with --workers 1, or move the gradebook to PostgreSQL (docs/grading.md, 'A big class')")
    if log_dir is not None:
        log_dir = str(Path(log_dir).resolve())
        os.makedirs(log_dir, exist_ok=True)
    if not is_sqlite(course.db_url) and not course.coursedir.course_id:
        # nbgrader files each assignment under CourseDirectory.course_id; with none it adds no course row, which
        # SQLite does not notice (it checks no foreign key by default) and PostgreSQL refuses
        raise BatchError(f"the gradebook {db_shown(course.db_url)} checks that an assignment's course exists, and "
                         "no course id is set: give --CourseDirectory.course_id=NAME (or c.CourseDirectory."
                         "course_id in nbgrader_config.py), the same for every nbgrader command on this gradebook")
    report = BatchReport(assignment, workers, shard)
    started = time.monotonic()
    notebooks = course.notebooks(assignment)
    students = [s for s in course.submitted_students(assignment) if shard.holds(s)]
    done = set() if force else course.graded(assignment, students, notebooks)
    pending: list[str] = []
    for student in students:
        if student in done:
            report.results.append(StudentResult(student, "already graded"))
        elif (problem := id_problem("student id", student)) is not None:
            # never handed to nbgrader: `*` would be globbed as every student, a path as another folder
            report.results.append(StudentResult(student, "refused", detail=problem))
            log.error("%s", report.results[-1].line())
        else:
            pending.append(student)
    log.info("%s: %d submission(s) in shard %d/%d, %d already graded, %d to grade with %d worker(s), gradebook %s",
             assignment, len(students), shard.index, shard.count, len(done), len(pending), workers,
             db_shown(course.db_url))
    context = multiprocessing.get_context("fork")  # the loaded config and imports are shared, not rebuilt
    running: dict[int, _Running] = {}
    queue = list(reversed(pending))
    try:
        while queue or running:
            while queue and len(running) < workers:
                student = queue.pop()
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_worker, args=(config, assignment, student, send, log_dir),
                                          name=f"autograde {student}", daemon=False)
                process.start()
                send.close()
                running[process.sentinel] = _Running(student, process, receive, time.monotonic())
                log.info("grading %s (worker pid %d)", ascii(student), process.pid)
                if on_start:
                    on_start(student, process.pid)
            now = time.monotonic()
            next_deadline = min(r.started + timeout for r in running.values())
            ready = wait([*running, *(r.conn for r in running.values() if r.message is None)],
                         timeout=max(0.0, next_deadline - now))
            for item in ready:
                if isinstance(item, Connection):
                    run = next(r for r in running.values() if r.conn is item)
                    try:
                        run.message = item.recv()
                    except (EOFError, OSError):
                        run.message = {}  # the worker died before it could answer
            for sentinel, run in list(running.items()):
                elapsed = time.monotonic() - run.started
                if sentinel in ready or not run.process.is_alive():
                    run.process.join()
                    if run.message is None and run.conn.poll():
                        try:
                            run.message = run.conn.recv()
                        except (EOFError, OSError):
                            run.message = {}
                    result = _finish(course, assignment, run, elapsed)
                elif elapsed >= timeout:
                    _kill_group(run.process)
                    result = StudentResult(run.student, "timed out", elapsed,
                                           f"past the deadline of {timeout:g} s per student; the worker was killed")
                    course.forget(assignment, run.student)
                else:
                    continue
                run.conn.close()
                del running[sentinel]
                report.results.append(result)
                (log.info if result.status == "graded" else log.error)("%s", result.line())
    finally:  # interrupted (Ctrl-C, an error here): no worker goes on grading in its own session unwatched
        for run in running.values():
            _kill_group(run.process)
    report.seconds = time.monotonic() - started
    report.results.sort(key=lambda r: r.student)
    log.info("%s", report.summary())
    if report.failed:
        log.error("not graded (no grade recorded for them; fix or look at each, then run the same command again "
                  "to grade only these): %s", ", ".join(ascii(r.student) for r in report.failed))
    return report


def _kill_group(process: multiprocessing.process.BaseProcess) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.join()


def _finish(course: Course, assignment: str, run: _Running, elapsed: float) -> StudentResult:
    code = run.process.exitcode
    if not run.message:
        # killed or crashed before it reported: its children (kernels, sandboxes) die with its group
        _kill_group(run.process)
        why = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
        course.forget(assignment, run.student)
        return StudentResult(run.student, "died", elapsed, f"the worker died ({why}) before it finished; "
                                                           "no grade recorded")
    if not run.message.get("success"):
        detail = _failure_detail(run.message)
        course.forget(assignment, run.student)
        return StudentResult(run.student, "refused" if "refused" in detail else "failed", elapsed,
                             detail + "; no grade recorded")
    return StudentResult(run.student, "graded", elapsed, score=course.score(assignment, run.student))
