"""A class on a real JupyterHub: deploy/hub/ as it is, real Unix users, the whole flow, every student kept apart.

As root (it creates Unix users): the hub (`make hub`: JupyterHub from PyPI, configurable-http-proxy from npm, the
class's venv from the system's Python) starts on a free loopback port with deploy/hub/jupyterhub_config.py and a
class.json of the test's. An instructor, a grader account and three students (alice, bob and mallory, who takes no
course) get PAM passwords; each logs in through the hub's API (a token from the password), each student's server
is spawned. Lab 1 goes through the instructor's formgrader (the grading service, as the grader account):
students added, released, fetched and submitted through each student's own server (nbgrader's Assignments
API), collected, autograded in the sandbox, feedback released and fetched. The graded quiz goes through the same
exchange with the grader's command line (a terminal of the grading service: its environment). Then certify and
verify. Asserted: the exact scores, that each student sees only their course, that `import minialloc` works in a
kernel of a student's home after the fetch and in the grader's home, and that mallory, as a real user, reads
nothing of the grader's (course directory, gradebook, scratch during autograde, bank, keys) nor of alice's (home,
exchange entries, feedback). The users are removed and the processes stopped by their ids.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
HUB_VENV = ROOT / ".venv-hub"
PROXY_BIN = ROOT / "deploy" / "hub" / "node_modules" / ".bin"
HUB_CONFIG = ROOT / "deploy" / "hub" / "jupyterhub_config.py"
COURSE = "minialloc-course"
LAB = "lab1_best_fit"
QUIZ = "quiz1"
GRADER, INSTRUCTOR = "mhgrader", "mhinstr"
ALICE, BOB, MALLORY = "mhalice", "mhbob", "mhmallory"
LOGIN_GROUP = "mhclass"
USERS = (GRADER, INSTRUCTOR, ALICE, BOB, MALLORY)
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
# what a busy two-core machine takes at most, per step (a spawn measured 9 to 14 s; autograde about 10 s a student)
STEP_S = 240
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"  # util-linux; root's PATH has sbin, the users' has not

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates Unix users and runs the hub as root")


# --- the machine: users, the grader's clone, the hub --------------------------------------------------------------
def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=STEP_S, **kw)
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def remove_users() -> None:
    for name in USERS:
        if subprocess.run(["id", name], capture_output=True).returncode == 0:
            uid = pwd.getpwnam(name).pw_uid
            stop_processes_of(uid)
            # the grader's scratch folder (grading/privacy.py), with what autograde left in it
            shutil.rmtree(Path(tempfile.gettempdir()) / f"minialloc-grader-{uid}", ignore_errors=True)
            subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["groupdel", LOGIN_GROUP], capture_output=True)


def stop_processes_of(uid: int) -> None:
    """Every process left running as `uid` (the hub's servers and kernels, started by this test), by its id."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def as_user(user: str, argv: list[str], cwd: Path | str, env: dict[str, str] | None = None,
            check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """`argv` run as `user` (runuser), in `cwd`, with the class's venv first on PATH and nothing of root's."""
    home = pwd.getpwnam(user).pw_dir
    base = {"PATH": f"{HUB_VENV / 'bin'}:/usr/bin:/bin", "HOME": home, "USER": user, "LANG": "C.UTF-8"}
    done = subprocess.run([RUNUSER, "-u", user, "--", *argv], cwd=cwd, env={**base, **(env or {})}, input=input,
                          capture_output=True, text=True, timeout=STEP_S)
    if check:
        assert done.returncode == 0, f"{user}: {argv}: {done.stdout[-4000:]}{done.stderr[-4000:]}"
    return done


@dataclass
class Hub:
    url: str
    state: Path
    exchange: Path
    clone: Path
    bank: Path
    keys: Path
    process: subprocess.Popen
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)

    def login(self, *names: str) -> None:
        """Log in through the hub's API: a token for each user, from their PAM password."""
        for name in names:
            request = urllib.request.Request(
                f"{self.url}/hub/api/users/{name}/tokens", method="POST", headers={"Content-Type": "application/json"},
                data=json.dumps({"auth": {"username": name, "password": self.passwords[name]}, "expires_in": 3600,
                                 "note": "test"}).encode())
            with urllib.request.urlopen(request, timeout=STEP_S) as reply:
                self.tokens[name] = json.loads(reply.read())["token"]

    def call(self, method: str, path: str, user: str, body: object = None, raw: bool = False):
        data = json.dumps(body).encode() if body is not None else b"" if method in ("POST", "PUT") else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"token {self.tokens[user]}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=STEP_S) as reply:
            text = reply.read().decode()
        return text if raw else (json.loads(text) if text.strip() else None)

    def formgrader(self, method: str, path: str, body: object = None):
        return self.call(method, f"/services/{COURSE}/formgrader/api/{path}", INSTRUCTOR, body)

    def assignments(self, student: str, action: str, assignment: str):
        query = f"course_id={COURSE}&assignment_id={assignment}"
        return self.call("POST", f"/user/{student}/assignments/{action}?{query}", student)


