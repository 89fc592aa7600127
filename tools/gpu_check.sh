#!/usr/bin/env bash
# minialloc's GPU check: one run (a few minutes at most), one table. Meant for a GPU machine with CUDA, PyTorch
# and CuPy installed; builds nothing itself and installs nothing.
#
#   tools/gpu_check.sh            every row; needs a CUDA GPU
#   tools/gpu_check.sh --dry-run  the CPU-side rows only (kernel emulation, the simulator's prediction); any machine
#
# Uses $PYTHON when set, else python3. The exit status is non-zero when a row fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" "$here/gpu_check.py" "$@"
