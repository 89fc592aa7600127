"""nbgrader collect, as the repository's nbgrader_config.py configures it, against hostile exchange folders.

The students are real users of this machine (useradd, removed after the module), and every exchange folder is
made by a process running as the user who would make it: as `nbgrader submit` run by that student would. The
tests need root (to add users and act as them); without it they are skipped, saying so.

- impersonation: mallory's `alice+lab+<later time>` is refused by its owner, alice's own submission is the one
  collected; mallory's own submission is collected as hers.
- unsafe ids in folder names (`*`, a CSV row, a formula, markup, `..`) are refused by name, the rest collected.
- links and hard links to the course secret are refused.
- the race: a process of the student's keeps swapping a submitted file for a symbolic link to the course secret
  during collect; no collected copy ever holds the secret (with the copy's privilege drop and without it), and
  the same race against a check of the source followed by a copy (nbgrader's copytree) leaks it.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

from grading import intake, safe_copy

ROOT = Path(__file__).resolve().parent.parent
COURSE = "course101"
ASSIGNMENT = "lab9"
RACE_SECONDS = 4.0
SECRET = b"COURSE-SECRET-" + uuid.uuid4().hex.encode()

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the students are users added with useradd"),
    pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning"),
]


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Three students, as users of this machine (login name == student id)."""
    tag = uuid.uuid4().hex[:6]
    names = {role: f"{role}{tag}" for role in ("alice", "bob", "mallory")}
    made = []
    try:
        for name in names.values():
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
            made.append(name)
        yield {role: pwd.getpwnam(name) for role, name in names.items()}
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False)


