"""minialloc's GPU data path: small CUDA kernels, their NumPy twins, and two ways to run them.

The kernels (the .cu files beside this one):
- fill_pattern: write a 4-byte pattern over a byte range (poison freed memory with 0xDB, zero new memory);
- guard_check: the first byte of a range that differs from the pattern, found with atomicMin (-1 if none);
- block_copy: copy bytes between non-overlapping ranges (move_plan splits overlapping moves);
- copy_blocks: copy whole blocks of a paged KV cache, one CUDA block per (src, dst) pair (copy_waves runs the
  block manager's ordered copy lists, chains included, as a few such launches);
- paged_attention: decode attention reading K and V through block tables (PagedAttention), and dense_attention,
  the same code over contiguous K and V, the baseline its cost is measured against. Both use warp shuffles and
  __syncthreads, so the emulation runs them cooperatively (one fiber per thread).

Running them:
- reference.py: the NumPy twins, the definition of what each kernel must do;
- emulation.py: the kernels compiled by the host C++ compiler with cuda_emulation.h, run on the CPU;
- gpu.py: the kernels compiled by CuPy (NVRTC) on first use, run on a real GPU.
Both runners share launch.py, which checks arguments and picks launch shapes; check.py compares a runner with
the twins on poisoned random inputs.

KERNELS lists every kernel with its parameters in order, as the runners pass them; a test reads the .cu files
and checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
EMULATION_HEADER = KERNEL_DIR / "cuda_emulation.h"


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: its extern "C" name, its source file, and its parameters as (name, kind).

    kind is "ptr" (a device pointer), "u64" (unsigned long long), "u32" (unsigned int) or "f32" (float).
    cooperative: the kernel synchronizes its threads (__syncthreads, warp shuffles), so the CPU emulation must
    run each block's threads as fibers that can wait for each other (cuda_emulation.h).
    """

    name: str
    source: str
    params: tuple[tuple[str, str], ...]
    cooperative: bool = False

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.source


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        KernelSpec("fill_pattern", "fill.cu",
                   (("buf", "ptr"), ("offset", "u64"), ("nbytes", "u64"), ("pattern", "u32"))),
        KernelSpec("guard_check", "guard_check.cu",
                   (("buf", "ptr"), ("offset", "u64"), ("nbytes", "u64"), ("pattern", "u32"),
                    ("first_bad", "ptr"))),
        KernelSpec("block_copy", "block_copy.cu",
                   (("dst", "ptr"), ("dst_offset", "u64"), ("src", "ptr"), ("src_offset", "u64"),
                    ("nbytes", "u64"))),
        KernelSpec("copy_blocks", "copy_blocks.cu",
                   (("cache", "ptr"), ("pairs", "ptr"), ("num_pairs", "u64"), ("block_words", "u64"))),
        KernelSpec("paged_attention", "paged_attention.cu",
                   (("out", "ptr"), ("q", "ptr"), ("kv_cache", "ptr"), ("block_tables", "ptr"),
                    ("context_lens", "ptr"), ("num_seqs", "u64"), ("num_heads", "u32"), ("num_kv_heads", "u32"),
                    ("head_dim", "u32"), ("block_size", "u32"), ("max_blocks", "u64"), ("scale", "f32")),
                   cooperative=True),
        KernelSpec("dense_attention", "paged_attention.cu",
                   (("out", "ptr"), ("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("context_lens", "ptr"),
                    ("num_seqs", "u64"), ("num_heads", "u32"), ("num_kv_heads", "u32"), ("head_dim", "u32"),
                    ("max_len", "u64"), ("scale", "f32")),
                   cooperative=True),
    )
}

__all__ = ["EMULATION_HEADER", "KERNELS", "KERNEL_DIR", "KernelSpec"]
