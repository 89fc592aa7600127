"""The student kernel's sandbox (grading/sandbox.py) and the grader's preprocessors, piece by piece.

The hostile suite (tests/test_nbgrader_hostile.py) grades attacks through nbgrader's whole pipeline; this file
checks the parts directly and quickly: sandbox_can_read against what a process in the real sandbox can read,
a sandboxed kernel's view (its files, user, limits, network, interrupt, what survives it, the message cap),
and the preprocessors that strip tags, score the quiz and scan feedback for keys. bwrap must be installed.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from grading import preprocessors as P
from grading.sandbox import Policy, SandboxKernelManager, sandbox_can_read

ROOT = Path(__file__).resolve().parent.parent
AS_ROOT = os.geteuid() == 0


def run_in_sandbox(code: str, workdir: Path, policy: Policy | None = None) -> subprocess.CompletedProcess:
    policy = policy or Policy.default(packages=("minialloc", "quizzes"))  # what sandbox_can_read asks about
    uid = 200_123 if AS_ROOT else -1
    if AS_ROOT:
        os.chown(workdir, uid, uid)
    cmd = policy.command([sys.executable, "-c", code], workdir=workdir, rw=[workdir], uid=uid)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def readable_in_sandbox(path: Path, workdir: Path) -> bool:
    code = f"open({str(path)!r}, 'rb').read(1)" if not path.is_dir() else f"import os; os.listdir({str(path)!r})"
    return run_in_sandbox(code, workdir).returncode == 0


@pytest.fixture()
def secret_home(tmp_path: Path) -> Path:
    """A stand-in for the instructor's home: an issuer key (0600) and a world-readable note."""
    home = tmp_path / "home"
    (home / ".minialloc-issuer").mkdir(parents=True)
    key = home / ".minialloc-issuer" / "issuer-ed25519.pem"
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a real key\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    (home / "note.txt").write_text("public")
    (home / "note.txt").chmod(0o644)
    return home


def test_sandbox_can_read_agrees_with_the_real_sandbox(tmp_path: Path, secret_home: Path):
    work = tmp_path / "work"
    work.mkdir()
    venv_file = Path(sys.prefix) / "pyvenv.cfg"
    minialloc_file = ROOT / "minialloc" / "__init__.py"
    cases = {
        venv_file: True, minialloc_file: True, Path(sys.executable): True,
        ROOT / "quizzes" / "graded" / "scoring.py": True,
        secret_home / ".minialloc-issuer" / "issuer-ed25519.pem": False, secret_home / "note.txt": False,
        ROOT / "labs" / "source": False, ROOT / "nbgrader_config.py": False, ROOT / "tests" / "fixtures": False,
        Path("/etc/shadow"): False,
    }
    for path, expected in cases.items():
        if not path.exists():
            continue
        assert sandbox_can_read(path) is expected, path
        assert readable_in_sandbox(path, work) is expected, path
    # the grader's home exists in the sandbox only as the way to a bound tree (a Python under ~/.pyenv)
    home = Path(os.path.expanduser("~"))
    done = run_in_sandbox(f"import os; print(sorted(os.listdir({str(home)!r})))", work)
    seen = eval(done.stdout) if done.returncode == 0 else []  # a list of names printed by the sandbox
    on_the_way = {t.relative_to(home).parts[0] for t in Policy.default().read_only if home in t.parents}
    assert set(seen) <= on_the_way, (seen, on_the_way)
    assert not sandbox_can_read(home)


@pytest.mark.skipif(not AS_ROOT, reason="the sandbox drops to a user id of its own only when the grader is root")
def test_a_private_file_inside_a_bound_tree_stays_private(tmp_path: Path):
    tree = tmp_path / "tree"
    tree.mkdir()
    tree.chmod(0o755)
    (tree / "open.txt").write_text("x")
    (tree / "open.txt").chmod(0o644)
    (tree / "private.txt").write_text("x")
    (tree / "private.txt").chmod(0o600)
    policy = Policy.default(extra_read_only=[str(tree)])
    work = tmp_path / "work"
    work.mkdir()
    for name, expected in (("open.txt", True), ("private.txt", False)):
        assert policy.can_read(tree / name) is expected
        code = f"open({str(tree / name)!r}).read()"
        assert (run_in_sandbox(code, work, policy).returncode == 0) is expected, name


