"""The grader's files stay the grader's (grading/privacy.py), the exchange is set once, and no folder shadows
minialloc: what a class machine needs, checked without a hub (tests/test_jupyterhub.py runs the hub).

- `exposed` finds the path another account can read, walking from / as the kernel does, and a grading command
  run on an exposed course directory refuses with the one command that fixes it;
- the grader's scratch root is 0700 and a foreign one is refused;
- a site's Exchange.root holds for the labs and the graded quiz alike, both with the course id (no Python name);
- a Python started in a folder holding `minialloc/` (a clone, a fetched course) imports the package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grading import privacy

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def open_folder():
    """A folder every account can enter and read (mkdtemp in the shared temporary directory, then 0755)."""
    folder = Path(tempfile.mkdtemp(prefix="minialloc-open-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_exposed_walks_from_the_root(open_folder: Path):
    course = open_folder / "labs"
    course.mkdir(mode=0o755)
    gradebook = course / "gradebook.db"
    gradebook.write_text("", encoding="utf-8")
    os.chmod(gradebook, 0o644)
    assert privacy.exposed(course) == course and privacy.exposed(gradebook) == gradebook
    os.chmod(course, 0o711)  # others may enter, not list: a known name (gradebook.db, source/) is still read
    assert privacy.exposed(course) == course and privacy.exposed(gradebook) == gradebook
    os.chmod(course, 0o700)
    assert privacy.exposed(course) is None and privacy.exposed(gradebook) is None
    os.chmod(course, 0o755)
    os.chmod(open_folder, 0o700)  # a private folder on the way protects everything in it
    assert privacy.exposed(gradebook) is None
    assert privacy.exposed(open_folder / "missing") is None
    os.chmod(open_folder, 0o755)
    os.chmod(course, 0o755)
    with pytest.raises(privacy.NotPrivate, match=f"the course directory .*chmod go-rwx {course}"):
        privacy.check([("the course directory", course)])


def test_a_grading_command_on_a_readable_course_refuses_with_the_fix(open_folder: Path):
    course = open_folder / "course"
    (course / "source" / "a1").mkdir(parents=True)
    os.chmod(course, 0o755)
    nbformat = pytest.importorskip("nbformat")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]),
                   course / "source" / "a1" / "a1.ipynb")
    (course / "nbgrader_config.py").write_text(
        f"load_subconfig({str(ROOT / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"get_config().CourseDirectory.root = {str(course)!r}  # noqa: F821\n", encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "a1"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=240)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert f"other accounts on this machine can read the course directory ({course}): run `chmod go-rwx {course}`" \
        in said, said[-3000:]
    assert not (course / "release").exists()
    os.chmod(course, 0o700)  # the fix it names
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "a1"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (os.stat(course / "gradebook.db").st_mode & 0o077) == 0  # written under the private umask


def test_scratch_root_is_private_and_a_foreign_one_refused(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = Path(privacy.scratch_root())
    assert root.parent == tmp_path and (os.stat(root).st_mode & 0o777) == 0o700
    os.chmod(root, 0o755)
    assert privacy.scratch_root() == str(root) and (os.stat(root).st_mode & 0o777) == 0o700
    root.rmdir()
    root.symlink_to(tmp_path)  # a student's link in a shared /tmp, made before the grader's first run
    with pytest.raises(privacy.NotPrivate, match="not a folder of this account's"):
        privacy.scratch_root()


def test_private_umask_is_restored():
    before = os.umask(0o022)
    try:
        with privacy.private_umask():
            assert os.umask(0o077) == 0o077
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)


def _nbgrader_settings(cwd: Path, site: Path) -> dict:
    """Exchange.root and course id as nbgrader resolves them in `cwd`, with `site` on JUPYTER_CONFIG_PATH."""
    probe = ("import json; from nbgrader.apps.nbgraderapp import NbGraderApp; app = NbGraderApp(); "
             "app.load_config_file(); print(json.dumps({'root': app.config.Exchange.root, "
             "'course': app.config.CourseDirectory.course_id}))")
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(site)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_sites_exchange_holds_for_the_labs_and_the_graded_quiz(tmp_path: Path, monkeypatch):
    """The hub's site configuration (deploy/hub/site/) names the exchange; nbgrader run from the repository root
    (the labs) and from quizzes/graded/ (the quiz), each reading its nbgrader_config.py last, keeps it."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(ROOT / "deploy" / "hub" / "site" / "nbgrader_config.py", site)
    monkeypatch.setenv("MINIALLOC_EXCHANGE", str(tmp_path / "exchange"))
    labs = _nbgrader_settings(ROOT, site)
    quiz = _nbgrader_settings(ROOT / "quizzes" / "graded", site)
    assert labs == quiz == {"root": str(tmp_path / "exchange"), "course": "minialloc-course"}
    hub_class = json.loads((ROOT / "deploy" / "hub" / "class.json").read_text(encoding="utf-8"))
    assert hub_class["course_id"] == labs["course"]
    assert not labs["course"].isidentifier()  # a folder named after it can never be imported


def test_a_folder_named_minialloc_does_not_shadow_the_package(tmp_path: Path):
    """A clone at ~/minialloc or a fetched ~/minialloc-course, and a Python started in the home."""
    (tmp_path / "minialloc" / "minialloc").mkdir(parents=True)  # a clone's root: no __init__.py of its own
    (tmp_path / "minialloc-course" / "lab1_best_fit").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", "import minialloc; print(minialloc.__file__); "
                           "print(minialloc.CachingAllocator.__name__)"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    file, name = done.stdout.split()
    assert Path(file).name == "__init__.py" and not Path(file).is_relative_to(tmp_path) and name == "CachingAllocator"