def wait_for(what: str, ready, hub_process: subprocess.Popen | None = None, timeout: float = STEP_S):
    """Poll `ready()` until it returns something true; fail, naming `what`, when the time is out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub_process is not None and hub_process.poll() is not None:
            pytest.fail(f"the hub exited while waiting for {what}")
        try:
            value = ready()
        except (urllib.error.URLError, ConnectionError, OSError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def make_clone(home: Path) -> Path:
    """The grader's clone of the repository, as far as grading reads it (the packages come from the venv)."""
    clone = home / "minialloc-course"
    (clone / "labs" / "source").mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", clone)
    shutil.copytree(ROOT / "labs" / "source" / LAB, clone / "labs" / "source" / LAB)
    (clone / "quizzes" / "graded").mkdir(parents=True)
    shutil.copy(ROOT / "quizzes" / "graded" / "nbgrader_config.py", clone / "quizzes" / "graded")
    return clone


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    if not (HUB_VENV / "bin" / "jupyterhub").exists() or not (PROXY_BIN / "configurable-http-proxy").exists():
        pytest.fail("the class's venv is missing: run  make hub  (make test builds it)")
    if shutil.which("bwrap") is None:
        pytest.fail("autograde needs bubblewrap: run  make system-packages")
    remove_users()  # what an interrupted run left
    state = Path(tempfile.mkdtemp(prefix="minialloc-hub-"))
    os.chmod(state, 0o711)  # students reach the exchange in it, nothing else
    process = None
    try:
        sh("groupadd", LOGIN_GROUP)
        passwords = {name: secrets.token_urlsafe(16) for name in USERS}
        for name in USERS:
            # homes as `useradd -m` makes them here (0755 by the login.defs' UMASK): the hub makes students' 0700
            sh("useradd", "-m", "-K", "HOME_MODE=0755", "-s", "/bin/bash", *(["-G", LOGIN_GROUP]
               if name != GRADER else []), name)
        sh("chpasswd", input="".join(f"{n}:{p}\n" for n, p in passwords.items()))
        check = subprocess.run([RUNUSER, "-u", "nobody", "--", str(HUB_VENV / "bin" / "python"), "-c", "0"],
                               capture_output=True, text=True)
        assert check.returncode == 0, (f"the hub's users cannot run {HUB_VENV}/bin/python: put the repository in "
                                       f"a folder every account can enter ({check.stderr.strip()})")
        grader_home = Path(pwd.getpwnam(GRADER).pw_dir)
        os.chmod(grader_home, 0o700)  # docs/jupyterhub.md: the grader's home first
        clone = make_clone(grader_home)
        bank = grader_home / "private-bank"
        shutil.copytree(ROOT / "tests" / "fixtures" / "private_bank", bank)
        sh("chown", "-R", f"{GRADER}:{GRADER}", str(grader_home))
        exchange = state / "exchange"
        (state / "hub").mkdir(mode=0o700)
        (state / "class.json").write_text(json.dumps({
            "course_id": COURSE, "grader": GRADER, "course_dir": str(clone), "instructors": [INSTRUCTOR],
            "login_group": LOGIN_GROUP, "exchange": str(exchange)}), encoding="utf-8")
        port = free_port()
        log = state / "hub.log"
        env = {"PATH": f"{HUB_VENV / 'bin'}:{PROXY_BIN}:/usr/bin:/bin", "LANG": "C.UTF-8",
               "MINIALLOC_HUB_CLASS": str(state / "class.json")}
        with open(log, "wb") as out:
            process = subprocess.Popen([str(HUB_VENV / "bin" / "jupyterhub"), "-f", str(HUB_CONFIG), f"--port={port}"],
                                       cwd=state / "hub", env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        made = Hub(f"http://127.0.0.1:{port}", state, exchange, clone, bank, grader_home / "issuer", process, log)
        wait_for("the hub's API", lambda: urllib.request.urlopen(f"{made.url}/hub/api/", timeout=10).status == 200,
                 process)
        made.passwords = passwords
        made.login(INSTRUCTOR)
        yield made
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)  # the hub stops its servers, the service and the proxy
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if (state / "hub.log").exists():  # shown by pytest when the test failed
            print((state / "hub.log").read_text(errors="replace")[-8000:])
        remove_users()
        shutil.rmtree(state, ignore_errors=True)