def as_user(user: pwd.struct_passwd, action: Callable[[], None]) -> None:
    """Run `action` in a child process with the user's ids (as that student's own process would)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            action()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the action as {user.pw_name} failed"


class Course:
    def __init__(self, tmp: Path):
        self.root = tmp / "course"
        self.exchange = tmp / "exchange"
        self.inbound = self.exchange / COURSE / "inbound"
        self.inbound.mkdir(parents=True)
        os.chmod(self.exchange, 0o777)
        os.chmod(self.exchange / COURSE, 0o755)
        os.chmod(self.inbound, 0o2733)  # what nbgrader's release makes: students write, cannot list
        self.root.mkdir(mode=0o700)  # the grader's alone: grading/privacy.py refuses a course others can read
        self.secret = tmp / "course.secret"  # the instructor's: root's, 0600
        self.secret.write_bytes(SECRET)
        self.secret.chmod(0o600)
        config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
        config.CourseDirectory.root = str(self.root)
        config.CourseDirectory.db_url = f"sqlite:///{self.root / 'gradebook.db'}"
        config.CourseDirectory.course_id = COURSE
        config.CourseDirectory.assignment_id = ASSIGNMENT
        config.Exchange.root = str(self.exchange)
        self.config = config
        # nbgrader runs the `alembic` script by name; the venv need not be activated
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

    def submit(self, user: pwd.struct_passwd, name: str, files: dict[str, bytes],
               extra: Callable[[Path], None] | None = None) -> Path:
        folder = self.inbound / name

        def make() -> None:
            folder.mkdir()
            for file, data in files.items():
                (folder / file).write_bytes(data)
            if extra is not None:
                extra(folder)
        as_user(user, make)
        return folder

    def collect(self) -> list[str]:
        """nbgrader collect --update, as CollectApp runs it; returns the errors it logged."""
        from nbgrader.auth import Authenticator
        from nbgrader.coursedir import CourseDirectory
        from nbgrader.exchange import ExchangeFactory

        log = logging.getLogger(f"collect-{uuid.uuid4().hex}")
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append
        log.addHandler(handler)
        log.propagate = False
        self.config.ExchangeCollect.update = True
        factory = ExchangeFactory(config=self.config)
        assert factory.collect is intake.CheckedCollect, "nbgrader_config.py no longer installs CheckedCollect"
        collect = factory.Collect(coursedir=CourseDirectory(config=self.config),
                                  authenticator=Authenticator(config=self.config), config=self.config, log=log)
        collect.start()
        return [r.getMessage() for r in records if r.levelno >= logging.ERROR]

    def collected(self, student: str) -> Path:
        return self.root / "submitted" / student / ASSIGNMENT


def stamp(seconds: int) -> str:
    return f"2026-12-01 10:00:{seconds:02d}.000000 UTC"


@pytest.fixture
def course() -> Iterator[Course]:
    # not pytest's tmp_path: its parents are private to root, and the students' processes must reach the exchange
    tmp = Path(tempfile.mkdtemp(prefix="intake-"))
    os.chmod(tmp, 0o755)
    try:
        yield Course(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- ids ---------------------------------------------------------------------------------------------------------

HOSTILE_IDS = ["*", "eve,,,,35.0,0.0,35.0,35.0", "=HYPERLINK(\"http://x\")", "+cmd", "-1", "@SUM(A1)",
               "<img src=x onerror=alert(1)>", "..", "a..b", ".hidden", "a/b", "a b", "", "x" * 65, "é", "a\nb"]


@pytest.mark.parametrize("value", HOSTILE_IDS)
def test_unsafe_ids_are_refused_by_name(value: str):
    problem = intake.id_problem("student id", value)
    assert problem is not None
    assert problem.startswith("student id ") and "\n" not in problem and "<" not in problem.replace("'<", "")


@pytest.mark.parametrize("value", ["alice", "j.smith", "s_01", "A-7", "x" * 64])
def test_safe_ids_pass(value: str):
    assert intake.id_problem("student id", value) is None


# --- collect -----------------------------------------------------------------------------------------------------

def test_a_folder_named_for_another_student_is_refused(course: Course, users):
    alice, bob, mallory = users["alice"], users["bob"], users["mallory"]
    course.submit(alice, f"{alice.pw_name}+{ASSIGNMENT}+{stamp(1)}", {"answer.txt": b"alice's own"})
    course.submit(mallory, f"{alice.pw_name}+{ASSIGNMENT}+{stamp(9)}", {"answer.txt": b"mallory's, as alice"})
    course.submit(mallory, f"{mallory.pw_name}+{ASSIGNMENT}+{stamp(2)}", {"answer.txt": b"mallory's own"})
    course.submit(bob, f"{bob.pw_name}+{ASSIGNMENT}+{stamp(3)}", {"answer.txt": b"bob's own"})
    errors = course.collect()
    assert (course.collected(alice.pw_name) / "answer.txt").read_bytes() == b"alice's own"
    assert (course.collected(mallory.pw_name) / "answer.txt").read_bytes() == b"mallory's own"
    assert (course.collected(bob.pw_name) / "answer.txt").read_bytes() == b"bob's own"
    refused = [e for e in errors if stamp(9) in e]
    assert len(refused) == 1 and f"belongs to {mallory.pw_name!r}" in refused[0], errors


def test_unsafe_ids_in_folder_names_are_refused_and_the_rest_collected(course: Course, users):
    mallory, bob = users["mallory"], users["bob"]
    for n, hostile in enumerate(["*", "eve,,,,35.0,0.0,35.0,35.0", "=1+2", "<img src=x onerror=alert(1)>", "a..b"]):
        course.submit(mallory, f"{hostile}+{ASSIGNMENT}+{stamp(10 + n)}", {"answer.txt": b"x"})
    course.submit(bob, f"{bob.pw_name}+{ASSIGNMENT}+{stamp(3)}", {"answer.txt": b"bob's own"})
    errors = course.collect()
    assert sorted(os.listdir(course.root / "submitted")) == [bob.pw_name]
    assert len([e for e in errors if "refused: an id is" in e]) == 5, errors
    assert all("\n" not in e.strip() for e in errors)


def test_links_hard_links_and_fifos_are_not_collected(course: Course, users):
    alice, bob, mallory = users["alice"], users["bob"], users["mallory"]
    secret = str(course.secret)
    course.submit(alice, f"{alice.pw_name}+{ASSIGNMENT}+{stamp(1)}", {"a.txt": b"a"},
                  lambda f: os.symlink(secret, f / "notes.txt"))
    course.submit(bob, f"{bob.pw_name}+{ASSIGNMENT}+{stamp(1)}", {"a.txt": b"a"}, lambda f: os.mkfifo(f / "pipe"))
    # a hard link needs a file the student may link (protected_hardlinks): their own, linked from elsewhere
    course.submit(mallory, f"{mallory.pw_name}+{ASSIGNMENT}+{stamp(1)}", {"a.txt": b"a"},
                  lambda f: os.link(f / "a.txt", f / "b.txt"))
    errors = course.collect()
    assert not any(course.collected(user.pw_name).exists() for user in (alice, bob, mallory))
    joined = "\n".join(errors)
    assert "'notes.txt' is a symbolic link" in joined
    assert "'pipe' is not a regular file" in joined
    assert "hard links" in joined
    assert SECRET.decode() not in joined


def test_a_file_of_another_user_in_a_folder_refuses_it(course: Course, users):
    """nbgrader submit leaves the exchange folder writable by all (0777); another student's file in it is refused."""
    alice, mallory = users["alice"], users["mallory"]
    folder = course.submit(alice, f"{alice.pw_name}+{ASSIGNMENT}+{stamp(1)}", {"a.txt": b"a"},
                           lambda f: f.chmod(0o777))
    as_user(mallory, lambda: (folder / "planted.txt").write_bytes(b"mallory's"))
    errors = course.collect()
    assert not course.collected(alice.pw_name).exists()
    assert any("'planted.txt' belongs to user id" in e for e in errors), errors


