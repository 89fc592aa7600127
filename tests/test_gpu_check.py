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
