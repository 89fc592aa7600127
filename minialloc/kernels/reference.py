"""NumPy twins of the CUDA kernels: the same semantics, the same argument checks, one line of NumPy each.

Each function here states what its kernel must do. The tests run the kernels (on the CPU through
cuda_emulation.h, on a GPU through CuPy) on poisoned buffers and compare every byte with these functions, so a
kernel that writes one byte too many, misses a tail, or races with itself is caught.

The argument checks live here too, and the launch wrappers (launch.py) call the same ones: a kernel never sees
an argument its twin would have refused. They take any array with NumPy's attributes (a CuPy array works too).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

POISON = 0xDBDBDBDB  # what freed memory is filled with in debug mode: 0xDB bytes, easy to spot in a dump
ZERO = 0  # what new memory is filled with in debug mode


def _check_bytes(buf, name: str) -> None:
    if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise TypeError(f"{name} must be a contiguous 1-D uint8 array, got {buf.dtype} with shape {buf.shape}")


def _check_int(value: object, name: str, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < upper:
        raise ValueError(f"{name} must be an int in [0, {upper}), got {value!r}")
    return int(value)


def check_range(buf, offset: int, nbytes: int, name: str = "buf") -> tuple[int, int]:
    """The range [offset, offset + nbytes) must lie inside the 1-D uint8 buffer."""
    _check_bytes(buf, name)
    offset = _check_int(offset, "offset", 2**64)
    nbytes = _check_int(nbytes, "nbytes", 2**64)
    if offset + nbytes > buf.size:
        raise ValueError(f"range [{offset}, {offset + nbytes}) runs past the end of {name} ({buf.size} bytes)")
    return offset, nbytes


def check_pattern(pattern: int) -> int:
    return _check_int(pattern, "pattern", 2**32)


def pattern_bytes(pattern: int, nbytes: int) -> np.ndarray:
    """The bytes fill writes: byte i is byte (i % 4) of the 32-bit pattern, least significant first."""
    word = np.array([check_pattern(pattern)], dtype="<u4").view(np.uint8)
    return np.resize(word, nbytes)


def ranges_overlap(a_start: int, b_start: int, nbytes: int) -> bool:
    """Do [a_start, a_start + nbytes) and [b_start, b_start + nbytes) share a byte?"""
    return nbytes > 0 and a_start < b_start + nbytes and b_start < a_start + nbytes


def fill(buf: np.ndarray, offset: int, nbytes: int, pattern: int) -> None:
    """fill_pattern: write the pattern over buf[offset : offset + nbytes], and nothing else."""
    offset, nbytes = check_range(buf, offset, nbytes)
    buf[offset : offset + nbytes] = pattern_bytes(pattern, nbytes)


def guard_check(buf: np.ndarray, offset: int, nbytes: int, pattern: int) -> int:
    """guard_check: the first i in [0, nbytes) with buf[offset + i] != pattern byte i, or -1 if none differs."""
    offset, nbytes = check_range(buf, offset, nbytes)
    bad = np.flatnonzero(buf[offset : offset + nbytes] != pattern_bytes(pattern, nbytes))
    return int(bad[0]) if bad.size else -1


def check_copy(dst, dst_offset: int, src, src_offset: int, nbytes: int, dst_address: int,
               src_address: int) -> tuple[int, int, int]:
    """Both ranges inside their buffers, and no byte shared: overlap is judged on addresses, since the two
    buffers may be views of one allocation."""
    dst_offset, nbytes = check_range(dst, dst_offset, nbytes, "dst")
    src_offset, nbytes = check_range(src, src_offset, nbytes, "src")
    if ranges_overlap(dst_address + dst_offset, src_address + src_offset, nbytes):
        raise ValueError("block_copy: source and destination overlap; use move() (move_plan) for overlapping moves")
    return dst_offset, src_offset, nbytes


def block_copy(dst: np.ndarray, dst_offset: int, src: np.ndarray, src_offset: int, nbytes: int) -> None:
    """block_copy: dst[dst_offset:][:nbytes] = src[src_offset:][:nbytes]; overlapping ranges are refused."""
    dst_offset, src_offset, nbytes = check_copy(
        dst, dst_offset, src, src_offset, nbytes, dst.ctypes.data, src.ctypes.data
    )
    dst[dst_offset : dst_offset + nbytes] = src[src_offset : src_offset + nbytes]


def move_plan(dst: int, src: int, nbytes: int) -> list[tuple[int, int, int]]:
    """Split a possibly overlapping move (memmove) into non-overlapping copies (dst, src, n), run in list order.

    Moving down (dst < src, what compaction does) copies chunks of at most src - dst bytes from the front: each
    chunk overwrites only source bytes an earlier chunk has already copied. Moving up goes from the back. So the
    cost is ceil(nbytes / |src - dst|) launches: a move by a small distance is better staged through a spare buffer.
    """
    gap = abs(dst - src)
    if nbytes == 0 or gap == 0:
        return []
    if gap >= nbytes:
        return [(dst, src, nbytes)]
    if dst < src:
        return [(dst + k, src + k, min(gap, nbytes - k)) for k in range(0, nbytes, gap)]
    plan = []
    end = nbytes
    while end > 0:
        start = max(0, end - gap)
        plan.append((dst + start, src + start, end - start))
        end = start
    return plan


def move(buf: np.ndarray, dst: int, src: int, nbytes: int) -> None:
    """memmove within one buffer: afterwards buf[dst:dst+nbytes] holds what buf[src:src+nbytes] held before."""
    check_range(buf, dst, nbytes)
    check_range(buf, src, nbytes)
    buf[dst : dst + nbytes] = buf[src : src + nbytes].copy()


def check_cache(cache) -> tuple[int, int]:
    """A KV cache is a contiguous [num_blocks, block_bytes] uint8 array with block_bytes a multiple of 4."""
    if cache.dtype != np.uint8 or cache.ndim != 2 or not cache.flags.c_contiguous:
        raise TypeError(f"cache must be a contiguous 2-D uint8 array, got {cache.dtype} with shape {cache.shape}")
    num_blocks, block_bytes = cache.shape
    if block_bytes % 4:
        raise ValueError(f"block size {block_bytes} bytes is not a multiple of 4 (the kernel copies 32-bit words)")
    return num_blocks, block_bytes


def check_pairs(num_blocks: int, pairs: Iterable[tuple[int, int]]) -> np.ndarray:
    """(src, dst) pairs as an int64 [n, 2] array. Pairs run in parallel, so each dst must be written once and
    read by no pair: the destinations are distinct and none of them is a source."""
    arr = np.asarray(list(pairs), dtype=np.int64).reshape(-1, 2)
    if arr.size and (arr.min() < 0 or arr.max() >= num_blocks):
        raise ValueError(f"block index out of range [0, {num_blocks}) in pairs")
    dsts = arr[:, 1]
    if np.unique(dsts).size != dsts.size:
        raise ValueError("copy_blocks: two pairs write the same destination block")
    if np.intersect1d(dsts, arr[:, 0]).size:
        raise ValueError("copy_blocks: a destination block is also a source; the result would depend on order")
    return arr


def copy_blocks(cache: np.ndarray, pairs: Iterable[tuple[int, int]]) -> None:
    """copy_blocks: for each (src, dst) pair, cache[dst] = cache[src]."""
    num_blocks, _ = check_cache(cache)
    arr = check_pairs(num_blocks, pairs)
    cache[arr[:, 1]] = cache[arr[:, 0]]
