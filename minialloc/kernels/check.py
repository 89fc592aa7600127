"""Compare a kernel runner (CPU emulation or GPU) with the NumPy twins on random, poisoned inputs.

Every case fills its output buffers with random bytes first, runs the kernel on one copy and the twin on
another, and compares WHOLE buffers, so a write outside the range counts as an error as much as a wrong byte
inside it. Sizes are random, hence rarely multiples of the block, and most cases force a grid far smaller
than the work, so the grid-stride loops must carry the rest. The figure per kernel is the largest absolute
difference seen (bytes, or the offset guard_check returned): 0 means byte-for-byte equal.

The attention kernels compute in float32 what the twins compute in float64, so their figure is the largest
relative error of one head's output vector (reference.relative_error), which must stay under
ATTENTION_TOLERANCE (the issue's 1e-5); outputs start as NaN, so a vector left unwritten counts as infinite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import reference as ref
from .launch import Kernels


@dataclass
class KernelCheck:
    kernel: str
    cases: int = 0
    max_abs_error: int = 0
    first_failure: str | None = None

    def record(self, error: int, what: str) -> None:
        self.cases += 1
        self.max_abs_error = max(self.max_abs_error, error)
        if error and self.first_failure is None:
            self.first_failure = what


@dataclass
class _Case:
    rng: np.random.Generator
    max_size: int
    shapes: list[tuple[int | None, int | None]] = field(default_factory=list)

    def shape(self) -> dict[str, int | None]:
        grid, block = self.shapes[int(self.rng.integers(len(self.shapes)))]
        return {"grid": grid, "block": block}

    def noise(self, n: int) -> np.ndarray:
        return self.rng.integers(0, 256, n, dtype=np.uint8)

    def span(self, size: int) -> tuple[int, int]:
        offset = int(self.rng.integers(0, size))
        return offset, int(self.rng.integers(0, size - offset + 1))


def _diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max(initial=0))


def compare_with_reference(kernels: Kernels, seed: int = 0, rounds: int = 24,
                           max_size: int = 5000) -> list[KernelCheck]:
    """Run `rounds` random cases of each kernel; returns one KernelCheck per kernel (and one for move)."""
    c = _Case(np.random.default_rng(seed), max_size,
              [(None, None), (1, 1), (1, 32), (2, 7), (3, 33), (2, 64), (None, 96)])
    checks = {name: KernelCheck(name) for name in ("fill_pattern", "guard_check", "block_copy", "move",
                                                   "copy_blocks")}
    dev, host = kernels.to_device, kernels.to_host
    for _ in range(rounds):
        size = int(c.rng.integers(1, max_size))
        pattern = int(c.rng.choice([ref.POISON, ref.ZERO, int(c.rng.integers(0, 2**32))]))

        # fill: the whole buffer must equal the twin's, bytes outside the range included
        buf = c.noise(size)
        offset, nbytes = c.span(size)
        out = dev(buf)
        kernels.fill(out, offset, nbytes, pattern, **c.shape())
        ref.fill(buf, offset, nbytes, pattern)
        checks["fill_pattern"].record(_diff(host(out), buf), f"fill size={size} offset={offset} n={nbytes}")

        # guard_check: a guard region with 0-3 corrupted bytes, its neighbours corrupted too (reading past the
        # range would find them)
        ref.fill(buf, offset, nbytes, pattern)
        for at in (offset - 1, offset + nbytes):
            if 0 <= at < size:
                buf[at] = ~np.uint8(pattern >> (8 * ((at - offset) % 4)) & 0xFF)
        for _ in range(int(c.rng.integers(0, 4)) if nbytes else 0):
            at = offset + int(c.rng.integers(0, nbytes))
            buf[at] ^= np.uint8(c.rng.integers(1, 256))
        got = kernels.guard_check(dev(buf), offset, nbytes, pattern, **c.shape())
        want = ref.guard_check(buf, offset, nbytes, pattern)
        checks["guard_check"].record(abs(got - want), f"guard_check size={size} got {got} want {want}")

        # block_copy between two buffers, whole destination compared
        src = c.noise(size)
        dst = c.noise(size)
        s_off, nbytes = c.span(size)
        d_off = int(c.rng.integers(0, size - nbytes + 1))
        out = dev(dst)
        kernels.block_copy(out, d_off, dev(src), s_off, nbytes, **c.shape())
        ref.block_copy(dst, d_off, src, s_off, nbytes)
        checks["block_copy"].record(_diff(host(out), dst), f"block_copy size={size} {s_off}->{d_off} n={nbytes}")

        # move inside one buffer, usually overlapping, both directions
        buf = c.noise(size)
        a, nbytes = c.span(size)
        b = int(c.rng.integers(0, size - nbytes + 1))
        out = dev(buf)
        kernels.move(out, b, a, nbytes, **c.shape())
        ref.move(buf, b, a, nbytes)
        checks["move"].record(_diff(host(out), buf), f"move size={size} {a}->{b} n={nbytes}")

        # copy_blocks: distinct destinations that are nobody's source
        num_blocks = int(c.rng.integers(2, 48))
        block_bytes = 4 * int(c.rng.integers(1, max(2, max_size // 64)))
        cache = c.rng.integers(0, 256, (num_blocks, block_bytes), dtype=np.uint8)
        order = c.rng.permutation(num_blocks)
        npairs = int(c.rng.integers(0, num_blocks // 2 + 1))
        srcs = c.rng.choice(order[:num_blocks - npairs], npairs)  # sources may repeat: a block copied twice
        pairs = list(zip(srcs.tolist(), order[num_blocks - npairs:].tolist(), strict=True))
        out = dev(cache)
        kernels.copy_blocks(out, pairs, **c.shape())
        ref.copy_blocks(cache, pairs)
        checks["copy_blocks"].record(_diff(host(out), cache),
                                     f"copy_blocks {num_blocks}x{block_bytes} pairs={pairs[:4]}...")
    kernels.synchronize()
    return list(checks.values())


# -- attention --------------------------------------------------------------------------------------------------
ATTENTION_TOLERANCE = 1e-5  # relative error, float32 kernel against the float64 twin
HEAD_DIMS = (1, 3, 8, 16, 31, 64, 100, 128, 129, 256)  # each per-lane size the kernel dispatches on, and odd ones
GARBAGE = 1e3  # cache slots no context reaches hold values this large: a kernel reading one is far off


@dataclass
class AttentionCheck:
    kernel: str
    cases: int = 0
    max_rel_error: float = 0.0
    first_failure: str | None = None

    def record(self, error: float, what: str) -> None:
        self.cases += 1
        self.max_rel_error = max(self.max_rel_error, error)
        if not error < ATTENTION_TOLERANCE and self.first_failure is None:
            self.first_failure = f"{what}: rel err {error:.3g}"

    @property
    def passed(self) -> bool:
        return self.cases > 0 and self.max_rel_error < ATTENTION_TOLERANCE


@dataclass
class AttentionCase:
    """Random sequences stored twice: in a paged cache through block tables, and contiguous (gathered from it)."""

    q: np.ndarray  # [num_seqs, num_heads, head_dim]
    kv_cache: np.ndarray  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    block_tables: np.ndarray  # [num_seqs, max_blocks] int64
    context_lens: np.ndarray  # [num_seqs]
    k: np.ndarray  # [num_seqs, max_len, num_kv_heads, head_dim], garbage past each context
    v: np.ndarray
    scale: float

    def describe(self) -> str:
        num_blocks, _, bs, kv_heads, head_dim = self.kv_cache.shape
        return (f"{len(self.context_lens)} seqs, lens {self.context_lens.tolist()[:6]}, heads {self.q.shape[1]}/"
                f"{kv_heads}, head_dim {head_dim}, block {bs}, {num_blocks} blocks")


def random_attention_case(rng: np.random.Generator, max_context: int = 70, max_seqs: int = 5,
                          head_dims: tuple[int, ...] = HEAD_DIMS) -> AttentionCase:
    """Context lengths drawn uniformly (rarely block multiples), each sequence's blocks scattered over a larger
    cache, some sequences sharing full prefix blocks (as forks and prefix caching do), garbage everywhere no
    context reaches (slots past a context, unused blocks, table entries past a context pointing at them)."""
    num_kv_heads = int(rng.integers(1, 4))
    num_heads = num_kv_heads * int(rng.choice([1, 2, 4]))
    head_dim = int(rng.choice(head_dims))
    bs = int(rng.choice([1, 2, 5, 8, 16]))
    num_seqs = int(rng.integers(1, max_seqs + 1))
    lens = rng.integers(1, max_context + 1, num_seqs)
    nblocks = -(-lens // bs)
    # at least one spare table entry and one spare dense row: a kernel reading one token too many stays in bounds
    # (and reads garbage, which the comparison sees) instead of crashing the process
    max_blocks = int(nblocks.max()) + int(rng.integers(1, 3))
    num_blocks = int(nblocks.sum()) + int(rng.integers(1, 8))
    order = rng.permutation(num_blocks)
    tables = np.empty((num_seqs, max_blocks), dtype=np.int64)
    taken = 0
    for s in range(num_seqs):
        tables[s, : nblocks[s]] = order[taken : taken + nblocks[s]]
        taken += int(nblocks[s])
        if s and rng.random() < 0.3:  # share the full blocks both contexts hold with sequence 0
            shared = int(rng.integers(0, min(lens[0], lens[s]) // bs + 1))
            tables[s, :shared] = tables[0, :shared]
        tables[s, nblocks[s]:] = order[taken:][rng.integers(0, num_blocks - taken, max_blocks - nblocks[s])]
    cache = rng.uniform(-GARBAGE, GARBAGE, (num_blocks, 2, bs, num_kv_heads, head_dim)).astype(np.float32)
    max_len = int(lens.max()) + int(rng.integers(1, 5))
    k = rng.uniform(-GARBAGE, GARBAGE, (num_seqs, max_len, num_kv_heads, head_dim)).astype(np.float32)
    v = k.copy()
    for s in range(num_seqs):  # real K and V in every slot a context reaches; shared blocks get them once
        for pos in range(int(lens[s])):
            block, off = tables[s, pos // bs], pos % bs
            if s and pos // bs < max_blocks and block == tables[0, pos // bs] and pos < lens[0]:
                k[s, pos], v[s, pos] = cache[block, 0, off], cache[block, 1, off]
                continue
            cache[block, :, off] = rng.standard_normal((2, num_kv_heads, head_dim), dtype=np.float32)
            k[s, pos], v[s, pos] = cache[block, 0, off], cache[block, 1, off]
    q = rng.standard_normal((num_seqs, num_heads, head_dim), dtype=np.float32)
    return AttentionCase(q, cache, tables, lens, k, v, float(rng.uniform(0.05, 1.0)))


def compare_attention_with_reference(kernels: Kernels, seed: int = 0, rounds: int = 12, max_context: int = 70,
                                     max_seqs: int = 5) -> list[AttentionCheck]:
    """Random cases of the attention kernels, on `kernels`, against the float64 twins: paged_attention against
    its twin and against dense attention over the same sequences, dense_attention against its twin."""
    rng = np.random.default_rng(seed)
    shapes = [(None, None), (1, 32), (3, 64), (2, 256), (None, 96), (None, 32)]
    checks = {name: AttentionCheck(name) for name in ("paged_attention", "paged_attention vs dense attention",
                                                      "dense_attention")}
    dev, host = kernels.to_device, kernels.to_host
    for _ in range(rounds):
        case = random_attention_case(rng, max_context, max_seqs)
        grid, block = shapes[int(rng.integers(len(shapes)))]
        what = f"{case.describe()}, grid {grid} block {block}"
        q = dev(case.q)
        out = dev(np.full(case.q.shape, np.nan, dtype=np.float32))
        kernels.paged_attention(q, dev(case.kv_cache), case.block_tables, case.context_lens, case.scale, out=out,
                                grid=grid, block=block)
        got = host(out)
        checks["paged_attention"].record(
            ref.relative_error(got, ref.paged_attention(case.q, case.kv_cache, case.block_tables,
                                                        case.context_lens, case.scale)), what)
        dense_want = ref.dense_attention(case.q, case.k, case.v, case.context_lens, case.scale)
        checks["paged_attention vs dense attention"].record(ref.relative_error(got, dense_want), what)
        out = dev(np.full(case.q.shape, np.nan, dtype=np.float32))
        kernels.dense_attention(q, dev(case.k), dev(case.v), case.context_lens, case.scale, out=out, grid=grid,
                                block=block)
        checks["dense_attention"].record(ref.relative_error(host(out), dense_want), what)
    kernels.synchronize()
    return list(checks.values())
