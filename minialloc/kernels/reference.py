"""NumPy twins of the CUDA kernels: the same semantics, the same argument checks, one line of NumPy each.

Each function here states what its kernel must do. The tests run the kernels (on the CPU through
cuda_emulation.h, on a GPU through CuPy) on poisoned buffers and compare every byte with these functions, so a
kernel that writes one byte too many, misses a tail, or races with itself is caught. The attention kernels'
twins are the float64 references below (paged_attention_reference, dense_attention_reference), behind the
kernels' checks, compared in relative error.

The argument checks live here too, and the launch wrappers (launch.py) call the same ones: a kernel never sees
an argument its twin would have refused. They take any array with NumPy's attributes (a CuPy array works too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    return np.tile(word, -(-nbytes // 4))[:nbytes]  # np.tile: np.resize is slow for large buffers


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


def copy_waves(pairs: Iterable[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split an ORDERED list of block copies into waves that copy_blocks may run in parallel.

    The block manager records its copy-on-write pairs in the order they happened, and their meaning is "one after
    another": a later pair may read a block an earlier pair wrote (a chain: a fork of a fork copies the first copy),
    or write a block an earlier pair read (a freed source reused as a destination), or write the same destination
    again. copy_blocks runs its pairs in parallel, so check_pairs refuses all three. Here a new wave starts at the
    first pair that would conflict with the current wave; inside a wave no pair touches another's destination, so
    running the waves in order, one launch each, equals running the pairs one by one (copy_blocks_reference,
    the definition). A pair copying a block onto itself changes nothing and is dropped.
    """
    waves: list[list[tuple[int, int]]] = []
    wave: list[tuple[int, int]] = []
    sources: set[int] = set()
    destinations: set[int] = set()
    for src, dst in pairs:
        src, dst = int(src), int(dst)
        if src == dst:
            continue
        if dst in destinations or dst in sources or src in destinations:
            waves.append(wave)
            wave, sources, destinations = [], set(), set()
        wave.append((src, dst))
        sources.add(src)
        destinations.add(dst)
    if wave:
        waves.append(wave)
    return waves


# -- attention ------------------------------------------------------------------------------------------------------
MAX_HEAD_DIM = 256  # paged_attention.cu: 16 lanes per token x 16 dimensions per lane
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class AttentionArgs:
    """Checked attention arguments: the sizes the kernel takes, and the metadata as host int32 arrays."""

    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_lens: np.ndarray  # [num_seqs] int32, each >= 1
    block_tables: np.ndarray | None = None  # [num_seqs, max_blocks] int32 (paged only)
    block_size: int = 0  # paged only
    max_len: int = 0  # dense only


def _check_float32(array, name: str, ndim: int) -> tuple[int, ...]:
    if array.dtype != np.float32 or array.ndim != ndim or not array.flags.c_contiguous:
        raise TypeError(f"{name} must be a contiguous {ndim}-D float32 array, got {array.dtype} with shape "
                        f"{array.shape}")
    return tuple(int(n) for n in array.shape)


