"""Binder: the environment in binder/ alone runs every chapter, CPU only, within mybinder's 2 GB.

repo2docker uses only the files in binder/ when that folder exists: requirements.txt, then postBuild from the
repository root. This test does the same in a fresh virtual environment (python -m venv, pip install -r
binder/requirements.txt, binder/postBuild with the venv first on PATH and the repository root as its working
directory), checks that neither torch nor CuPy is there, and runs every chapter with nbclient in that venv's own
kernel, in a temporary copy of course/.

The memory cap. mybinder.org limits a user's pod to 2 GB of memory (cgroup accounting: pages actually used) and
restarts the kernel above it. An address-space limit (RLIMIT_AS, prlimit --as) is not that: chapter 6 reserves
about 2.2 GB of address space while using under 0.5 GB, so a 2 GB RLIMIT_AS kills a notebook that Binder runs
happily (and would let through one that maps less but touches more). So the runner enforces the cap the way the
cgroup does: a watchdog reads the resident size (VmRSS) of the runner's descendants every 50 ms and kills any
process above 2 GiB, and the kernel reports its exact peak resident size (VmHWM) when the chapter ends. OpenBLAS
and OpenMP run one thread, as on Binder's one guaranteed core. The test then asserts, per chapter, no error and
a peak under the cap, and for the worst case of a student who opens every chapter without shutting a kernel
down, that all the peaks together plus a Jupyter server still fit in 2 GiB.

The venv is built once and kept in .cache/binder-venv/ (ignored by git through .cache/.gitignore), keyed by
the binder/ files, pyproject.toml and the interpreter; a change to any of them rebuilds it from scratch. A cold
build (pip downloads) takes a minute or two, a warm run about half a minute.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
CACHE = ROOT / ".cache" / "binder-venv"
CHAPTERS = sorted((ROOT / "course").glob("[0-9][0-9]_*.ipynb"))
GiB = 1 << 30
CAP = 2 * GiB  # mybinder.org's memory limit per user
SERVER_ALLOWANCE = 256 << 20  # a Jupyter server's resident size on Binder, generously
BUILD_TIMEOUT_S = 600
CHAPTER_TIMEOUT_S = 300
pytestmark = pytest.mark.slow  # pip install on a cold cache; `pytest -m "not slow"` skips it locally

# Runs inside the binder venv: executes one notebook, under the RSS watchdog, and prints a JSON line.
RUNNER = r'''
import json, os, signal, sys, threading, time
import nbformat
from nbclient import NotebookClient

path, cap = sys.argv[1], int(sys.argv[2])
killed = []

def descendants(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *descendants(kid)]
    return out

def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0

def watchdog():
    while True:
        for pid in descendants(os.getpid()):
            if rss(pid) > cap:
                killed.append((pid, rss(pid)))
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)

threading.Thread(target=watchdog, daemon=True).start()
nb = nbformat.read(path, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell(
    "import importlib.util, json, sys\n"
    "status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)\n"
    "print(json.dumps({'prefix': sys.prefix, 'peak_rss_kib': int(status['VmHWM'].split()[0]),"
    " 'torch': importlib.util.find_spec('torch') is not None,"
    " 'cupy': importlib.util.find_spec('cupy') is not None}))"))
start = time.monotonic()
error = None
try:
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute()
except Exception as e:
    error = f"{type(e).__name__}: {e}"[-3000:]
probe = None
for output in nb.cells[-1].get("outputs", []):  # the probe's JSON line; a kernel may add stderr lines of its own
    if output.get("output_type") == "stream" and output.get("name") == "stdout":
        found = [line for line in output["text"].splitlines() if line.startswith("{")]
        probe = json.loads(found[-1]) if found else probe
if probe is None and error is None:
    error = f"no probe output; the last cell printed {nb.cells[-1].get('outputs', [])!r}"[-3000:]
print(json.dumps({"error": error, "seconds": time.monotonic() - start, "probe": probe, "killed": killed}))
'''


def fingerprint() -> str:
    digest = hashlib.sha256()
    for path in sorted(BINDER.iterdir()) + [ROOT / "pyproject.toml"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"{sys.version}|{sys.platform}|{ROOT}".encode())
    return digest.hexdigest()


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    """The binder venv: reused from .cache/ when its stamp matches, else built from scratch. Held under a lock
    for the module's life, so a second test run (or a worker given these tests too) waits instead of deleting
    the venv under the first one."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / "binder-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield build_venv()