# --- the race ----------------------------------------------------------------------------------------------------

def swapper(folder: Path, target: str, seconds: float) -> Callable[[], None]:
    """The student's racing process: notes.txt is, in turn, a regular file and a link to `target`."""
    def race() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            link, plain = folder / ".l", folder / ".p"
            try:
                os.symlink(target, link)
                os.replace(link, folder / "notes.txt")
                plain.write_bytes(b"just notes")
                os.replace(plain, folder / "notes.txt")
            except FileNotFoundError:
                continue
    return race


def race_collect(course: Course, student: pwd.struct_passwd, copy: Callable[[Path, Path], None]) -> tuple[int, int]:
    """Run `copy` of the racing student's folder over and over for RACE_SECONDS; (copies made, copies leaking)."""
    folder = course.submit(student, f"{student.pw_name}+{ASSIGNMENT}+{stamp(1)}",
                           {"answer.txt": b"a" * 20_000, "notes.txt": b"just notes"})
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(student.pw_gid)
            os.setuid(student.pw_uid)
            swapper(folder, str(course.secret), RACE_SECONDS)()
            code = 0
        finally:
            os._exit(code)
    made = leaked = 0
    try:
        deadline = time.monotonic() + RACE_SECONDS - 0.5
        while time.monotonic() < deadline:
            dest = course.root / "copy"
            shutil.rmtree(dest, ignore_errors=True)
            try:
                copy(folder, dest)
            except (safe_copy.CopyRefused, intake.SubmissionRefused, OSError):
                continue
            made += 1
            leaked += any(SECRET in p.read_bytes() for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return made, leaked


def test_a_racing_link_swap_never_lands_the_secret_in_the_copy(course: Course, users):
    student = users["alice"]
    made, leaked = race_collect(course, student, lambda src, dest: safe_copy.copy_folder(
        src, dest, owner=student.pw_uid, group=student.pw_gid))
    assert made > 0, "no copy completed: the race did not let any through, so nothing was shown"
    assert leaked == 0


def test_the_checks_on_the_descriptors_hold_without_the_privilege_drop(course: Course, users, monkeypatch):
    student = users["alice"]
    monkeypatch.setattr(safe_copy, "acting_as", lambda uid, gid: _nothing())
    made, leaked = race_collect(course, student, lambda src, dest: safe_copy.copy_folder(
        src, dest, owner=student.pw_uid, group=student.pw_gid))
    assert made > 0 and leaked == 0


def test_check_then_copy_is_the_race_this_defends(course: Course, users):
    """The control: the check on the source, then shutil.copytree (nbgrader's copy), under the same race."""
    def check_then_copy(src: Path, dest: Path) -> None:
        intake.check_submission(src)
        shutil.copytree(src, dest)
    made, leaked = race_collect(course, users["alice"], check_then_copy)
    assert leaked > 0, f"{made} copies, none leaked: the racer did not reach the window this test is about"


def test_collect_under_the_race_collects_no_secret(course: Course, users):
    """The whole collect, repeated while the student's process races: every collected copy is clean."""
    student = users["bob"]
    folder = course.submit(student, f"{student.pw_name}+{ASSIGNMENT}+{stamp(1)}",
                           {"answer.txt": b"b" * 20_000, "notes.txt": b"just notes"})
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(student.pw_gid)
            os.setuid(student.pw_uid)
            swapper(folder, str(course.secret), RACE_SECONDS)()
            code = 0
        finally:
            os._exit(code)
    collected = refused = 0
    try:
        deadline = time.monotonic() + RACE_SECONDS - 0.5
        while time.monotonic() < deadline:
            shutil.rmtree(course.root / "submitted", ignore_errors=True)
            errors = course.collect()
            copy = course.collected(student.pw_name)
            if copy.exists():
                collected += 1
                assert all(SECRET not in p.read_bytes() for p in copy.rglob("*") if p.is_file())
            refused += bool(errors)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert collected + refused > 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
