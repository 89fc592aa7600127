"""The course in a real browser: JupyterLab served from a temporary copy of the repository, driven by Chromium.

JupyterLab runs on 127.0.0.1 on a free port with no token, in a copy of the repository (so nothing the notebooks
write lands in the checkout), on the simulated GPU. Debian's Chromium (apt-get install chromium) is driven by
Playwright (pip install playwright; never `playwright install`, which downloads a browser of its own). If either
is missing, or the browser cannot start, the tests fail: they are part of what CI proves.

- Chapter 2 runs top to bottom from the Run menu; its segment map renders as an image in an output area, and
  its stepper renders as a live widget whose "one step forward" button moves the slider.
- A practice quiz (quizzes.practice) is answered wrongly, then rightly, reading the feedback each time, and its
  language is switched.
- The README's first command, `make course`, exactly as written (as root in CI: JupyterLab then needs
  --allow-root, which the Makefile adds for root only), in a copy of the repository: its start page opens in
  Chromium with the URL and token the command prints, and nbgrader's formgrader on the same server lists the labs.
- That JupyterLab is the learner's: no nbgrader Validate button, and a practice quiz run, saved and reopened after
  its kernel is gone shows the saved quiz, not "model not found". `make grade`'s JupyterLab keeps Validate.
Screenshots go to test-artifacts/browser/ (ignored by git); CI can keep them as artifacts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # root in a container, no GPU, no network chatter
SERVER_START_S = 60
RUN_ALL_S = 120  # chapter 2 runs in about 10 s on two cores; the stepper renders one PNG per step it shows
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", ".cache", ".pytest_cache", ".ruff_cache", ".hypothesis",
                                     "__pycache__", "*.egg-info", "build", "dist", "test-artifacts",
                                     ".ipynb_checkpoints", "release", "submitted", "autograded", "feedback",
                                     "gradebook.db")
# JupyterLab user settings for the test: every cell stays in the page (no virtual scrolling, so off-screen outputs
# can be inspected), and no news or update checks (no network, no toast over the notebook)
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    url: str
    root: Path
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("browser")
    root = tmp / "repo"
    shutil.copytree(ROOT, root, ignore=COPY_IGNORE)
    settings = tmp / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernels need the inline backend
    env.update(
        MINIALLOC_DEVICE="sim",
        PYTHONPATH=os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")])),  # the copy's quizzes
        JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),  # no user configuration leaks in
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),  # no saved layout from an earlier run
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    log = tmp / "jupyterlab.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
             "--ServerApp.port_retries=0", *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI runs as root
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    result = Lab(f"http://127.0.0.1:{port}", root, log)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{result.log_tail()}")
            try:
                with urllib.request.urlopen(f"{result.url}/api/status", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n{result.log_tail()}")
            time.sleep(0.5)
        yield result
    finally:
        server.terminate()  # our own process only (its session holds the kernels it started)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium under Playwright. No skip: a browser that cannot start is a failure."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        pytest.fail(f"Playwright is missing ({error}): pip install playwright (do not run `playwright install`)")
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as p:
        try:
            chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        except Exception as error:  # the test must fail, with the browser's own words
            pytest.fail(f"Chromium did not start: {error}")
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    yield page
    try:  # the page as the test left it, pass or fail: what CI keeps as an artifact
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-last.png"), full_page=True, timeout=15_000)
    except Exception as error:  # a crashed page must not hide the test's own failure
        print(f"no final screenshot: {error}; page errors: {problems}")
    finally:
        context.close()


def shot(page, name: str, locator=None) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    (locator or page).screenshot(path=str(path))
    return path


PANEL = ".jp-NotebookPanel:visible"  # the notebook on screen (a restored layout may hold others, hidden)


def open_notebook(page, lab: Lab, path: str) -> None:
    page.goto(f"{lab.url}/lab/tree/{path}?reset")  # ?reset: start from an empty layout, this notebook only
    page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for()
    # the kernel is up when the notebook's status indicator says idle
    page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for()


def run_all(page, timeout_s: float = 120) -> None:
    """Run > Run All Cells. On a loaded machine JupyterLab may ask which kernel to start (take the notebook's own,
    the default) after the page looks ready, and the dialog then takes the menu's click: dismiss it and try again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = time.monotonic() + timeout_s
    while True:
        dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
        if dialog.count():
            dialog.get_by_role("button", name="Select").click()
        try:
            page.get_by_role("menuitem", name="Run", exact=True).click(timeout=10_000)
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click(timeout=10_000)
            return
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise
            page.keyboard.press("Escape")  # a menu left half open