def build_venv() -> Path:
    stamp = CACHE / ".binder-fingerprint"
    python = CACHE / "bin" / "python"
    if stamp.is_file() and stamp.read_text() == fingerprint() and python.is_file():
        return CACHE
    shutil.rmtree(CACHE, ignore_errors=True)
    ignore = CACHE.parent / ".gitignore"  # as .pytest_cache does: git ignores the cache whatever the root says
    if not ignore.is_file():
        ignore.write_text("# made by tests/test_binder.py: a cache, never committed\n*\n")
    base = getattr(sys, "_base_executable", sys.executable)  # not this venv: a fresh one from the interpreter
    run([base, "-m", "venv", str(CACHE)], timeout=120)
    env = {**os.environ, "PATH": os.pathsep.join([str(CACHE / "bin"), os.environ.get("PATH", "")]),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "VIRTUAL_ENV": str(CACHE)}
    env.pop("PYTHONPATH", None)
    run([str(python), "-m", "pip", "install", "-q", "-r", str(BINDER / "requirements.txt")], env=env,
        timeout=BUILD_TIMEOUT_S)
    run(["bash", str(BINDER / "postBuild")], cwd=ROOT, env=env, timeout=BUILD_TIMEOUT_S)  # as repo2docker does
    stamp.write_text(fingerprint())
    return CACHE


def test_binder_files_are_cpu_only():
    requirements = (BINDER / "requirements.txt").read_text().lower()
    names = {line.split("#")[0].split("==")[0].split(">=")[0].strip() for line in requirements.splitlines()}
    assert not {n for n in names if n.startswith(("torch", "cupy", "nvidia-", "jax"))}, names
    assert os.access(BINDER / "postBuild", os.X_OK), "repo2docker runs postBuild only when it is executable"
    post_build = (BINDER / "postBuild").read_text()
    assert "pip install" in post_build and "[gpu" not in post_build and "[torch" not in post_build


@pytest.fixture(scope="module")
def chapters(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("binder")
    shutil.copytree(ROOT / "course", tmp / "course", ignore=shutil.ignore_patterns("*.pickle", "*.html",
                                                                                  ".ipynb_checkpoints"))
    shutil.copytree(ROOT / "course" / "data", tmp / "course" / "data", dirs_exist_ok=True)
    runner = tmp / "runner.py"
    runner.write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPLBACKEND", "MINIALLOC_DEVICE")}
    env.update(PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]), VIRTUAL_ENV=str(venv),
               JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),  # only the venv's own kernel, none of the user's
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    results = {}
    for chapter in CHAPTERS:
        proc = subprocess.run([str(venv / "bin" / "python"), str(runner), str(tmp / "course" / chapter.name),
                               str(CAP)], capture_output=True, text=True, env=env, cwd=tmp / "course",
                              timeout=CHAPTER_TIMEOUT_S)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        results[chapter.name] = json.loads(lines[-1]) if lines else {"error": proc.stderr[-3000:], "probe": None}
    return results


def test_there_are_chapters():
    assert len(CHAPTERS) >= 6, CHAPTERS


@pytest.mark.parametrize("chapter", [c.name for c in CHAPTERS])
def test_chapter_runs_in_binder_env_under_2_gb(chapters: dict[str, dict], venv: Path, chapter: str):
    result = chapters[chapter]
    assert result["error"] is None, result["error"]
    assert not result["killed"], f"over {CAP >> 20} MiB resident: {result['killed']}"
    probe = result["probe"]
    assert Path(probe["prefix"]).resolve() == venv.resolve(), "the chapter ran in another environment's kernel"
    assert not probe["torch"] and not probe["cupy"]
    assert probe["peak_rss_kib"] * 1024 < CAP - SERVER_ALLOWANCE, f"{probe['peak_rss_kib'] >> 10} MiB peak"


def test_all_chapters_open_at_once_fit(chapters: dict[str, dict]):
    """A student who opens every chapter and never shuts a kernel down holds all of them at their peak."""
    peaks = {name: r["probe"]["peak_rss_kib"] * 1024 for name, r in chapters.items() if r.get("probe")}
    assert len(peaks) == len(CHAPTERS)
    assert sum(peaks.values()) + SERVER_ALLOWANCE < CAP, {k: v >> 20 for k, v in peaks.items()}