# --- what a student's server runs ----------------------------------------------------------------------------------
async def _execute(hub: Hub, user: str, code: str) -> str:
    """`code` run in a new kernel of `user`'s server (its working folder: the home); what it printed."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    kernel = hub.call("POST", f"/user/{user}/api/kernels", user, {"name": "python3"})
    try:
        ws = await websocket_connect(HTTPRequest(
            f"{hub.url.replace('http', 'ws', 1)}/user/{user}/api/kernels/{kernel['id']}/channels",
            headers={"Authorization": f"token {hub.tokens[user]}"}, connect_timeout=STEP_S))
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex, "msg_type": "execute_request",
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        printed = []
        while True:
            message = json.loads(await asyncio.wait_for(ws.read_message(), STEP_S))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if kind == "stream":
                printed.append(message["content"]["text"])
            elif kind == "error":
                printed.append("\n".join(message["content"]["traceback"]))
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                return "".join(printed)
    finally:
        hub.call("DELETE", f"/user/{user}/api/kernels/{kernel['id']}", user)


def in_kernel(hub: Hub, user: str, code: str) -> str:
    return asyncio.run(_execute(hub, user, code))


def notebook_of(hub: Hub, user: str, path: str) -> nbformat.NotebookNode:
    model = hub.call("GET", f"/user/{user}/api/contents/{path}?content=1", user)
    return nbformat.from_dict(model["content"])


def save_notebook(hub: Hub, user: str, path: str, nb: nbformat.NotebookNode) -> None:
    hub.call("PUT", f"/user/{user}/api/contents/{path}", user, {"type": "notebook", "format": "json", "content": nb})


def lab_answers(release: nbformat.NotebookNode, tasks: set[str] | None) -> nbformat.NotebookNode:
    """The release with the answer cells of `tasks` (all when None) written from the instructor's source."""
    source = nbformat.read(ROOT / "labs" / "source" / LAB / f"{LAB}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        if meta.get("solution") and (tasks is None or grade_id.split("_")[0] in tasks):
            cell.source = "\n".join(line for line in answers[grade_id].splitlines()
                                    if not any(m in line for m in MARKERS))
    return release


def quiz_answers(nb: nbformat.NotebookNode, student: str, answers: dict) -> nbformat.NotebookNode:
    for cell in nb.cells:
        if cell.get("id") == "student-id":
            cell.source = f'STUDENT_ID = "{student}"'
        m = re.fullmatch(r"(p\d+)-answer", cell.get("id", ""))
        if m and m.group(1) in answers:
            cell.source = f'answers["{m.group(1)}"] = {answers[m.group(1)]!r}'
    return nb


# --- mallory, as herself --------------------------------------------------------------------------------------------
PROBE = r"""
import json, os, sys
read = []
for path in json.loads(sys.argv[1]):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        read.append(path)
    except OSError:
        pass
print(json.dumps(read))
"""


def mallory_reads(paths: list[str]) -> list[str]:
    """Which of `paths` mallory can list or read, as her own Unix user."""
    done = as_user(MALLORY, ["python3", "-c", PROBE, json.dumps(paths)], cwd="/")
    return json.loads(done.stdout)


def terminal_env(user: str) -> dict[str, str]:
    """The environment of a terminal in `user`'s JupyterLab (the grader's: the grading service's), which knows the
    exchange and the hub: the server process's own, read by root."""
    uid = pwd.getpwnam(user).pw_uid
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            items = Path(f"/proc/{entry}/environ").read_bytes().decode().split("\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        env = dict(item.split("=", 1) for item in items if "=" in item)
        if "JUPYTERHUB_API_TOKEN" in env and (env.get("JUPYTERHUB_SERVICE_NAME") == COURSE or user != GRADER):
            return {k: v for k, v in env.items() if k.startswith(("JUPYTERHUB_", "JUPYTER_", "MINIALLOC_"))}
    pytest.fail(f"no server of {user}'s is running")


def autograde_while_mallory_tries(run) -> int:
    """`run()` (an autograde), while mallory tries every scratch folder the grader has, as long as it exists;
    how many tries found the folders still there afterwards (so they were tried while they held answers)."""
    scratch_root = Path(tempfile.gettempdir()) / f"minialloc-grader-{pwd.getpwnam(GRADER).pw_uid}"
    worker = threading.Thread(target=run)
    worker.start()
    tried_while_there = 0
    while worker.is_alive():
        live = glob.glob(f"{scratch_root}/minialloc-*/**", recursive=True)
        if live:
            assert mallory_reads([str(scratch_root), *live]) == []
            tried_while_there += any(os.path.exists(p) for p in live)
        time.sleep(0.2)
    worker.join()
    assert os.stat(scratch_root).st_mode & 0o777 == 0o700
    return tried_while_there


# --- the class -----------------------------------------------------------------------------------------------------
def test_a_class_on_jupyterhub(hub: Hub):
    students = (ALICE, BOB, MALLORY)
    wait_for("the grading service", lambda: hub.formgrader("GET", "status")["status"], hub.process)
    # before any student logged in, the instructor adds alice and bob on the formgrader's Manage Students page:
    # gradebook and hub group at once
    for student, first, last in ((ALICE, "An", "Nguyễn Văn"), (BOB, "Bob", "Builder")):
        hub.formgrader("PUT", f"student/{student}", {"first_name": first, "last_name": last,
                                                     "email": f"{student}@example.org"})
    hub.login(ALICE, BOB, MALLORY)
    groups = {s: hub.call("GET", f"/hub/api/users/{s}", s)["groups"] for s in students}
    assert groups == {ALICE: [f"nbgrader-{COURSE}"], BOB: [f"nbgrader-{COURSE}"], MALLORY: []}

    for student in students:  # spawn: each student's own server, as their Unix user
        hub.call("POST", f"/hub/api/users/{student}/server", student, {})
    for student in students:
        wait_for(f"{student}'s server", lambda s=student: hub.call("GET", f"/hub/api/users/{s}", s)
                 ["servers"].get("", {}).get("ready"), hub.process)
        home = pwd.getpwnam(student).pw_dir
        assert os.stat(home).st_mode & 0o077 == 0, f"{home} is not private after the spawn"

    # lab 1: generated and released by the formgrader (as the grader account, into the site's exchange)
    for step in ("assign", "release"):
        done = hub.formgrader("POST", f"assignment/{LAB}/{step}")
        assert done["success"], done
    assert (hub.exchange / COURSE / "outbound" / LAB / f"{LAB}.ipynb").is_file()
    assert not (hub.clone / "labs" / "exchange").exists()
    # each student sees only their course; mallory, in none, sees nothing and fetches nothing
    assert hub.call("GET", f"/user/{ALICE}/courses", ALICE)["value"] == [COURSE]
    assert hub.call("GET", f"/user/{MALLORY}/courses", MALLORY)["value"] == []
    listed = hub.call("GET", f"/user/{ALICE}/assignments?course_id={COURSE}", ALICE)["value"]
    assert [(a["assignment_id"], a["status"]) for a in listed] == [(LAB, "released")]
    hub.assignments(MALLORY, "fetch", LAB)
    assert not Path(pwd.getpwnam(MALLORY).pw_dir, COURSE).exists()

    path = f"{COURSE}/{LAB}/{LAB}.ipynb"
    for student, tasks in ((ALICE, None), (BOB, {"task1"})):
        hub.assignments(student, "fetch", LAB)
        save_notebook(hub, student, path, lab_answers(notebook_of(hub, student, path), tasks))
        hub.assignments(student, "submit", LAB)
    # a kernel in a student's home, beside the fetched ~/minialloc-course/, imports the package
    printed = in_kernel(hub, ALICE, "import os, minialloc; print(os.getcwd(), minialloc.__file__, "
                                    "minialloc.CachingAllocator.__name__)")
    cwd, file, name = printed.split()
    assert cwd == pwd.getpwnam(ALICE).pw_dir and file.startswith(str(HUB_VENV)) and name == "CachingAllocator"

    done = hub.formgrader("POST", f"assignment/{LAB}/collect")
    assert done["success"], done

    # autograde as the grader, in the sandbox; meanwhile mallory tries every scratch folder while it exists
    results: dict[str, dict] = {}

    def autograde() -> None:
        for student in (ALICE, BOB):
            results[student] = hub.formgrader("POST", f"submission/{LAB}/{student}/autograde")

    assert autograde_while_mallory_tries(autograde) > 0, "autograde left no scratch folder to try"
    assert results[ALICE]["success"] and results[BOB]["success"], results
    scratch_root = Path(tempfile.gettempdir()) / f"minialloc-grader-{pwd.getpwnam(GRADER).pw_uid}"

    scores = {s["student"]: s["score"] for s in hub.formgrader("GET", f"submissions/{LAB}")}
    assert scores == {ALICE: 12.0, BOB: 2.0}

    for step in ("generate_feedback", "release_feedback"):
        done = hub.formgrader("POST", f"assignment/{LAB}/{step}")
        assert done["success"], done
    for student in (ALICE, BOB):
        hub.assignments(student, "fetch_feedback", LAB)
        feedback = glob.glob(f"{pwd.getpwnam(student).pw_dir}/{COURSE}/{LAB}/feedback/*/{LAB}.html")
        assert len(feedback) == 1, feedback
        html = Path(feedback[0]).read_text(encoding="utf-8")
        assert not any(m in html for m in MARKERS) and "submission_secret" not in html

    # the graded quiz: the grader's command line, in a terminal of the grading service
    terminal = terminal_env(GRADER)
    quiz_dir = hub.clone / "quizzes" / "graded"
    grader = lambda *argv, **kw: as_user(GRADER, list(argv), quiz_dir, {**terminal, **kw.pop("env", {})}, **kw)  # noqa: E731
    grader("python", "-m", "quizzes", "build-graded", "--bank", str(hub.bank), "--new-secret")
    grader("nbgrader", "generate_assignment", QUIZ)
    grader("nbgrader", "release_assignment", QUIZ)
    for student, first, last in ((ALICE, "An", "Nguyễn Văn"), (BOB, "Bob", "Builder")):
        grader("nbgrader", "db", "student", "add", student, f"--first-name={first}", f"--last-name={last}",
               f"--email={student}@example.org")

    from quizzes.graded import grade_notebook
    from quizzes.graded.scoring import reference_answers
    from quizzes.graded.secret import load_secret

    secret = load_secret(hub.bank / "course.secret")
    quiz_path = f"{COURSE}/{QUIZ}/{QUIZ}.ipynb"
    expected = {}
    for student in (ALICE, BOB):
        if student == ALICE:  # alice in the Assignments tab, bob on the command line of his JupyterLab's terminal
            hub.assignments(student, "fetch", QUIZ)
        else:
            listed = as_user(BOB, ["nbgrader", "list"], pwd.getpwnam(BOB).pw_dir, terminal_env(BOB))
            assert f"{COURSE} {QUIZ}" in listed.stdout + listed.stderr
            as_user(BOB, ["nbgrader", "fetch_assignment", "--course", COURSE, QUIZ], pwd.getpwnam(BOB).pw_dir,
                    terminal_env(BOB))
        right = reference_answers(hub.bank, secret, student)
        answers = right if student == ALICE else {k: (v if i % 2 == 0 else "wrong") for i, (k, v) in
                                                  enumerate(sorted(right.items()))}
        nb = quiz_answers(notebook_of(hub, student, quiz_path), student, answers)
        expected[student] = round(sum(s.points for s in grade_notebook(nb, student, hub.bank, secret)), 4)
        save_notebook(hub, student, quiz_path, nb)
        if student == ALICE:
            hub.assignments(student, "submit", QUIZ)
        else:
            as_user(BOB, ["nbgrader", "submit", "--course", COURSE, QUIZ], pwd.getpwnam(BOB).pw_dir,
                    terminal_env(BOB))
    assert expected[ALICE] == 35 and 0 < expected[BOB] < 35
    grader("nbgrader", "collect", QUIZ)
    grader("nbgrader", "autograde", QUIZ, env={"MINIALLOC_PRIVATE_BANK": str(hub.bank)})
    grader("nbgrader", "generate_feedback", QUIZ, env={"MINIALLOC_PRIVATE_BANK": str(hub.bank)})
    grader("nbgrader", "release_feedback", QUIZ)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{quiz_dir / 'gradebook.db'}") as gb:
        quiz_scores = {s: gb.find_submission(QUIZ, s).score for s in (ALICE, BOB)}
    assert quiz_scores == expected
    hub.assignments(ALICE, "fetch_feedback", QUIZ)
    as_user(BOB, ["nbgrader", "fetch_feedback", "--course", COURSE, QUIZ], pwd.getpwnam(BOB).pw_dir,
            terminal_env(BOB))
    for student in (ALICE, BOB):
        assert glob.glob(f"{pwd.getpwnam(student).pw_dir}/{COURSE}/{QUIZ}/feedback/*/{QUIZ}.html"), student
    listed = as_user(MALLORY, ["nbgrader", "list"], pwd.getpwnam(MALLORY).pw_dir, terminal_env(MALLORY))
    assert COURSE not in listed.stdout + listed.stderr  # in no course: nothing released to her

    # certificates: the issuer's key in the grader's home, one credential for who passed, verified offline
    made = grader("python", "-m", "quizzes", "keygen", "--out", str(hub.keys))
    did = re.search(r"issuer id:\s+(did:key:\S+)", made.stdout).group(1)
    key = next(p for p in hub.keys.iterdir() if p.suffix == ".pem")
    grader("python", "-m", "quizzes", "certify", "--gradebook", "sqlite:///gradebook.db", "--assignment", QUIZ,
           "--key", str(key), "--out", str(quiz_dir / "certificates"), "--pass-mark", "80%")
    issued = sorted((quiz_dir / "certificates").glob("*.json"))
    assert len(issued) == 1, issued  # alice passed, bob did not
    grader("python", "-m", "quizzes", "verify", str(issued[0]), "--issuer", did, "--email", f"{ALICE}@example.org")
    other = grader("python", "-m", "quizzes", "verify", str(issued[0]), "--issuer", did, "--email",
                   f"{BOB}@example.org", check=False)
    assert other.returncode != 0  # issued to alice, not to bob

    # the grader's home: a Python started there (beside the clone) imports the package
    done = as_user(GRADER, ["python", "-c", "import minialloc; print(minialloc.__file__)"], cwd=hub.clone.parent)
    assert done.stdout.strip().startswith(str(HUB_VENV))

    # mallory, as herself, reads nothing of the grader's nor of alice's
    alice_home = Path(pwd.getpwnam(ALICE).pw_dir)
    private = [hub.clone.parent, hub.clone, hub.clone / "labs", hub.clone / "labs" / "gradebook.db",
               hub.clone / "labs" / "source", hub.clone / "labs" / "submitted" / ALICE, quiz_dir / "gradebook.db",
               hub.bank, hub.bank / "course.secret", key, scratch_root, alice_home, alice_home / COURSE,
               alice_home / COURSE / LAB / f"{LAB}.ipynb", hub.exchange / COURSE / "inbound",
               hub.exchange / COURSE / "feedback"]
    assert all(os.path.exists(p) for p in private), [p for p in private if not os.path.exists(p)]
    assert mallory_reads([str(p) for p in private]) == []
    # alice's entries in the exchange: nbgrader makes them readable to all (the grader collects them) under names
    # no one can list (inbound is write-only) nor guess (a random part); the feedback likewise, named by a hash of
    # the submission with its secret, which mallory cannot read
    entries = glob.glob(f"{hub.exchange}/{COURSE}/inbound/{ALICE}+*")
    assert len(entries) == 2 and all(re.fullmatch(rf"{ALICE}\+\w+\+[^+]+\+[\w-]{{12,}}", Path(e).name)
                                      for e in entries), entries
    # what she may read: the released assignments
    assert mallory_reads([str(hub.exchange / COURSE / "outbound" / LAB / f"{LAB}.ipynb")]) != []


def test_the_one_machine_exchange_keeps_students_apart(hub: Hub):
    """labs/README.md's one machine, no hub: the grader's and the students' command lines, nbgrader's default
    authenticator, an exchange outside the course; mallory, with a shell, reads nothing while autograde runs."""
    exchange = hub.state / "one-machine-exchange"
    exchange.mkdir()
    os.chmod(exchange, 0o1777)  # `sudo make exchange`, here at a folder of the test's
    flags = [f"--Exchange.root={exchange}"]
    as_user(GRADER, ["nbgrader", "generate_assignment", LAB, "--force", *flags], hub.clone)
    as_user(GRADER, ["nbgrader", "release_assignment", LAB, "--force", *flags], hub.clone)
    for student, tasks in ((ALICE, None), (BOB, {"task1"})):
        work = Path(pwd.getpwnam(student).pw_dir) / "one-machine"
        as_user(student, ["mkdir", "-m", "700", str(work)], "/")
        as_user(student, ["nbgrader", "fetch_assignment", "--course", COURSE, LAB, *flags], work)
        notebook = work / LAB / f"{LAB}.ipynb"  # nbgrader's default: no course folder (the hub's site adds one)
        answered = nbformat.writes(lab_answers(nbformat.read(str(notebook), as_version=4), tasks))
        as_user(student, ["python", "-c", "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())",
                          str(notebook)], work, input=answered)
        as_user(student, ["nbgrader", "submit", "--course", COURSE, LAB, *flags], work)
    assert mallory_reads([str(exchange / COURSE / "inbound"), str(Path(pwd.getpwnam(ALICE).pw_dir) / "one-machine")]
                         ) == []
    as_user(GRADER, ["nbgrader", "collect", LAB, "--update", *flags], hub.clone)
    done = {}
    tried = autograde_while_mallory_tries(lambda: done.setdefault("run", as_user(
        GRADER, ["nbgrader", "autograde", LAB, "--force"], hub.clone, check=False)))
    assert done["run"].returncode == 0, done["run"].stdout[-3000:] + done["run"].stderr[-3000:]
    assert tried > 0, "autograde left no scratch folder to try"
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{hub.clone / 'labs' / 'gradebook.db'}") as gb:
        assert {s: gb.find_submission(LAB, s).score for s in (ALICE, BOB)} == {ALICE: 12.0, BOB: 2.0}