def prompts(page) -> list[str]:
    return page.locator(f"{PANEL} .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()


def wait_all_ran(page, timeout_s: float) -> list[str]:
    """Every code cell shows an execution count ([n]:), none is queued or running ([*]:).

    On a loaded machine a Run All click can land before the notebook takes it: if nothing has started after
    20 s (every prompt still "[ ]:"), the menu command is given once more."""
    start = time.monotonic()
    deadline = start + timeout_s
    retried = False
    while time.monotonic() < deadline:
        texts = prompts(page)
        if texts and all(t.strip().startswith("[") and t.strip()[1:-2].strip().isdigit() for t in texts):
            return texts
        if not retried and time.monotonic() - start > 20 and texts and all(t.strip() == "[ ]:" for t in texts):
            retried = True
            run_all(page)
        time.sleep(0.5)
    raise AssertionError(f"not every cell ran within {timeout_s} s: {prompts(page)}")


def test_chapter_2_runs_and_draws(lab: Lab, page):
    from playwright.sync_api import expect

    open_notebook(page, lab, "course/02_fragmentation.ipynb")
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(lab.root / "course" / "02_fragmentation.ipynb",
                                                                  as_version=4).cells)
    run_all(page)
    ran = wait_all_ran(page, RUN_ALL_S)
    assert len(ran) == code_cells
    shot(page, "chapter2-after-run-all")
    errors = page.locator(f"{PANEL} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, tracebacks[:2]

    # the segment map: a PNG in an output area, decoded by the browser
    picture = page.locator(f"{PANEL} .jp-OutputArea-output img").first
    picture.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=picture.element_handle())
    width = picture.evaluate("img => img.naturalWidth")
    assert width > 100, width
    shot(page, "chapter2-segment-map", picture)

    # the stepper: a live widget (not the static fallback) whose slider moves with the "one step forward" button
    stepper = page.locator(f"{PANEL} .jp-OutputArea-output .widget-vbox", has=page.locator(".widget-slider")).first
    stepper.scroll_into_view_if_needed()
    slider = stepper.locator(".widget-slider")
    assert slider.count() == 1 and slider.locator(".slider, .noUi-target").count() >= 1
    readout = stepper.locator(".widget-readout").first
    before = readout.inner_text()
    stepper.locator("button[title='one step forward']").click()
    expect(readout).to_have_text(str(int(before) + 1))
    stepper_picture = stepper.locator("img").first
    assert stepper_picture.evaluate("img => img.naturalWidth") > 100
    shot(page, "chapter2-stepper", stepper)


def test_a_vietnamese_chapter_speaks_vietnamese(lab: Lab, page):
    """course/vi/02: the stepper's legend is Vietnamese, and a wrong exercise answer typed by a learner gets its
    feedback and hint in Vietnamese (the chapter sets the language once, in its first code cell)."""
    from playwright.sync_api import expect

    from minialloc.learn import TEXT
    from minialloc.viz._common import KIND_TEXT

    path = "course/vi/02_fragmentation.ipynb"
    cells = nbformat.read(lab.root / path, as_version=4).cells
    exercise = next(i for i, c in enumerate(cells) if c.metadata.get("minialloc", {}).get("id") == "c2-releasable")
    open_notebook(page, lab, path)
    run_all(page)
    wait_all_ran(page, RUN_ALL_S)

    stepper = page.locator(f"{PANEL} .jp-OutputArea-output .widget-vbox", has=page.locator(".widget-slider")).first
    stepper.scroll_into_view_if_needed()
    legend = stepper.inner_text()
    assert KIND_TEXT["live"]["vi"] in legend and KIND_TEXT["live"]["en"] not in legend, legend
    shot(page, "vietnamese-stepper", stepper)

    cell = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(exercise)
    cell.scroll_into_view_if_needed()
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.type("releasable = lambda snapshot: 0")  # a wrong answer, as a learner would type it
    page.keyboard.press("Shift+Enter")  # runs it and moves to the check cell
    page.keyboard.press("Shift+Enter")
    feedback = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(exercise + 1).locator(".jp-OutputArea-output")
    not_passed = TEXT["not_passed"]["vi"].split("] ")[1].split(":")[0]  # "chưa đạt"
    hint = TEXT["hint"]["vi"].split(":")[0]  # "gợi ý"
    expect(feedback.first).to_contain_text(not_passed, timeout=60_000)
    text = feedback.first.inner_text()
    assert hint + ":" in text and "not passed" not in text and "hint:" not in text, text
    shot(page, "vietnamese-exercise-feedback", cell)


