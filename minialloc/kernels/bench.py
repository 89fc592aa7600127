"""The paged-attention benchmark: paged_attention against the same kernel over contiguous K/V, and a copy.

It measures on whatever runner it is given (CupyKernels on a GPU, EmulatedKernels on the CPU for its own tests),
with the caller's timer, so the same code times CUDA events on a GPU and the wall clock elsewhere. What counts as
good enough (a share of copy bandwidth, an overhead limit) is the caller's to say: this module only measures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .reference import relative_error


class AttentionBench(NamedTuple):
    """One benchmark's shape and timings; bandwidth, share of copy bandwidth and overhead derive from them."""

    num_seqs: int
    num_heads: int
    head_dim: int
    block_size: int
    lens: tuple[int, int]  # shortest and longest context
    kv_bytes: int  # bytes the paged kernel must move: K and V of every context, q, out, tables
    paged_s: float
    dense_s: float
    copy_bytes_per_s: float  # read + written per second by a device-to-device copy
    agreement: float  # relative error between the paged and the dense kernel's outputs

    @property
    def bandwidth(self) -> float:
        return self.kv_bytes / self.paged_s

    @property
    def share(self) -> float:
        return self.bandwidth / self.copy_bytes_per_s

    @property
    def overhead(self) -> float:
        return self.paged_s / self.dense_s - 1


def _normal(xp: Any, seed: int, shape: tuple[int, ...]) -> Any:
    if xp is np:
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return xp.random.RandomState(seed).standard_normal(shape, dtype=xp.float32)


def attention_workload(xp: Any, num_seqs: int, num_heads: int, head_dim: int, block_size: int,
                       len_range: tuple[int, int], seed: int = 0) -> dict[str, Any]:
    """Decode batch for the benchmark: context lengths uniform in len_range, every sequence's blocks scattered
    over the cache (a random permutation, as after a while of serving), and the same K and V gathered into
    contiguous [num_seqs, max_len, heads, head_dim] arrays for the dense kernel. Multi-head (kv heads = heads),
    so every byte of K and V is read exactly once."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(len_range[0], len_range[1] + 1, num_seqs)
    nblocks = -(-lens // block_size)
    order = rng.permutation(int(nblocks.sum()))
    tables = np.zeros((num_seqs, int(nblocks.max())), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(nblocks)])
    for s in range(num_seqs):
        tables[s, : nblocks[s]] = order[starts[s] : starts[s + 1]]
    kv = _normal(xp, seed, (int(nblocks.sum()), 2, block_size, num_heads, head_dim))
    q = _normal(xp, seed + 1, (num_seqs, num_heads, head_dim))
    pos = np.arange(int(lens.max()))
    blocks = np.take_along_axis(tables, np.minimum(pos // block_size, nblocks[:, None] - 1), axis=1)
    offsets = np.broadcast_to(pos % block_size, blocks.shape)
    where = (xp.asarray(blocks), xp.asarray(np.ascontiguousarray(offsets)))
    k, v = kv[:, 0][where], kv[:, 1][where]  # position p of sequence s: its slot through the table
    kv_bytes = 4 * (2 * int(lens.sum()) * num_heads * head_dim + 2 * q.size + tables.size + num_seqs)
    return {"q": q, "kv": kv, "tables": tables, "lens": lens, "k": k, "v": v, "kv_bytes": kv_bytes}


def attention_benchmark(kernels: Any, seconds: Callable[[Callable[[], Any]], float],
                        device_copy: Callable[[Any, Any], Any], num_seqs: int = 256, num_heads: int = 32,
                        head_dim: int = 128, block_size: int = 16, len_range: tuple[int, int] = (256, 2048),
                        copy_bytes: int = 1 << 30) -> AttentionBench:
    """Time paged_attention, dense_attention (the same kernel over contiguous K/V) and a device-to-device copy
    of copy_bytes; `seconds(fn)` times one call of fn, `device_copy(dst, src)` copies a whole buffer."""
    w = attention_workload(kernels.xp, num_seqs, num_heads, head_dim, block_size, len_range)
    scale = head_dim**-0.5
    paged = kernels.prepare_paged_attention(w["q"], w["kv"], w["tables"], w["lens"], scale)
    dense = kernels.prepare_dense_attention(w["q"], w["k"], w["v"], w["lens"], scale)
    paged_s, dense_s = seconds(paged), seconds(dense)
    agreement = relative_error(kernels.to_host(paged()), kernels.to_host(dense()))
    src = kernels.xp.ones(copy_bytes, dtype=kernels.xp.uint8)
    dst = kernels.xp.empty_like(src)
    copy_s = seconds(lambda: device_copy(dst, src))
    return AttentionBench(num_seqs, num_heads, head_dim, block_size, (int(w["lens"].min()), int(w["lens"].max())),
                          w["kv_bytes"], paged_s, dense_s, 2 * copy_bytes / copy_s, agreement)
