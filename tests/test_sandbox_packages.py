"""The sandbox binds the copy of each package that the student kernel imports, not the one the grader finds.

The grader may run from a folder holding a copy of the project (its current folder on its sys.path) while the
environment's editable install points at another checkout; the kernel runs in the submission's folder and imports
the install's. Binding the grader's copy left the kernel with nothing to import: every lab scored 0 with
ModuleNotFoundError. These tests build that case with a copy of the packages in a temporary folder and run the real
sandbox (bwrap must be installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.sandbox import Policy, SandboxKernelManager, package_dirs

ROOT = Path(__file__).resolve().parent.parent
AS_ROOT = os.geteuid() == 0
WHERE_MINIALLOC = "import minialloc; print(minialloc.__path__[0])"


def open_to_all(tree: Path) -> None:
    """Readable by the sandbox's own user id (when the grader is root it has only the "other" bits)."""
    for folder, _dirs, names in os.walk(tree):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)


def copy_of_the_project(into: Path, packages: tuple[str, ...] = ("minialloc",)) -> Path:
    """A second checkout: the named packages copied, without bytecode."""
    into.mkdir(parents=True, exist_ok=True)
    for name in packages:
        shutil.copytree(ROOT / name, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    open_to_all(into)
    return into


def run_in_sandbox(code: str, policy: Policy, workdir: Path, env: dict[str, str] | None = None):
    uid = 200_321 if AS_ROOT else -1
    workdir.mkdir(exist_ok=True)
    if AS_ROOT:
        os.chown(workdir, uid, uid)
    cmd = policy.command([sys.executable, "-c", code], workdir=workdir, rw=[workdir], env=env, uid=uid)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_grader_run_from_a_copy_binds_the_installed_package_the_kernel_imports(tmp_path: Path):
    copy = copy_of_the_project(tmp_path / "copy", ("minialloc", "quizzes", "grading"))
    grader = ("import json, minialloc, grading.sandbox as s\n"
              "print(json.dumps({'grader': minialloc.__path__[0], 'sandbox': s.__file__,\n"
              "                  'bound': [str(p) for p in s.Policy.default().read_only]}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", grader], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # the case of the issue: the grader's process imports the copy, its sandbox module included
    assert Path(seen["grader"]) == copy / "minialloc"
    assert Path(seen["sandbox"]).is_relative_to(copy)
    bound = [Path(p) for p in seen["bound"]]
    assert not any(p.is_relative_to(copy) for p in bound), bound
    installed = ROOT / "minialloc"  # where the environment's editable install points
    assert any(installed.is_relative_to(p) for p in bound), bound
    # and the kernel, run by that policy, imports the bound package
    done = run_in_sandbox(WHERE_MINIALLOC, Policy(tuple(bound)), tmp_path / "work")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == installed
    # binding what the grader found instead is the failure the issue reports
    wrong = Policy(tuple(p for p in bound if not installed.is_relative_to(p)) + (copy / "minialloc",))
    done = run_in_sandbox(WHERE_MINIALLOC, wrong, tmp_path / "work")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


def test_pythonpath_to_a_copy_binds_that_copy_and_the_kernel_imports_it(tmp_path: Path):
    copy = copy_of_the_project(tmp_path / "copy")
    kernel_env = {"PYTHONPATH": str(copy)}
    assert package_dirs(["minialloc"], kernel_env) == [copy / "minialloc"]
    assert package_dirs(["minialloc"], {}) == [ROOT / "minialloc"]
    policy = SandboxKernelManager().policy(kernel_env)  # what the manager binds for a kernel with that variable
    assert any((copy / "minialloc").is_relative_to(p) for p in policy.read_only), policy.read_only
    assert not any((ROOT / "minialloc").is_relative_to(p) for p in policy.read_only), policy.read_only
    done = run_in_sandbox(WHERE_MINIALLOC, policy, tmp_path / "work", env=kernel_env)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == copy / "minialloc"


def test_a_package_only_the_grader_can_import_is_refused_in_one_line(tmp_path: Path, monkeypatch):
    grader_only = tmp_path / "grader-only"
    (grader_only / "graderonlypkg").mkdir(parents=True)
    (grader_only / "graderonlypkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(grader_only))  # on the grader's sys.path, not on the kernel's
    with pytest.raises(ModuleNotFoundError) as refused:
        Policy.default(packages=("minialloc", "graderonlypkg"))
    line = str(refused.value)
    assert "\n" not in line
    assert f"the student kernel ({sys.executable}, PYTHONPATH=" in line
    assert "cannot import 'graderonlypkg'" in line
    assert f"which the grader imports from {grader_only / 'graderonlypkg'}" in line
    assert "pip install -e ." in line
    with pytest.raises(ModuleNotFoundError, match="'nosuchpackage', which the grader cannot import either"):
        package_dirs(["nosuchpackage"])


def test_resolving_runs_no_package_code_and_no_file_of_the_grader_folder(tmp_path: Path, monkeypatch):
    marker = tmp_path / "ran"
    noisy = tmp_path / "path" / "noisy"
    (noisy / "sub").mkdir(parents=True)
    (noisy / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('noisy')\n")
    (noisy / "sub" / "__init__.py").write_text("")
    # a folder the grader runs in that holds modules named like the resolver's own imports (a submission's folder)
    here = tmp_path / "here"
    here.mkdir()
    for name in ("json", "importlib", "encodings"):
        (here / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write({name!r})\n")
    monkeypatch.chdir(here)
    assert package_dirs(["noisy.sub"], {"PYTHONPATH": str(tmp_path / "path")}) == [noisy / "sub"]
    assert package_dirs(["quizzes.graded"], {}) == [ROOT / "quizzes" / "graded"]
    assert not marker.exists(), marker.read_text()