def quiz_question():
    """A single-choice chapter 2 question from the bank: (id, its right label, a wrong label), by language."""
    from quizzes import load_bank
    from quizzes.i18n import LANGS, pick, to_plain

    question = next(q for q in load_bank().chapter(2) if q.kind == "single")
    right = next(o for o in question.options if o.id == question.answer)
    wrong = next(o for o in question.options if o.id != question.answer)
    return question, {lang: to_plain(pick(right.text, lang)) for lang in LANGS}, {
        lang: to_plain(pick(wrong.text, lang)) for lang in LANGS}


def test_practice_quiz_feedback_and_language(lab: Lab, page):
    from playwright.sync_api import expect

    from quizzes.i18n import LANG_NAMES, pick, to_plain, ui

    question, right, wrong = quiz_question()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import quizzes\n\nquizzes.practice(ids=[{question.id!r}], seed=0)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "course" / "practice_check.ipynb")
    open_notebook(page, lab, "course/practice_check.ipynb")
    run_all(page)
    wait_all_ran(page, 120)
    quiz = page.locator(f"{PANEL} .jp-OutputArea-output .widget-vbox", has=page.locator(".widget-radio-box")).first
    quiz.wait_for()

    def shown(text: str) -> str:  # the question as the page shows it: `code` becomes <code>, without backticks
        return to_plain(text).replace("`", "")

    assert shown(pick(question.text, "en")) in quiz.inner_text()
    feedback = quiz.locator("[role='status']")  # appears with the first check

    def answer(label: str, expected: str, name: str) -> str:
        quiz.locator(".widget-radio-box label", has_text=label).click()
        quiz.locator("button", has_text=ui("check", "en")).click()
        expect(feedback).to_contain_text(expected)  # the widget replaces the element: a locator re-finds it
        shot(page, name, quiz)
        return feedback.inner_text()

    first = answer(wrong["en"], ui("wrong", "en"), "quiz-wrong")
    assert ui("correct", "en") not in first
    second = answer(right["en"], ui("correct", "en"), "quiz-right")
    assert ui("wrong", "en") not in second

    # switch to Vietnamese: question, options, buttons and the feedback of the last check follow
    quiz.locator("button", has_text=LANG_NAMES["vi"]).click()
    expect(feedback).to_contain_text(ui("correct", "vi"))
    text = quiz.inner_text()
    assert shown(pick(question.text, "vi")) in text
    assert right["vi"] in text and ui("check", "vi") in text
    assert shown(pick(question.text, "en")) not in text
    shot(page, "quiz-vietnamese", quiz)


# -- the README's first command ----------------------------------------------------------------------------------
FIRST_COMMAND = ["make", "course"]  # exactly as the README's quick start writes it
TOKEN_URL = re.compile(r"(http://127\.0\.0\.1:(\d+)/lab/tree/course/00_start_here\.ipynb\?token=([0-9a-f]+))")
SERVER_URL = re.compile(r"(http://127\.0\.0\.1:(\d+)/\S*\?token=([0-9a-f]+))")  # any make target's start page


def test_readme_first_command_is_make_course():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first = next(line for line in quick_start.splitlines() if line.startswith("make "))
    assert first.split("#")[0].split() == FIRST_COMMAND


@dataclass
class MadeLab:
    """A JupyterLab that a make target started in a copy of the repository."""
    url: str  # the URL the command prints, with its token
    token: str
    log: Path
    root: Path  # the copy: what the notebooks save lands here

    @property
    def base(self) -> str:
        return self.url.split("/lab/", 1)[0].split("/formgrader", 1)[0]


