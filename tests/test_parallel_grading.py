"""A big class graded in parallel into a real PostgreSQL gradebook, against the same class graded serially on SQLite.

Debian's PostgreSQL is started for the module on a private unix socket (tools/scratch_postgres.py; `make
system-packages` installs it). The class is tools/synthetic_class.py's: right, partly right, wrong and hostile
submissions (the hostile ones of tests/test_nbgrader_hostile.py, on a small assignment), graded through the
repository's nbgrader_config.py (the sandbox included) by the batch command, `python -m grading autograde`:

1. serially (`--workers 1`) into a SQLite gradebook: the reference; more than one worker there is refused;
2. with 2 workers into PostgreSQL: the same class plus `crash` (its worker is killed with SIGKILL while its
   kernel runs, as the out-of-memory killer would), `stall` (cells that each stay under the cell timeout, past
   the batch's per-student deadline) and a folder named `*` (never handed to nbgrader, which would glob it):
   every other score equals the serial run's, grade by grade, and the three have no grade, each named;
3. again, with `stall` removed: only `crash` is graded, nothing twice;
4. `nbgrader generate_feedback` on the PostgreSQL gradebook: feedback for every graded student;
5. the serial SQLite gradebook copied to PostgreSQL (`python -m grading copy-gradebook`), then `certify` and
   `nbgrader export` read the PostgreSQL gradebook and give what they give on SQLite.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grading.batch import BatchError, Shard, parse_shard, shown
from tools import synthetic_class as sc
from tools.scratch_postgres import ScratchPostgres

ROOT = Path(__file__).resolve().parent.parent
# the looping student's cell timeout, as tests/test_nbgrader_hostile.py sets it (the repository's config says 30 s)
TIMEOUTS = ["--Execute.timeout=5", "--ExecutePreprocessor.timeout=5", "--GuardedExecute.interrupt_grace=3"]
DEADLINE_S = 120  # the batch's per-student deadline here: an honest student takes about 5 s; stall takes 400 s
SERIAL = {f"{kind}{i}": kind for kind in sc.EXPECTED if kind != "slow" for i in range(1 + (kind in (
    "right", "partial1", "partial2", "wrong")))}  # 22 students
PARALLEL = {**SERIAL, "crash": "slow", "stall": "stall"}
UNSAFE = "*"
COURSE_ID = "bigclass-course"  # PostgreSQL checks an assignment's course exists; nbgrader adds none without an id

pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")


def env() -> dict[str, str]:
    return {**os.environ, "PATH": sc.venv_path()}


def nbgrader(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=600)


def course_id_args(db_url: str) -> list[str]:
    """SQLite: no course id, as nbgrader's default has it (a one-instructor gradebook made before a course id was
    set, the case copy-gradebook's --course-id is for); PostgreSQL needs one."""
    return [f"--CourseDirectory.course_id={'' if db_url.startswith('sqlite') else COURSE_ID}"]


def batch_args(course: Path, db_url: str, *extra: str) -> list[str]:
    course_id = course_id_args(db_url)
    return [sys.executable, "-m", "grading", "autograde", sc.NAME, "--root", str(course), "--db", db_url,
            f"--Exchange.root={course / 'exchange'}", *course_id, *TIMEOUTS, *extra]


def new_course(root: Path, db_url: str, kinds: dict[str, str]) -> Path:
    sc.write_source(root)
    course_id = course_id_args(db_url)
    made = nbgrader("generate_assignment", sc.NAME, f"--CourseDirectory.root={root}",
                    f"--CourseDirectory.db_url={db_url}", f"--Exchange.root={root / 'exchange'}", *course_id)
    assert made.returncode == 0, made.stderr[-3000:]
    sc.write_class(root, kinds)
    return root


def grades(db_url: str) -> dict[str, dict[str, float]]:
    """student -> {grade cell: score} and the submission's total under "total", read through nbgrader's API."""
    from nbgrader.api import Gradebook

    out = {}
    with Gradebook(db_url) as gb:
        for submission in gb.find_assignment(sc.NAME).submissions:
            cells = {g.name: g.score for nb in submission.notebooks for g in nb.grades}
            out[submission.student.id] = {**cells, "total": submission.score}
    return out


def autograded_times(course: Path) -> dict[str, int]:
    return {p.parts[-3]: p.stat().st_mtime_ns for p in (course / "autograded").glob(f"*/{sc.NAME}/*.ipynb")}


