"""The Makefile's install layers and system packages, with make itself and fake tools on PATH (no pip, no apt-get).

- `make course` installs the course's own stack only where no NVIDIA driver answers (nvidia-smi absent or failing),
  and CUDA torch with CuPy's toolkit wheels where one does, for the driver's CUDA major.
- A venv made by `make course` is completed by `make test` (its layer only), never built again.
- TORCH_SPEC reaches pip as written, so it can carry `--index-url` for PyTorch's CPU wheels.
- `make course` says in one line how to add PyTorch when the venv has none, and nothing when it has it.
- `make test`'s system packages (Chromium, bubblewrap, Node.js with npm for the certificate verifiers,
  python3-venv where ensurepip is missing, PostgreSQL's server): installed with one
  `apt-get update` as root, one line with the command otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")
CPU_TORCH = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"


def tool(folder: Path, name: str, script: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\n{script}\n")
    (folder / name).chmod(0o755)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The Makefile, pyproject.toml and the npm manifests (the certificate verifiers' and the hub's proxy, which
    `make test` installs from) alone, older than any stamp a test writes."""
    for name in ("Makefile", "pyproject.toml", "tests/interop/package.json", "tests/interop/package-lock.json",
                 "deploy/hub/package.json", "deploy/hub/package-lock.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))
    return tmp_path


# the editable install's mode (Makefile: EDITABLE), after each -e requirement
COMPAT = " --config-settings editable_mode=compat"

def make(project: Path, *args: str, driver: str | None = None, path: str | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    """`make ARGS` in project, with a fake nvidia-smi that reports CUDA major `driver`, or fails (no driver)."""
    fake = project / "fake-bin"
    answer = f'echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: {driver}.0 |"' if driver \
        else 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2; exit 9'
    tool(fake, "nvidia-smi", answer)
    # the variables a `make test` run passes to its children (MAKELEVEL adds "Entering directory" lines) are left out
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_MAJOR", "TORCH_SPEC", "VENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    env["PATH"] = f"{fake}{os.pathsep}{path if path is not None else env['PATH']}"
    return subprocess.run([MAKE, *args], cwd=project, env=env, capture_output=True, text=True, check=check)


def pip_lines(dry_run: str) -> list[str]:
    """The pip commands a dry run would run (the hint `make course` prints only quotes one)."""
    return [line for line in dry_run.splitlines() if line.startswith(".venv/bin/python -m pip install")]


def test_without_a_driver_the_course_installs_no_torch_and_no_cupy(project: Path):
    dry = make(project, "-n", "course").stdout
    assert pip_lines(dry) == ['.venv/bin/python -m pip install -q --upgrade pip',
                              '.venv/bin/python -m pip install -q -e ".[course]"' + COMPAT], dry
    assert "touch .venv/bin/.installed-course" in dry and ".installed-gpu" not in dry


@pytest.mark.parametrize(("driver", "extra"), [("12", "cuda12"), ("13", "cuda13")])
def test_with_a_driver_the_course_installs_cuda_torch_and_cupy_with_the_toolkit(project: Path, driver: str,
                                                                                  extra: str):
    installs = pip_lines(make(project, "-n", "course", driver=driver).stdout)
    assert installs[-2:] == [".venv/bin/python -m pip install -q torch==2.13.0",
                             f'.venv/bin/python -m pip install -q -e ".[course,torch,{extra}]"' + COMPAT], installs


def test_a_course_venv_is_completed_for_the_tests_not_rebuilt(project: Path):
    stamps = project / ".venv" / "bin"
    stamps.mkdir(parents=True)
    (stamps / ".installed-course").touch()  # what `make course` left, newer than the Makefile and pyproject.toml
    dry = make(project, "-n", "-o", "system-packages", "test", f"TORCH_SPEC={CPU_TORCH}").stdout
    assert pip_lines(dry) == [f".venv/bin/python -m pip install -q {CPU_TORCH}",
                              '.venv/bin/python -m pip install -q -e ".[course,torch,gpu,dev]"' + COMPAT], dry
    assert "-m venv .venv\n" not in dry and "touch .venv/bin/.installed-course" not in dry  # (.venv-hub is the hub's)
    assert "touch .venv/bin/.installed-test" in dry and "pytest" in dry


def test_a_fresh_clone_builds_the_course_layer_before_the_test_layer(project: Path):
    installs = pip_lines(make(project, "-n", "-o", "system-packages", "test").stdout)
    assert installs[1] == '.venv/bin/python -m pip install -q -e ".[course]"' + COMPAT, installs
    assert installs[-1] == '.venv/bin/python -m pip install -q -e ".[course,torch,gpu,dev]"' + COMPAT, installs


HUB = ".venv-hub/bin/.installed-hub"  # the class hub's venv and proxy, which `make test` also builds


def test_the_certificate_verifiers_are_installed_from_the_lock_file_and_only_once(project: Path):
    """npm ci (the lock file's exact versions, no install scripts) before the tests; a stamp keeps it to once."""
    for target in ("test", "check"):
        dry = make(project, "-n", "-o", "system-packages", "-o", ".venv/bin/.installed-test", "-o", HUB, target).stdout
        assert "cd tests/interop && npm ci --ignore-scripts --no-audit --no-fund" in dry, dry
    (project / "tests/interop/node_modules").mkdir()
    (project / "tests/interop/node_modules/.installed").touch()
    dry = make(project, "-n", "-o", "system-packages", "-o", ".venv/bin/.installed-test", "-o", HUB, "test").stdout
    assert "npm ci" not in dry and "pytest" in dry


@pytest.mark.parametrize("has_torch", [False, True])
def test_make_course_says_in_one_line_how_to_add_torch_when_it_is_missing(project: Path, has_torch: bool):
    venv_bin = project / ".venv" / "bin"
    tool(venv_bin, "python", "exit 0" if has_torch else 'echo "No module named torch" >&2; exit 1')
    tool(venv_bin, "jupyter", 'echo "jupyter $*"')  # the server, replaced: it prints its arguments and returns
    (venv_bin / ".installed-course").touch()
    out = make(project, "course").stdout
    hints = [line for line in out.splitlines() if "PyTorch is not installed" in line]
    if has_torch:
        assert hints == [], out
    else:
        assert len(hints) == 1 and hints[0].endswith(f"to add it: .venv/bin/python -m pip install {CPU_TORCH}"), out
    assert "jupyter lab" in out and "course/00_start_here.ipynb" in out


# PostgreSQL's server where the Makefile looks for it: absent, whatever this machine has
NO_POSTGRES = "POSTGRES_INITDB=/nonexistent/postgresql/*/bin/initdb"


@pytest.fixture
def bare_path(tmp_path: Path) -> Path:
    """A PATH folder with a fake `apt-get` that logs its arguments and a python3 that has ensurepip (a test adds
    `id`); no chromium, no bwrap."""
    folder = tmp_path / "bare-bin"
    tool(folder, "apt-get", f'echo "$*" >> {tmp_path / "apt.log"}')
    tool(folder, "python3", "exit 0")
    return folder


@pytest.mark.parametrize("uid", ["0", "1000"])
def test_system_packages_installed_as_root_else_one_line_says_how(project: Path, bare_path: Path, uid: str):
    tool(bare_path, "id", f"echo {uid}")
    done = make(project, "system-packages", "CUDA_MAJOR=", NO_POSTGRES, path=str(bare_path), check=False)
    log = bare_path.parent / "apt.log"
    if uid == "0":
        assert done.returncode == 0, done.stderr
        assert log.read_text().splitlines() == ["update -q",
                                                "install -y -q chromium bubblewrap nodejs npm postgresql"]
    else:
        assert done.returncode != 0 and not log.exists()
        assert done.stdout.splitlines() == ["the tests need Debian's chromium bubblewrap nodejs npm postgresql: run  "
                                            "sudo make system-packages  (apt-get installs them), then make test again"]


def test_a_python_without_ensurepip_asks_for_python3_venv(project: Path, bare_path: Path):
    tool(bare_path, "id", "echo 0")
    tool(bare_path, "chromium", "exit 0")
    tool(bare_path, "python3", 'echo "No module named ensurepip" >&2; exit 1')  # Debian's python3 without its venv
    tool(bare_path, "initdb", "exit 0")
    make(project, "system-packages", "CUDA_MAJOR=", f"POSTGRES_INITDB={bare_path / 'initdb'}", path=str(bare_path))
    assert (bare_path.parent / "apt.log").read_text().splitlines() == [
        "update -q", "install -y -q bubblewrap nodejs npm python3-venv"]


def test_system_packages_present_means_nothing_to_do(project: Path, bare_path: Path):
    tool(bare_path, "id", "echo 0")
    tool(bare_path, "chromium", "exit 0")
    tool(bare_path, "bwrap", "exit 0")
    tool(bare_path, "npm", "exit 0")
    server = bare_path.parent / "postgresql"  # Debian's layout: <major>/bin/initdb
    tool(server / "15" / "bin", "initdb", "exit 0")
    done = make(project, "system-packages", "CUDA_MAJOR=", f"POSTGRES_INITDB={server}/*/bin/initdb",
                path=str(bare_path))
    assert done.stdout == "" and not (bare_path.parent / "apt.log").exists()


def test_ci_runs_make_test_and_nothing_else():
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands[:2] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."'] and commands[-1] == "exec make test"
    assert [c for c in commands if "make" in c.split()] == ["make test", "exec make test"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the second clone is made only as root, for the hub's Unix users")
def test_ci_in_a_folder_other_accounts_cannot_enter_tests_a_clone_they_can(tmp_path: Path):
    """The class test runs students' servers from the repository's venv, as other accounts: a clone under a 0700
    folder is cloned again into one they can enter, and `make test` runs there (a stand-in make says where)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)
    clone = private / "minialloc"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{ROOT}", str(clone)], check=True)
    shutil.copy(ROOT / ".ci" / "run", clone / ".ci" / "run")  # the working tree's, committed or not
    fake = tmp_path / "bin"
    tool(fake, "make", f'echo "$PWD $*" > {tmp_path / "make.log"}; stat -c %a "$PWD/.." >> {tmp_path / "make.log"}')
    path = f"{fake}:{os.environ['PATH']}"
    done = subprocess.run(["bash", str(clone / ".ci" / "run")], env={**os.environ, "PATH": path},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    where, args = (tmp_path / "make.log").read_text().splitlines()[0].split(" ", 1)
    assert args == "test" and not where.startswith(str(private)) and Path(where).name == "minialloc", where
    assert (tmp_path / "make.log").read_text().splitlines()[1] == "755"
    assert not Path(where).exists()  # the second clone is removed when the run ends


def test_make_check_does_not_import_the_files_its_markers_leave_out():
    """conftest's pytest_ignore_collect: under `make check`'s -m expression a file whose markers it excludes is not
    collected at all; a file it keeps, or any other expression, collects as pytest always does."""
    from conftest import MARKED_FILES, pytest_ignore_collect

    (line,) = [li for li in (ROOT / "Makefile").read_text().splitlines() if li.startswith("CHECK_MARKERS :=")]
    check = line.split(":=", 1)[1].strip()

    class Config:
        def __init__(self, markexpr: str) -> None:
            self.markexpr = markexpr

        def getoption(self, name: str, default: object = None) -> object:
            assert name == "markexpr"
            return self.markexpr

    tests = ROOT / "tests"
    for name in MARKED_FILES["nbgrader"] | MARKED_FILES["notebooks"] | MARKED_FILES["slow"]:
        assert pytest_ignore_collect(tests / name, Config(check)) is True, name
    for name in ("test_allocator_rules.py", "test_cuda_device.py"):  # unmarked; gpu, which check keeps
        assert pytest_ignore_collect(tests / name, Config(check)) is None, name
    for other in ("", "slow", "not nbgrader or gpu", "not (nbgrader or slow)"):
        assert pytest_ignore_collect(tests / "test_labs.py", Config(other)) is None, other
