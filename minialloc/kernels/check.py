"""Compare a kernel runner (CPU emulation or GPU) with the NumPy twins on random, poisoned inputs.

Every case fills its output buffers with random bytes first, runs the kernel on one copy and the twin on
another, and compares WHOLE buffers, so a write outside the range counts as an error as much as a wrong byte
inside it. Sizes are random, hence rarely multiples of the block, and most cases force a grid far smaller
than the work, so the grid-stride loops must carry the rest. The figure per kernel is the largest absolute
difference seen (bytes, or the offset guard_check returned): 0 means byte-for-byte equal.
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