@pytest.fixture(scope="module")
def postgres():
    with ScratchPostgres() as server:
        yield server


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> dict:
    course = tmp_path_factory.mktemp("serial")
    db_url = f"sqlite:///{course / 'gradebook.db'}"
    new_course(course, db_url, SERIAL)
    done = subprocess.run(batch_args(course, db_url, "--workers", "1"), cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=1800)
    return {"course": course, "db_url": db_url, "run": done, "grades": grades(db_url)}


def run_watching(args: list[str], course: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the batch; kill crash's worker (SIGKILL) once its autograde has begun, i.e. its autograded folder
    holds the copied timestamp; it then sleeps 20 s in its kernel. Returns the run and what was killed."""
    process = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    killed: list[str] = []

    def watch() -> None:
        for line in process.stderr:
            lines.append(line)
            started = re.match(r"\[grading.batch INFO\] grading 'crash' \(worker pid (\d+)\)", line)
            if started:
                threading.Thread(target=kill_when_grading, args=(int(started[1]),), daemon=True).start()

    def kill_when_grading(pid: int) -> None:
        mark = course / "autograded" / "crash" / sc.NAME / "timestamp.txt"
        while process.poll() is None and not mark.exists():
            time.sleep(0.05)  # polling a condition, not guessing a time
        if process.poll() is None:
            os.kill(pid, signal.SIGKILL)
            killed.append(str(pid))

    reader = threading.Thread(target=watch)
    reader.start()
    stdout = process.stdout.read()
    process.wait(timeout=1800)
    reader.join()
    return subprocess.CompletedProcess(args, process.returncode, stdout, "".join(lines)), killed


@pytest.fixture(scope="module")
def parallel(postgres: ScratchPostgres, tmp_path_factory: pytest.TempPathFactory) -> dict:
    course = tmp_path_factory.mktemp("parallel")
    db_url = postgres.create_database("parallel")
    new_course(course, db_url, PARALLEL)
    (course / "submitted" / UNSAFE / sc.NAME).mkdir(parents=True)
    args = batch_args(course, db_url, "--workers", "2", "--timeout", str(DEADLINE_S))
    first, killed = run_watching(args, course)
    after_first = {"grades": grades(db_url), "times": autograded_times(course)}
    # the instructor looks at stall and takes it out; crash's submission was never at fault
    import shutil

    shutil.rmtree(course / "submitted" / "stall")
    second = subprocess.run(args, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1800)
    return {"course": course, "db_url": db_url, "first": first, "killed": killed, "second": second,
            "after_first": after_first, "grades": grades(db_url), "times": autograded_times(course)}


def test_the_serial_run_grades_every_kind_as_expected(serial: dict):
    assert serial["run"].returncode == 0, serial["run"].stderr[-4000:]
    assert {s: g["total"] for s, g in serial["grades"].items()} == {s: sc.EXPECTED[k] for s, k in SERIAL.items()}


def test_more_than_one_worker_on_sqlite_is_refused_with_what_to_do(serial: dict):
    done = subprocess.run(batch_args(serial["course"], serial["db_url"], "--workers", "2"), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert "is SQLite, which takes one writer at a time: run with --workers 1, or move the gradebook to PostgreSQL" \
        in done.stderr
    assert "grading '" not in done.stderr  # nothing was graded


def test_two_workers_on_postgres_give_the_serial_grades_bit_for_bit(serial: dict, parallel: dict):
    first = parallel["after_first"]["grades"]
    assert set(first) == set(SERIAL), parallel["first"].stderr[-6000:]
    for student in SERIAL:  # every grade cell, and the total, compared as floats: equal, not close
        assert first[student] == serial["grades"][student], student


def test_a_worker_killed_costs_its_student_alone_named_in_the_log(parallel: dict):
    run = parallel["first"]
    assert parallel["killed"], "crash's worker was never seen grading"
    assert run.returncode == 1
    assert re.search(r"\[grading.batch ERROR\] 'crash' died in [\d.]+ s: the worker died \(signal SIGKILL\)",
                     run.stderr), run.stderr[-4000:]
    assert "crash" not in parallel["after_first"]["grades"]
    assert "crash" not in parallel["after_first"]["times"]  # its half-made autograded folder is gone


def test_a_submission_past_its_deadline_costs_its_student_alone(parallel: dict):
    run = parallel["first"]
    assert "'stall' timed out in" in run.stderr and f"past the deadline of {DEADLINE_S} s per student" in run.stderr
    assert "stall" not in parallel["after_first"]["grades"]
    assert "stall" not in parallel["after_first"]["times"]


def test_an_unsafe_folder_name_is_refused_by_name_and_not_globbed(parallel: dict):
    run = parallel["first"]
    assert "[grading.batch ERROR] '*' refused: student id '*' refused:" in run.stderr
    assert run.stderr.count("grading '") == len(PARALLEL)  # each student once: '*' was not everyone
    assert "not graded (no grade recorded for them; fix or look at each, then run the same command again to grade " \
        "only these): '*', 'crash', 'stall'" in run.stderr


def test_a_second_run_grades_only_what_is_missing(parallel: dict):
    second = parallel["second"]
    assert second.returncode == 1, second.stderr[-4000:]  # '*' is still there, and still refused
    assert re.findall(r"grading '([^']*)' \(worker pid", second.stderr) == ["crash"]
    assert f"1 graded, 1 not graded ('*'), {len(SERIAL)} already graded" in second.stderr
    assert parallel["grades"]["crash"]["total"] == sc.EXPECTED["slow"]
    before = parallel["after_first"]
    assert {s: g for s, g in parallel["grades"].items() if s != "crash"} == before["grades"]
    assert {s: t for s, t in parallel["times"].items() if s != "crash"} == before["times"]  # none rewritten


def test_feedback_is_made_from_the_postgres_gradebook(parallel: dict, tmp_path: Path):
    course = parallel["course"]
    done = nbgrader("generate_feedback", sc.NAME, f"--CourseDirectory.root={course}",
                    f"--CourseDirectory.db_url={parallel['db_url']}", f"--CourseDirectory.course_id={COURSE_ID}",
                    f"--Exchange.root={tmp_path / 'exchange'}")
    assert done.returncode == 0, done.stderr[-3000:]
    made = {p.parts[-3] for p in (course / "feedback").glob(f"*/{sc.NAME}/{sc.NAME}.html")}
    assert made == set(parallel["grades"])


def test_the_gradebook_moves_to_postgres_and_certify_and_export_read_it(serial: dict, postgres: ScratchPostgres,
                                                                        tmp_path: Path):
    from nbgrader.api import Gradebook

    from quizzes.certs import keygen

    with Gradebook(serial["db_url"]) as gb:  # certify identifies a learner by e-mail
        for student in SERIAL:
            gb.update_or_create_student(student, email=f"{student}@example.org", first_name=student.title())
    target = postgres.create_database("migrated")
    copy = [sys.executable, "-m", "grading", "copy-gradebook", serial["db_url"], target]
    refused = subprocess.run(copy, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "give --course-id NAME" in refused.stderr, refused.stderr[-2000:]
    copied = subprocess.run([*copy, "--course-id", COURSE_ID], cwd=ROOT, env=env(), capture_output=True,
                            text=True, timeout=600)
    assert copied.returncode == 0, copied.stderr[-3000:]
    assert f"({len(SERIAL)} submissions)" in copied.stdout and "every grade read back the same" in copied.stdout
    assert grades(target) == grades(serial["db_url"])
    again = subprocess.run([*copy, "--course-id", COURSE_ID], cwd=ROOT, env=env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 2 and "already holds a gradebook" in again.stderr

    key, _, _ = keygen(tmp_path / "key")
    outcomes = {}
    for name, url in (("sqlite", serial["db_url"]), ("postgres", target)):
        done = subprocess.run([sys.executable, "-m", "quizzes", "certify", "--gradebook", url, "--assignment",
                               sc.NAME, "--key", str(key), "--out", str(tmp_path / name), "--pass-mark", "80%"],
                              cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        outcomes[name] = sorted(p.name for p in (tmp_path / name).glob("*.credential.json"))
    passed = sorted(f"{s}.credential.json" for s, k in SERIAL.items() if sc.EXPECTED[k] / 3 >= 0.8)
    assert outcomes["postgres"] == outcomes["sqlite"] == passed
    credential = json.loads((tmp_path / "postgres" / passed[0]).read_text())
    assert credential["credentialSubject"]["type"] == ["AchievementSubject"]

    exported = tmp_path / "grades.csv"
    done = nbgrader("export", f"--CourseDirectory.db_url={target}", f"--to={exported}",
                    f"--CourseDirectory.root={serial['course']}", f"--Exchange.root={tmp_path / 'exchange'}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["student_id"]: float(row["score"]) for row in csv.DictReader(exported.open())}
    assert rows == {s: sc.EXPECTED[k] for s, k in SERIAL.items()}


def test_shards_cover_the_class_once_and_do_not_move_when_it_grows():
    ids = [f"student{i}" for i in range(500)]
    for count in (1, 2, 3, 8):
        owners = {s: [k for k in range(count) if Shard(k, count).holds(s)] for s in ids}
        assert all(len(k) == 1 for k in owners.values())
        sizes = [sum(1 for k in owners.values() if k == [i]) for i in range(count)]
        assert min(sizes) > 500 / count * 0.7  # a hash spreads them; no shard is left nearly empty
    assert parse_shard("3/4") == Shard(3, 4)


@pytest.mark.parametrize("bad", ["4/4", "1/0", "-1/2", "a/b", "2", ""])
def test_a_bad_shard_says_how_to_write_one(bad: str):
    with pytest.raises(BatchError, match=r"write K/N with 0 <= K < N"):
        parse_shard(bad)


def test_names_in_the_log_are_escaped():
    assert shown("ok\x1b[31m\u202eevil\n") == "ok\\x1b[31m\\u202eevil\\n"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(url: str, token: str, method: str = "GET", body: dict | None = None):
    import urllib.request

    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def test_the_formgrader_reads_and_writes_the_postgres_gradebook(parallel: dict, tmp_path: Path):
    """nbgrader's formgrader (its REST API, which its pages call) on the PostgreSQL gradebook the batch wrote: it
    lists every submission with the batch's score, and a manual grade typed into it lands in PostgreSQL."""
    import secrets
    import urllib.error

    from nbgrader.api import Gradebook

    course, db_url = parallel["course"], parallel["db_url"]
    (course / "nbgrader_config.py").write_text(  # what an instructor's course folder on PostgreSQL holds
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.db_url = {db_url!r}\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        f"c.Exchange.root = {str(tmp_path / 'exchange')!r}\n", encoding="utf-8")
    token, port = secrets.token_hex(16), _free_port()
    log = tmp_path / "formgrader.log"
    server_env = {**env(), "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
                  "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={token}", "--ServerApp.password=", f"--ServerApp.root_dir={course}",
             "--ServerApp.port_retries=0", *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=course, env=server_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/formgrader/api"
    try:
        deadline = time.monotonic() + 180
        while True:  # the server answers once its extensions (the formgrader among them) are loaded
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                listed = _api(f"{base}/submissions/{sc.NAME}", token)
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        scores = {s["student"]: s["score"] for s in listed if s["autograded"]}
        assert scores == {student: g["total"] for student, g in parallel["grades"].items()}
        student = "right0"
        (notebook,) = [n for n in _api(f"{base}/submitted_notebooks/{sc.NAME}/{sc.NAME}", token)
                       if n["student"] == student]
        grade = next(g for g in _api(f"{base}/grades?submission_id={notebook['id']}", token)
                     if g["name"] == "test_double")
        with Gradebook(db_url, COURSE_ID) as gb:
            stored = gb.find_grade("test_double", sc.NAME, sc.NAME, student)
            before = (stored.score, stored.needs_manual_grade)
        assert before[0] == grade["auto_score"] == 1
        changed = _api(f"{base}/grade/{grade['id']}", token, "PUT", {"manual_score": 0.5})
        assert changed["manual_score"] == 0.5 and not changed["needs_manual_grade"]
        with Gradebook(db_url, COURSE_ID) as gb:  # in PostgreSQL, read by another connection
            stored = gb.find_grade("test_double", sc.NAME, sc.NAME, student)
            assert stored.score == 0.5
            stored.manual_score, stored.needs_manual_grade = None, before[1]  # as autograde left it, for the rest
            gb.db.commit()
        with Gradebook(db_url, COURSE_ID) as gb:
            stored = gb.find_grade("test_double", sc.NAME, sc.NAME, student)
            assert (stored.score, stored.needs_manual_grade) == before
    finally:
        process.terminate()  # our own process only
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        (course / "nbgrader_config.py").unlink(missing_ok=True)
