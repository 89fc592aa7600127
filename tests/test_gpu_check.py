"""tools/gpu_check.sh --dry-run must run the CPU-side checks anywhere and exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from minialloc.cuda_device import cuda_unavailable_reason

ROOT = Path(__file__).resolve().parent.parent


def test_dry_run_prints_one_table_and_passes():
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    rows = {line.split("  ")[0].strip(): line for line in lines}
    for kernel in ("fill_pattern", "guard_check", "block_copy", "copy_blocks"):
        assert "PASS" in rows[f"kernel {kernel}: CPU emulation vs NumPy"]
    assert any(line.startswith("scenario on SimulatedGPU") and "PASS" in line and "expandable_segments: fits"
               in line for line in lines)
    skipped = "skipped: no GPU" if cuda_unavailable_reason() else "skipped: dry run"
    for row in ("kernels: GPU vs NumPy", "PyTorch native vs minialloc prediction",
                "minialloc on CudaGPU (cudaMalloc and cuMemMap)"):
        assert skipped in rows[row]
    for row in ("kernel paged_attention: CPU emulation vs NumPy", "paged_attention vs dense attention: CPU emulation",
                "kernel dense_attention: CPU emulation vs NumPy"):
        assert "PASS" in rows[row]
    for row in ("paged_attention: GPU vs NumPy and dense attention",
                "paged_attention bandwidth vs device-to-device copy", "paged_attention time vs dense attention"):
        assert skipped in rows[row]
    assert "cost: minialloc on SimulatedGPU" in rows
    assert " 0 failed" in lines[-1]
    assert "FAIL" not in proc.stdout


def _fake_missing(tmp_path: Path, *names: str) -> dict[str, str]:
    """An environment whose Python cannot import `names`: a package of that name that raises ImportError, first on
    the path (as on a GPU machine without that package)."""
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError({f'No module named {name!r}'!r})\n")
    return dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(tmp_path))


def test_without_torch_and_cupy_it_says_so_in_one_line_and_still_prints_the_table(tmp_path):
    env = _fake_missing(tmp_path, "torch", "cupy")
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    first = proc.stdout.splitlines()[0]
    assert first.startswith("found: Python ") and "torch missing" in first and "CuPy missing" in first
    assert "note: CuPy is not installed" in out and "note: torch cannot be imported" in out
    assert "scenario on SimulatedGPU" in out and " 0 failed" in out


def test_without_minialloc_needs_it_stops_with_one_line(tmp_path):
    env = _fake_missing(tmp_path, "sortedcontainers")
    proc = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1
    assert "lacks sortedcontainers" in out and "pip install sortedcontainers" in out


def test_the_versions_line_names_nvrtc(tmp_path):
    """Here CuPy is installed without the toolkit's libraries: the check names NVRTC's state and what to install."""
    from minialloc.cuda_toolkit import cuda_libraries, toolkit_problem

    found = cuda_libraries()
    assert {"CuPy", "CUDA runtime", "NVRTC", "cuRAND"} <= set(found)
    problem = toolkit_problem(found)
    if found["NVRTC"].startswith("missing"):
        assert problem is not None and "NVRTC" in problem and "minialloc[cuda" in problem
    else:
        assert found["NVRTC"][0].isdigit()
    fake = dict(found, NVRTC="missing: libnvrtc.so.13 or libnvrtc.so.12 not found", cuRAND="10.3")
    assert toolkit_problem(fake).startswith(f"CuPy {found['CuPy']} cannot load NVRTC (")
    assert toolkit_problem(dict(fake, NVRTC="12.9")) is None