def _check_query(q, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    num_seqs, num_heads, q_dim = _check_float32(q, "q", 3)
    if q_dim != head_dim:
        raise ValueError(f"q has head_dim {q_dim}, the KV cache {head_dim}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if num_seqs < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"need at least one sequence, and num_heads ({num_heads}) a multiple of num_kv_heads "
                         f"({num_kv_heads})")
    return num_seqs, num_heads


def _check_lens(context_lens, num_seqs: int, max_len: int, what: str) -> np.ndarray:
    lens = np.asarray(context_lens)
    if lens.shape != (num_seqs,) or lens.dtype.kind not in "iu":
        raise ValueError(f"context_lens must be {num_seqs} integers, got {lens.dtype} with shape {lens.shape}")
    if lens.size and (lens.min() < 1 or lens.max() > max_len):
        raise ValueError(f"every context length must be in [1, {max_len}] ({what}), got {lens.min()}..{lens.max()}")
    return lens.astype(np.int32)


def check_paged_attention(q, kv_cache, block_tables, context_lens) -> AttentionArgs:
    """q [num_seqs, heads, head_dim], kv_cache [num_blocks, 2, block_size, kv_heads, head_dim] (float32,
    contiguous); block_tables [num_seqs, max_blocks] and context_lens [num_seqs] on the host (the scheduler's
    metadata). Every table entry a context reaches must name a block of the cache; entries past it are ignored."""
    num_blocks, two, block_size, num_kv_heads, head_dim = _check_float32(kv_cache, "kv_cache", 5)
    if two != 2 or num_blocks < 1 or block_size < 1:
        raise ValueError(f"kv_cache must be [num_blocks, 2, block_size, kv_heads, head_dim], got {kv_cache.shape}")
    num_seqs, num_heads = _check_query(q, num_kv_heads, head_dim)
    tables = np.asarray(block_tables)
    if tables.ndim != 2 or tables.shape[0] != num_seqs or tables.dtype.kind not in "iu":
        raise ValueError(f"block_tables must be [{num_seqs}, max_blocks] integers, got {tables.dtype} with shape "
                         f"{tables.shape}")
    lens = _check_lens(context_lens, num_seqs, tables.shape[1] * block_size,
                       f"{tables.shape[1]} table entries of {block_size} tokens")
    used = np.arange(tables.shape[1]) < -(-lens[:, None].astype(np.int64) // block_size)
    reached = tables[used]
    if reached.size and (reached.min() < 0 or reached.max() >= num_blocks):
        raise ValueError(f"a block table entry within a context is outside [0, {num_blocks})")
    # entries past a context are never read; zero them so the int32 conversion cannot wrap a large one
    safe = np.where(used, tables, 0).astype(np.int32)
    if num_blocks > INT32_MAX:
        raise ValueError(f"{num_blocks} blocks do not fit the kernel's int32 block tables")
    return AttentionArgs(num_seqs, num_heads, num_kv_heads, head_dim, lens, np.ascontiguousarray(safe), block_size)


def check_dense_attention(q, k, v, context_lens) -> AttentionArgs:
    """q [num_seqs, heads, head_dim]; k, v [num_seqs, max_len, kv_heads, head_dim] (float32, contiguous)."""
    num_seqs, max_len, num_kv_heads, head_dim = _check_float32(k, "k", 4)
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    _check_float32(v, "v", 4)
    if _check_query(q, num_kv_heads, head_dim)[0] != num_seqs:
        raise ValueError(f"q has {q.shape[0]} sequences, k and v {num_seqs}")
    lens = _check_lens(context_lens, num_seqs, max_len, f"max_len {max_len}")
    return AttentionArgs(num_seqs, int(q.shape[1]), num_kv_heads, head_dim, lens, max_len=max_len)


def paged_attention_reference(q: np.ndarray, kv_cache: np.ndarray, block_tables: np.ndarray,
                              context_lens: Sequence[int], scale: float) -> np.ndarray:
    """Decode attention through block tables, one block at a time with an online softmax, as the kernel works.

    q: [num_seqs, num_heads, head_dim]; kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim];
    block_tables: [num_seqs, max_blocks] (entries past a sequence's context are ignored); context_lens:
    [num_seqs]. num_heads may be a multiple of num_kv_heads (grouped-query attention). Returns q's shape in
    float64.
    The CUDA kernel with these semantics is minialloc/kernels/paged_attention.cu (float32 throughout).
    """
    num_seqs, num_heads, head_dim = q.shape
    bs, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = np.zeros((num_seqs, num_heads, head_dim), dtype=np.float64)
    for s in range(num_seqs):
        qs = q[s].astype(np.float64).reshape(num_kv_heads, group, head_dim)
        m = np.full((num_kv_heads, group), -np.inf)  # running max of the scores
        denom = np.zeros((num_kv_heads, group))
        acc = np.zeros((num_kv_heads, group, head_dim))
        for j in range(-(-int(context_lens[s]) // bs)):
            n = min(bs, int(context_lens[s]) - j * bs)
            k = kv_cache[block_tables[s][j], 0, :n].astype(np.float64)  # [n, kv_heads, head_dim]
            v = kv_cache[block_tables[s][j], 1, :n].astype(np.float64)
            scores = np.einsum("hgd,nhd->hgn", qs, k) * scale
            m_new = np.maximum(m, scores.max(axis=-1))
            p = np.exp(scores - m_new[..., None])
            rescale = np.exp(m - m_new)
            denom = denom * rescale + p.sum(axis=-1)
            acc = acc * rescale[..., None] + np.einsum("hgn,nhd->hgd", p, v)
            m = m_new
        out[s] = (acc / denom[..., None]).reshape(num_heads, head_dim)
    return out


def dense_attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, context_lens: Sequence[int],
                              scale: float) -> np.ndarray:
    """The same decode attention over contiguous K/V: k, v [num_seqs, max_len, num_kv_heads, head_dim].

    Computed in float64 whatever the inputs' dtype (a float32 twin of a float32 kernel is off by ~1e-5 itself at
    head_dim 1, the kernels' whole tolerance); returns float64."""
    num_seqs, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    out = np.zeros((num_seqs, num_heads, head_dim), dtype=np.float64)
    for s in range(num_seqs):
        n = int(context_lens[s])
        ks = np.repeat(k[s, :n].astype(np.float64), group, axis=1)  # [n, heads, head_dim]
        vs = np.repeat(v[s, :n].astype(np.float64), group, axis=1)
        scores = np.einsum("hd,nhd->hn", q[s].astype(np.float64), ks) * scale
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[s] = np.einsum("hn,nhd->hd", p / p.sum(axis=-1, keepdims=True), vs)
    return out


def paged_attention(q: np.ndarray, kv_cache: np.ndarray, block_tables, context_lens, scale: float) -> np.ndarray:
    """paged_attention: the kernel's twin, paged_attention_reference after the kernel's checks (float64)."""
    args = check_paged_attention(q, kv_cache, block_tables, context_lens)
    return paged_attention_reference(q, kv_cache, args.block_tables, args.context_lens, scale)


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, context_lens, scale: float) -> np.ndarray:
    """dense_attention: the kernel's twin, dense_attention_reference after the kernel's checks (float64)."""
    args = check_dense_attention(q, k, v, context_lens)
    return dense_attention_reference(q, k, v, args.context_lens, scale)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest relative error of one head's output vector, ||got - want|| / ||want|| (float64; NaN -> inf).

    Per head vector rather than per element: an output element near zero (a cancelling weighted sum of V) has no
    meaningful relative error, the vector does."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got64.shape != want64.shape:
        raise ValueError(f"shapes differ: {got64.shape} vs {want64.shape}")
    if not np.all(np.isfinite(got64)):
        return float("inf")
    diff = np.linalg.norm(got64 - want64, axis=-1)
    norm = np.linalg.norm(want64, axis=-1)
    return float(np.max(diff / np.maximum(norm, np.finfo(np.float64).tiny), initial=0.0))


def write_kv_reference(kv_cache: np.ndarray, block_table: Sequence[int], pos: int, k: np.ndarray,
                       v: np.ndarray) -> None:
    """Store one token's K and V ([heads, head_dim]) at position `pos` through a block table (reshape_and_cache)."""
    bs = kv_cache.shape[2]
    block, off = block_table[pos // bs], pos % bs
    kv_cache[block, 0, off] = k
    kv_cache[block, 1, off] = v


def copy_blocks_reference(kv_cache: np.ndarray, pairs: Iterable[tuple[int, int]]) -> None:
    """Copy whole blocks src -> dst, keys and values, ONE PAIR AFTER ANOTHER (the copies of copy-on-write).

    Sequential on purpose: that is what the block manager's list means (a later pair may copy a block an earlier
    one wrote, a fork of a fork). The copy_blocks kernel runs its pairs in parallel and refuses such lists, so the
    GPU path (KVCache.copy_blocks, Kernels.copy_blocks_in_order) splits them with kernels.reference.copy_waves;
    the tests check that both give this function's result.
    """
    num_blocks = kv_cache.shape[0]
    for src, dst in pairs:
        if not (0 <= src < num_blocks and 0 <= dst < num_blocks):
            raise ValueError(f"block pair ({src}, {dst}) outside [0, {num_blocks})")
        kv_cache[dst] = kv_cache[src]