def serve_make_target(command: list[str], tmp: Path) -> Iterator[MadeLab]:
    """COMMAND (`make TARGET`) in a copy of the repository sharing this checkout's .venv, until the generator is closed.
    The environment only moves the port off 8888 (the Makefile's PORT ?= default reads it)."""
    root = tmp / "repo"
    shutil.copytree(ROOT, root, ignore=COPY_IGNORE)  # copy2: the venv's stamp stays newer than pyproject.toml
    (root / ".venv").symlink_to(ROOT / ".venv")
    # the install layers `make course` would run here (the course's, or the GPU's where a driver answers)
    target = command[-1]
    dry_run = subprocess.run(["make", "-n", target], cwd=root, capture_output=True, text=True, check=True).stdout
    if "touch .venv/bin/.installed-" in dry_run:  # make would install into the shared venv, pointing it at this copy
        pytest.fail(f".venv lacks a layer `make {target}` needs, or is older than pyproject.toml or the Makefile: "
                    "run `make test` (it installs the course's layers first)")
    settings = tmp / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPLBACKEND", "MINIALLOC_DEVICE", "HOST", "JUPYTER_CONFIG_PATH")}
    env.update(PORT=str(free_port()), JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"))
    log = tmp / f"make-{target}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not (match := SERVER_URL.search(log.read_text(errors="replace"))):
            if server.poll() is not None:
                pytest.fail(f"make {target} exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"make {target} printed no URL within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        assert match.group(2) == env["PORT"]
        yield MadeLab(match.group(1), match.group(3), log, root)
    finally:
        # make and the JupyterLab it started: make exits at once, JupyterLab only once its shutdown is done, so
        # wait for the whole process group, not for make alone (a JupyterLab outlived the test so)
        os.killpg(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while group_alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_alive(server):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)


def group_alive(leader: subprocess.Popen) -> bool:
    """Whether a process of the group `leader` heads is still running (the leader itself reaped if it is done)."""
    leader.poll()
    try:
        os.killpg(leader.pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def first_command(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MadeLab]:
    """The README's first command, `make course`: the learner's JupyterLab."""
    yield from serve_make_target(FIRST_COMMAND, tmp_path_factory.mktemp("first-command"))


@pytest.fixture(scope="module")
def instructor_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MadeLab]:
    """`make grade`: the instructor's JupyterLab (the formgrader, nbgrader's notebook tools)."""
    yield from serve_make_target(["make", "grade"], tmp_path_factory.mktemp("make-grade"))


def test_first_command_opens_the_start_page_and_the_formgrader(first_command, page):
    from playwright.sync_api import expect

    url, token, log = first_command.url, first_command.token, first_command.log
    assert TOKEN_URL.fullmatch(url), url  # make course opens the start page
    text = log.read_text(errors="replace")
    assert "[E " not in text and "[C ServerApp] Running as root" not in text, text[-3000:]
    assert ("--allow-root" in text) == (os.geteuid() == 0)  # make echoes the command it runs
    start = nbformat.read(ROOT / "course" / "00_start_here.ipynb", as_version=4)
    title = next(line.lstrip("# ").strip() for c in start.cells if c.cell_type == "markdown"
                 for line in c.source.splitlines() if line.startswith("# "))
    page.goto(url)  # what the learner pastes: the URL with its token
    expect(page.locator(f"{PANEL} .jp-MarkdownOutput h1").first).to_contain_text(title, timeout=60_000)
    shot(page, "first-command-start-page")

    base = url.split("/lab/", 1)[0]
    page.goto(f"{base}/formgrader")  # the instructor's view, on the same server: the course directory is labs/
    labs = sorted(p.name for p in (ROOT / "labs" / "source").iterdir() if p.is_dir())
    for name in labs:
        expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=60_000)  # listed by its API call
    assert "could not be created" not in page.locator("body").inner_text()  # the exchange lives in labs/exchange/
    shot(page, "first-command-formgrader")
    with urllib.request.urlopen(urllib.request.Request(f"{base}/formgrader/api/assignments",
                                                       headers={"Authorization": f"token {token}"})) as reply:
        listed = {a["name"] for a in json.loads(reply.read())}
    assert set(labs) <= listed


# -- the learner's JupyterLab (`make course`) and the instructor's (`make grade`) -----------------------------------
REOPEN_S = 60  # a reopened notebook's widgets settle (saved state, or the static line) within seconds
MODEL_NOT_FOUND = "Error displaying widget: model not found"  # jupyterlab_widgets' renderer, when no model answers
RERUN_LINE = "run this cell again"  # the last line of the quiz and the stepper, for a reopened notebook


def open_with_token(page, made: MadeLab, path: str) -> None:
    page.goto(f"{made.base}/lab/tree/{path}?reset&token={made.token}")
    page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for()
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")  # a loaded machine may still ask: the default
    if dialog.count():
        dialog.get_by_role("button", name="Select").click()
    page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for()


def end_every_session(made: MadeLab) -> None:
    """What quitting JupyterLab does to the learner's kernels: after this, a reopened notebook's widgets can come
    only from what the notebook saved (REST API: DELETE /api/sessions/<id> shuts the session's kernel down)."""
    headers = {"Authorization": f"token {made.token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{made.base}/api/sessions", headers=headers)) as reply:
        sessions = json.loads(reply.read())
    for session in sessions:
        request = urllib.request.Request(f"{made.base}/api/sessions/{session['id']}", method="DELETE", headers=headers)
        with urllib.request.urlopen(request) as reply:
            assert reply.status == 204, reply.status