def test_hidden_folders_look_empty(tmp_path: Path):
    tree = tmp_path / "pkg"
    (tree / "source").mkdir(parents=True)
    (tree / "source" / "answers.txt").write_text("42")
    for p in (tmp_path, tree, tree / "source"):
        p.chmod(0o755)
    (tree / "source" / "answers.txt").chmod(0o644)
    policy = Policy.default(extra_read_only=[str(tree)], hidden=[str(tree / "source")])
    assert not policy.can_read(tree / "source" / "answers.txt")
    work = tmp_path / "work"
    work.mkdir()
    done = run_in_sandbox(f"import os; print(os.listdir({str(tree / 'source')!r}))", work, policy)
    assert done.stdout.strip() == "[]", done


# --- A sandboxed kernel -------------------------------------------------------------------------------------------

class Kernel:
    """A SandboxKernelManager's kernel, driven the way nbclient drives it."""

    def __init__(self, cwd: Path, **traits):
        self.km = SandboxKernelManager(**traits)
        self.cwd = cwd

    async def __aenter__(self):
        await self.km.start_kernel(cwd=str(self.cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=60)
        return self

    async def __aexit__(self, *exc):
        self.kc.stop_channels()
        await self.km.shutdown_kernel(now=True)

    async def run(self, code: str, timeout: float = 60) -> tuple[str, dict]:
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

        reply = await self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return "".join(out), reply["content"]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture()
def submission(tmp_path: Path) -> Path:
    folder = tmp_path / "autograded" / "alice" / "lab"
    folder.mkdir(parents=True)
    (folder / "data.txt").write_text("the student's own file")
    return folder


def test_kernel_sees_its_folder_and_nothing_of_the_grader(submission: Path, secret_home: Path):
    gradebook = submission.parents[2] / "gradebook.db"
    gradebook.write_text("grades")

    async def main():
        async with Kernel(submission) as k:
            text, reply = await k.run(
                "import os\n"
                "print(os.getcwd(), open('data.txt').read())\n"
                "open('written.txt', 'w').write('x')\n"
                f"for p in [{str(gradebook)!r}, '../../../gradebook.db', {str(secret_home)!r}, "
                f"{str(ROOT / 'labs')!r}, '/etc/shadow']:\n"
                "    print(p, os.path.exists(p))\n"
                "print('uid', os.getuid())\n")
            return text, reply

    text, reply = run(main())
    assert reply["status"] == "ok", text
    assert f"{submission} the student's own file" in text
    assert text.count(" False") == 5, text
    assert ("uid 0" not in text) if AS_ROOT else True
    assert not (submission / "written.txt").exists()  # the kernel wrote to its own copy


def test_kernel_has_no_network(submission: Path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]

    async def main():
        async with Kernel(submission) as k:
            return await k.run(
                "import socket\n"
                f"for target in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
                "    try:\n"
                "        socket.create_connection(target, timeout=2)\n"
                "        print('connected', target)\n"
                "    except OSError as e:\n"
                "        print('refused', type(e).__name__)\n")

    text, _ = run(main())
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()
    assert "connected" not in text and text.count("refused") == 2, text


def test_limits_and_interrupt(submission: Path):
    async def main():
        async with Kernel(submission, memory_bytes=1024**3, max_processes=64) as k:
            limits, _ = await k.run("import resource\nprint(resource.getrlimit(resource.RLIMIT_AS), "
                                    "resource.getrlimit(resource.RLIMIT_NPROC))")
            big, big_reply = await k.run("x = bytearray(2 * 1024**3)")
            asyncio.get_running_loop().call_later(2, lambda: asyncio.ensure_future(k.km.interrupt_kernel()))
            slept, slept_reply = await k.run("import time\ntime.sleep(60)")
            after, _ = await k.run("print('still here')")
            return limits, big_reply, slept_reply, after

    limits, big_reply, slept_reply, after = run(main())
    assert f"({1024**3}, {1024**3})" in limits and (("(64, 64)" in limits) is AS_ROOT), limits
    assert big_reply["ename"] == "MemoryError"
    assert slept_reply["ename"] == "KeyboardInterrupt"  # interrupted through the control channel
    assert "still here" in after


def survivors(token: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_nothing_outlives_the_kernel(submission: Path):
    token = f"survivor-{uuid.uuid4().hex}"

    async def main():
        async with Kernel(submission) as k:
            text, _ = await k.run(
                "import subprocess, sys, os\n"
                f"subprocess.Popen([sys.executable, '-c', 'import time  # {token}\\ntime.sleep(300)'], "
                "start_new_session=True)\n"
                f"if os.fork() == 0:\n    os.setsid()\n"
                f"    os.execv('/bin/sh', ['sh', '-c', 'sleep 300; true', '{token}'])\n"
                "print('spawned')\n")
            time.sleep(0.5)
            assert len(survivors(token)) == 2, text  # they run while the kernel does
            return text

    run(main())
    deadline = time.monotonic() + 10
    while survivors(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert survivors(token) == []


def test_oversized_messages_are_refused_and_the_rest_arrives(submission: Path):
    async def main():
        async with Kernel(submission, max_message_bytes=1024**2) as k:
            small, _ = await k.run("print('y' * 100_000)")
            k.kc.execute("print('x' * 2_000_000)")
            reply = await k.kc.get_shell_msg(timeout=30)
            got = []
            try:
                while True:
                    got.append(await k.kc.get_iopub_msg(timeout=2))
            except Exception:  # Empty: nothing more arrives
                pass
            return small, reply["content"]["status"], got

    small, status, got = run(main())
    assert small.strip() == "y" * 100_000
    assert status == "ok"  # the kernel finished the cell; only its big output was refused
    assert not [m for m in got if m["msg_type"] == "stream"]


def test_kernelspec_of_the_notebook_is_ignored(submission: Path):
    async def main():
        async with Kernel(submission, kernel_name="no-such-kernel") as k:
            return await k.run("import sys\nprint(sys.executable)")

    text, _ = run(main())
    assert text.strip() == sys.executable


# --- Preprocessors, without a kernel -------------------------------------------------------------------------------

def test_strip_execution_control_removes_every_tag_and_the_kernelspec():
    nb = new_notebook(cells=[new_code_cell("1", metadata={"tags": ["skip-execution", "raises-exception", "x"]}),
                             new_code_cell("2")])
    nb.metadata["kernelspec"] = {"name": "evil", "display_name": "evil", "language": "python"}
    nb, _ = P.StripExecutionControl().preprocess(nb, {})
    assert all("tags" not in c.metadata for c in nb.cells)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert len(nb.metadata["grader_stripped"]) == 2


def pem_key(tmp_path: Path) -> tuple[Path, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "issuer-ed25519.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path, key


def test_scan_for_keys_redacts_every_form_of_the_key(tmp_path: Path):
    path, key = pem_key(tmp_path)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    body = [line for line in path.read_text().splitlines() if "-----" not in line][0]
    leaks = [path.read_text(), body, raw.hex(), base64.b64encode(raw).decode(),
             "-----BEGIN ENCRYPTED PRIVATE KEY-----\nabc", "z3u2" + "A" * 44, f"'{body[:24]}'\n'{body[24:]}'"]
    cells = [new_code_cell("print(1)", outputs=[new_output("stream", name="stdout", text=t)]) for t in leaks]
    cells.append(new_code_cell("print(2)", outputs=[new_output("stream", name="stdout", text="fine\n")]))
    cells.append(new_code_cell(f"x = {body!r}", outputs=[]))
    cells.append(new_code_cell("raise", outputs=[new_output("error", ename="E", evalue=raw.hex(), traceback=[])]))
    nb = new_notebook(cells=cells)
    scanner = P.ScanForKeys(key_files=[str(path)])
    nb, _ = scanner.preprocess(nb, {})
    text = nbformat.writes(nb)
    assert body not in text and raw.hex() not in text and "z3u2" not in text and "PRIVATE KEY" not in text
    assert "fine" in text
    assert len(nb.metadata["grader_redacted"]) == len(leaks) + 2


def test_quiz_grade_writes_scores_in_nbgraders_form(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from quizzes.graded import scoring, secret

    def fake(nb, student_id, bank_dir, secret_bytes, *, quiz=None):
        assert student_id == "alice" and quiz == "quiz1" and secret_bytes == b"s" * 32
        return [scoring.QuestionScore("slot01", 2.0, 2.0, "p01: right"),
                scoring.QuestionScore("slot02", 0.0, 2.0, "p02: wrong"),
                scoring.QuestionScore("slot03", 1.0, 2.0, "p03: 1 of 2 parts right")]

    monkeypatch.setattr(scoring, "grade_notebook", fake)
    (tmp_path / "course.secret").write_text("73" * 32)
    (tmp_path / "course.secret").chmod(0o600)
    assert secret.load_secret(tmp_path / "course.secret") == b"s" * 32

    def slot(n: int) -> nbformat.NotebookNode:
        return new_code_cell("Q.check()", metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                                 "grade_id": f"slot{n:02d}", "points": 2}},
                             outputs=[new_output("error", ename="AnswerError", evalue="", traceback=[])])

    nb = new_notebook(cells=[slot(1), slot(2), slot(3), slot(4)])
    grader = P.QuizGrade(bank_dir=str(tmp_path))
    nb, _ = grader.preprocess(nb, {"nbgrader": {"student": "alice", "assignment": "quiz1"}})
    from nbgrader.utils import determine_grade

    assert [determine_grade(c)[0] for c in nb.cells] == [2.0, 0.0, 1.0, 0.0]
    assert "p02: wrong" in nb.cells[1].outputs[0]["text"]


def test_no_bubblewrap_means_no_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from grading import sandbox

    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
        Policy.default().command([sys.executable, "-c", "pass"], workdir=tmp_path)
    km = SandboxKernelManager()
    with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
        run(km.start_kernel(cwd=str(tmp_path)))
    assert km._scratch is None  # its copy of the submission is not left behind


# --- What the grader accepts, its descriptors, a course inside a package, active content ------------------------

def test_submission_with_links_or_special_files_is_refused(tmp_path: Path):
    from grading.intake import SubmissionRefused, check_submission

    key = tmp_path / "key.pem"
    key.write_text("secret")
    course = tmp_path / "course"
    clean = course / "submitted" / "alice" / "lab"
    (clean / "data").mkdir(parents=True)
    (clean / "lab.ipynb").write_text("{}")
    (clean / "data" / "x.csv").write_text("1")
    check_submission(clean, course)  # folders and regular files of its own: accepted
    cases = {
        "symlink": lambda f: (f / "notes.txt").symlink_to(key),
        "dirlink": lambda f: (f / "data" / "more").symlink_to(tmp_path, target_is_directory=True),
        "hardlink": lambda f: os.link(key, f / "notes.txt"),
        "fifo": lambda f: os.mkfifo(f / "data" / "pipe"),
        "notebook": lambda f: ((f / "lab.ipynb").unlink(), (f / "lab.ipynb").symlink_to(key)),
        "name\u202e": lambda f: (f / "tx\u202et.txt").symlink_to(key),
    }
    for case, make in cases.items():
        folder = course / "submitted" / case / "lab"
        shutil.copytree(clean, folder)
        make(folder)
        with pytest.raises(SubmissionRefused, match="refused") as refused:
            check_submission(folder, course)
        assert "\u202e" not in str(refused.value)  # the student's file names are escaped
    # the student's folder, or the assignment's, a link: refused too
    (course / "submitted" / "bob").mkdir()
    (course / "submitted" / "bob" / "lab").symlink_to(clean, target_is_directory=True)
    (course / "submitted" / "carol").symlink_to(course / "submitted" / "alice", target_is_directory=True)
    for who in ("bob", "carol"):
        with pytest.raises(SubmissionRefused, match="is not a folder"):
            check_submission(course / "submitted" / who / "lab", course)


def test_the_config_installs_the_checked_autograde_and_collect():
    from nbgrader.apps import api, autogradeapp
    from traitlets.config.loader import PyFileConfigLoader

    from grading.intake import CheckedAutograde, CheckedCollect

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert api.Autograde is CheckedAutograde and autogradeapp.Autograde is CheckedAutograde
    assert config.ExchangeFactory.collect is CheckedCollect
    assert config.HTMLExporter.sanitize_html is True


def test_checked_collect_copies_no_link(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    from grading.intake import CheckedCollect

    inbound = tmp_path / "alice+lab+2026-01-01 00:00:00.000000 UTC"
    inbound.mkdir()
    (inbound / "lab.ipynb").write_text("{}")
    (inbound / "notes.txt").symlink_to(tmp_path / "key.pem")
    (tmp_path / "key.pem").write_text("secret")
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    config = Config()
    config.ExchangeCollect.check_owner = False  # no user alice here: the link is what is refused
    collect = CheckedCollect(coursedir=CourseDirectory(config=config), authenticator=Authenticator(config=config),
                             config=config)
    collect.do_copy(str(inbound), str(tmp_path / "submitted"))
    assert not (tmp_path / "submitted").exists()
    assert "'notes.txt' is a symbolic link" in caplog.text


def test_kernel_inherits_none_of_the_graders_descriptors(submission: Path, capfd: pytest.CaptureFixture):
    """ipykernel moves fds 1 and 2 to pipes of its own and keeps a copy of the originals: those copies (and every
    other descriptor of the kernel) are not the grader's stdout or stderr, and what it writes there is lost."""
    token = f"fake-{uuid.uuid4().hex}"
    mine = {(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (1, 2)}

    async def main():
        async with Kernel(submission) as k:
            return await k.run(
                "import os, stat\n"
                "for fd in sorted(int(n) for n in os.listdir('/proc/self/fd')):\n"
                "    try:\n"
                "        st = os.fstat(fd)\n"
                "    except OSError:\n"
                "        continue\n"
                "    print('FD', fd, st.st_dev, st.st_ino)\n"
                "    if stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode):\n"
                "        try:\n"
                f"            os.write(fd, b'{token} Autograde succeeded: 100/100\\n')\n"
                "            os.ftruncate(fd, 0)\n"
                "        except OSError:\n"
                "            pass\n")

    text, reply = run(main())
    assert reply["status"] == "ok", text
    seen = {(int(dev), int(ino)) for _, _, dev, ino in (line.split() for line in text.splitlines()
                                                          if line.startswith("FD "))}
    assert len(seen) >= 3 and not seen & mine, (seen, mine)
    out, err = capfd.readouterr()
    assert token not in out and token not in err


def test_a_course_inside_a_bound_package_is_masked(tmp_path: Path):
    """The graded quiz's course root is a package folder: the kernel sees its Python files and nothing of the
    course (sources, submissions, autograded notebooks, the gradebook, the log)."""
    tmp_path.chmod(0o755)
    pkg = tmp_path / "pkg"
    files = {"__init__.py": "", "student.py": "X = 1", "gradebook.db": "grades", ".nbgrader.log": "log",
             "grades.csv": "a,1", "source/quiz1/quiz1.ipynb": "{}", "release/quiz1/quiz1.ipynb": "{}",
             "submitted/bob/quiz1/quiz1.ipynb": "{}", "autograded/bob/quiz1/quiz1.ipynb": "{}",
             "feedback/bob/quiz1/quiz1.html": "<p>", "exchange/inbound/x": "x"}
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    for folder, _dirs, names in os.walk(pkg):
        os.chmod(folder, 0o755)
        for n in names:
            os.chmod(os.path.join(folder, n), 0o644)
    policy = Policy.default(extra_read_only=[str(pkg)], code_only=[str(pkg)])
    work = tmp_path / "work"
    work.mkdir()
    code = (
        "import os, json\n"
        f"root = {str(pkg)!r}\n"
        "seen = {}\n"
        "for folder, dirs, names in os.walk(root):\n"
        "    for n in names:\n"
        "        p = os.path.join(folder, n)\n"
        "        try:\n"
        "            seen[os.path.relpath(p, root)] = open(p).read()\n"
        "        except OSError as e:\n"
        "            seen[os.path.relpath(p, root)] = type(e).__name__\n"
        "print(json.dumps(seen))\n")
    done = run_in_sandbox(code, work, policy)
    assert done.returncode == 0, done.stderr
    seen = __import__("json").loads(done.stdout)
    # a masked file is a device node on a mount without devices: it cannot even be opened
    denied = "PermissionError"
    assert seen == {"__init__.py": "", "student.py": "X = 1", "gradebook.db": denied, ".nbgrader.log": denied,
                    "grades.csv": denied}, seen
    for name in files:
        assert policy.can_read(pkg / name) is name.endswith(".py"), name


def test_quiz_config_masks_its_course_root():
    from traitlets.config.loader import PyFileConfigLoader

    quiz = ROOT / "quizzes" / "graded"
    config = PyFileConfigLoader("nbgrader_config.py", path=str(quiz)).load_config()
    assert Path(config.CourseDirectory.root) == quiz
    assert config.SandboxKernelManager.code_only == [str(quiz)]
    policy = SandboxKernelManager(config=config).policy()
    for name in ("source", "submitted", "autograded", "feedback", "release", "gradebook.db"):
        assert any(h == quiz / name for h in policy.hidden) or not (quiz / name).exists(), name
        assert not policy.can_read(quiz / name)
    assert policy.can_read(quiz / "student.py")
    assert config.HideTestTracebacks.keep_test_output is True


def json_of(output) -> str:
    return __import__("json").dumps(output)


def test_inert_outputs_and_test_cells_in_feedback():
    png = base64.b64encode(b"\x89PNG fake").decode()
    outputs = [new_output("display_data", data={"text/html": "<script>alert(1)</script>"}),
               new_output("display_data", data={"application/javascript": "alert(2)", "text/plain": "js"}),
               new_output("display_data", data={"image/svg+xml": "<svg onload=alert(3)/>", "image/png": png},
                          metadata={"image/png": {"width": '"><script>'}}),
               new_output("execute_result", data={"image/png": '"><script>alert(4)</script>'}, execution_count=1),
               new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "m"}})]
    answer = new_code_cell("x", outputs=outputs)
    test = new_code_cell("assert f() == 1", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                   "grade_id": "t", "points": 1}},
                         outputs=[new_output("stream", name="stdout", text="LEAK assert hidden()\n"),
                                  new_output("display_data", data={"text/plain": "LEAK 2"}),
                                  new_output("error", ename="AssertionError", evalue="no", traceback=["x", "y"])])
    written = new_markdown_cell("My answer: <img src=x onerror=alert(5)> and [more](java&#115;cript:alert(6))")
    plain = new_markdown_cell("# Heading\n\n*fine*, a < b, [docs](https://example.org) <b>bold</b>")
    nb = new_notebook(cells=[answer, test, written, plain])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb, _ = P.InertOutputs().preprocess(nb, {})
    kinds = {k for o in nb.cells[0].outputs for k in o.get("data", {})}
    assert kinds == {"text/plain", "image/png"}, kinds
    text = nbformat.writes(nb)
    assert "<script>" not in text and "widgets" not in nb.metadata
    assert "alert" not in "".join(json_of(o) for c in nb.cells[:2] for o in c.outputs)
    assert len(nb.metadata["grader_inert"]) == 7
    from nbconvert.filters.markdown import markdown2html

    shown = markdown2html(nb.cells[2].source)
    assert "grader shows this cell as text" in shown and "<img" not in shown and "href" not in shown
    assert nb.cells[3].source.startswith("# Heading")  # nothing active: left as written
    assert all(o.get("metadata", {}) == {} for o in nb.cells[0].outputs)
    fed, _ = P.HideTestTracebacks().preprocess(copy.deepcopy(nb), {})
    assert "LEAK" not in nbformat.writes(fed)
    assert [o.output_type for o in fed.cells[1].outputs] == ["stream", "error"]
    # the kernel wrote this test's message (no lab scored by LabGrade, no quiz): the student's text, not shown
    assert fed.cells[1].outputs[1]["traceback"] == ["AssertionError: this test failed"]
    kept, _ = P.HideTestTracebacks(keep_test_output=True).preprocess(copy.deepcopy(nb), {})
    assert "LEAK 2" in nbformat.writes(kept)
    assert kept.cells[1].outputs[-1]["traceback"] == ["AssertionError: no"]  # the grader wrote it: kept
    scored, _ = P.HideTestTracebacks().preprocess(copy.deepcopy(nb), {"nbgrader": {"assignment": "lab1_best_fit"}})
    assert scored.cells[1].outputs[1]["traceback"] == ["AssertionError: no"]  # LabGrade's verdict: kept
    withheld, _ = P.KernelOutputsWithheld().preprocess(copy.deepcopy(nb), {})
    assert [o["text"] for o in withheld.cells[0].outputs] == [P.KernelOutputsWithheld.note]
    assert withheld.cells[1].outputs == nb.cells[1].outputs  # test cells are HideTestTracebacks' to trim


def test_redact_hidden_tests_removes_outputs_that_quote_them():
    test = new_code_cell("assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(12345) == secret_value(12345)\n"
                         "### END HIDDEN TESTS", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                        "grade_id": "t", "points": 1}})
    later = new_code_cell("print(captured)", outputs=[
        new_output("stream", name="stdout", text="'assert f(12345) == '\n'secret_value(12345)'\n"),
        new_output("stream", name="stdout", text="assert f(1) == 1\n")])
    nb, _ = P.RedactHiddenTests().preprocess(new_notebook(cells=[test, later]), {})
    assert [o["text"] for o in nb.cells[1].outputs] == [
        "[removed by the grader: this output quoted a hidden test]\n", "assert f(1) == 1\n"]
    assert nb.metadata["grader_redacted_tests"]