def saved_widget_state(path: Path) -> dict:
    """The widget state saved in the notebook file; {} until JupyterLab has written a complete file (on a busy
    machine a read can land in the middle of its save, and see an empty or cut file)."""
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):  # nbformat's NotJSONError is a ValueError: the file is still being written
        return {}
    return nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})


def run_cells(page, indices: list[int]) -> None:
    """Run these cells of the open notebook, in order, as a learner does: click, Shift+Enter."""
    for index in indices:
        cell = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index)
        prompt = cell.locator(".jp-InputPrompt").first
        deadline = time.monotonic() + REOPEN_S
        while not re.search(r"\[[\d*]+\]", prompt.inner_text()):  # queued ([*]) or run ([n]): the keys were taken
            assert time.monotonic() < deadline, f"cell {index} was not run: {prompt.inner_text()!r}"
            dialog = page.locator(".jp-Dialog", has_text="Select Kernel")  # a loaded machine may still ask late
            if dialog.count():
                dialog.get_by_role("button", name="Select").click()
            cell.scroll_into_view_if_needed()
            cell.locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            time.sleep(0.5)


def save_end_and_reopen(page, made: MadeLab, path: str) -> None:
    """Save the notebook (with its widget state), end every kernel as quitting JupyterLab does, open it again."""
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + REOPEN_S
    while not saved_widget_state(made.root / path):  # the save carries the widget state (saveState)
        assert time.monotonic() < deadline, f"no widget state saved in {path} within {REOPEN_S} s"
        time.sleep(0.5)
    page.goto("about:blank")
    end_every_session(made)
    open_with_token(page, made, path)


def assert_reopened_widget(page, index: int, widget_part: str, what: str) -> None:
    """The reopened cell's output shows the saved widget (`widget_part` is one of its elements) with its
    "run this cell again" line, and never "model not found", also a moment later."""
    output = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")
    output.scroll_into_view_if_needed()
    deadline = time.monotonic() + REOPEN_S
    while True:
        text = output.inner_text()
        assert MODEL_NOT_FOUND not in text, text
        if output.locator(widget_part).count() and RERUN_LINE in text:
            break
        assert time.monotonic() < deadline, f"the saved {what} did not render within {REOPEN_S} s: {text!r}"
        time.sleep(0.5)
    time.sleep(2)  # the widget manager may still be restoring: what it shows then must hold
    text = output.inner_text()
    shot(page, f"learner-{what}-reopened", output)
    assert MODEL_NOT_FOUND not in text, text
    assert output.locator(widget_part).count() and RERUN_LINE in text, text


def test_the_learners_lab_reopens_a_saved_quiz_and_has_no_validate_button(first_command, page):
    """Chapter 0's practice quiz is run, the notebook saved, every kernel ended and the notebook reopened: its
    output shows the quiz (from the widget state saved with the notebook) with its "run this cell again" line,
    never "model not found". The toolbar has no nbgrader Validate button (course/jupyter-learner turns it off)."""
    path = "course/00_start_here.ipynb"
    cells = nbformat.read(first_command.root / path, as_version=4).cells
    index = next(i for i, c in enumerate(cells) if c.cell_type == "code" and "quizzes.practice(" in c.source)
    open_with_token(page, first_command, path)
    toolbar = page.locator(f"{PANEL} .jp-NotebookPanel-toolbar")
    toolbar.locator(".jp-Toolbar-kernelName").first.wait_for()  # the toolbar is built (nbgrader adds to it then)
    assert toolbar.locator(".validate-button").count() == 0, toolbar.inner_text()
    menus = page.locator(".lm-MenuBar-content").first.inner_text()
    assert "Nbgrader" not in menus, menus  # the instructor's tools are not the learner's
    assert not page.locator(".Toastify__toast", has_text="Jupyter news").count()  # nor JupyterLab's news toast

    run_cells(page, [index])
    cell = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-OutputArea-output .widget-vbox", has=page.locator(".widget-radio-box")).first.wait_for()
    shot(page, "learner-quiz-before-save", cell)
    save_end_and_reopen(page, first_command, path)
    assert_reopened_widget(page, index, ".widget-radio-box", "quiz")


def test_the_learners_lab_reopens_a_saved_stepper(first_command, page):
    """Chapter 2's stepper, run after the chapter's first cell, saved, its kernel ended and reopened: the saved
    view (slider and stats) comes back with its "run this cell again" line, never "model not found"."""
    path = "course/02_fragmentation.ipynb"
    cells = nbformat.read(first_command.root / path, as_version=4).cells
    first = next(i for i, c in enumerate(cells) if c.cell_type == "code")
    index = next(i for i, c in enumerate(cells) if c.cell_type == "code" and "viz.Stepper(" in c.source)
    open_with_token(page, first_command, path)
    run_cells(page, [first, index])
    cell = page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index)
    deadline = time.monotonic() + 2 * REOPEN_S
    while not cell.locator(".jp-OutputArea-output .widget-slider").count():
        # Shift+Enter moved on to the next cell: JupyterLab's windowed notebook may stop drawing this one's output
        # once it scrolls out of view, so bring it back while its kernel works
        assert time.monotonic() < deadline, f"no stepper within {2 * REOPEN_S} s: {cell.inner_text()[-2000:]!r}"
        cell.scroll_into_view_if_needed()
        time.sleep(0.5)
    shot(page, "learner-stepper-before-save", cell)
    save_end_and_reopen(page, first_command, path)
    assert_reopened_widget(page, index, ".widget-slider", "stepper")
    # the saved controls say in words that no kernel answers: no red broken-link icon on top of them
    broken = page.evaluate("() => [...document.querySelectorAll('.jupyter-widgets-disconnected')]"
                           ".filter(e => !['none', 'normal'].includes(getComputedStyle(e, '::before').content)).length")
    assert broken == 0, f"{broken} widgets show ipywidgets' broken-link icon"


def test_the_instructors_lab_keeps_the_validate_button(instructor_lab, page):
    from playwright.sync_api import expect

    open_with_token(page, instructor_lab, "course/00_start_here.ipynb")
    expect(page.locator(f"{PANEL} .jp-NotebookPanel-toolbar .validate-button")).to_be_visible()
    shot(page, "instructor-validate-button")


def test_make_course_adds_allow_root_for_root_only(tmp_path):
    """The other half of the rule, whoever runs the tests: `make -n` with `id -u` answering 0, then 1000."""
    for uid, wanted in (("0", True), ("1000", False)):
        fake = tmp_path / uid
        fake.mkdir()
        (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
        (fake / "id").chmod(0o755)
        env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
        for target in ("course", "grade"):
            dry = subprocess.run(["make", "-n", "-o", ".venv/bin/.installed-course", "-o", ".venv/bin/.installed-gpu",
                                  target], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
            assert ("--allow-root" in dry) == wanted, (uid, target, dry)
            assert "--ServerApp.ip=127.0.0.1" in dry and f"--ServerApp.root_dir=\"{ROOT}\"" in dry
