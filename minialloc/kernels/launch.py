"""Launch wrappers shared by the CPU emulation and the GPU: check arguments, choose a grid, launch.

A subclass supplies three things: the array module (`xp`: numpy or cupy), how to read an array's address,
and how to launch a kernel by name with its arguments in KERNELS order. Everything else, the checks (the same
functions the NumPy twins use) and the launch shapes, is written once here, so the emulation tests exercise
exactly the code the GPU runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import reference

ULLONG_MAX = 2**64 - 1  # guard_check's "no mismatch yet" value


class Kernels(ABC):
    """The four kernels behind checked Python calls. `block` threads per block; grids are capped at `max_grid`
    blocks and grid-stride loops cover the rest. Every call also takes grid= and block= to force a shape."""

    xp: Any = np

    def __init__(self, block: int = 256, max_grid: int = 1024) -> None:
        if block < 1 or max_grid < 1:
            raise ValueError("block and max_grid must be positive")
        self.block = block
        self.max_grid = max_grid

    # -- what a runner supplies ----------------------------------------------------------------------------------
    @abstractmethod
    def _launch(self, name: str, grid: int, block: int, args: list) -> None:
        """Launch kernel `name` on grid x block threads; args in KERNELS order (arrays, or ints for pointers)."""

    @abstractmethod
    def address(self, array) -> int:
        """The address of an array's first byte where the kernels run."""

    def to_device(self, host: np.ndarray):
        """A copy of a host array where the kernels run (always a copy, also when that is the host)."""
        return self.xp.array(host, copy=True)

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array)

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every launch made so far has finished."""

    # -- shapes ------------------------------------------------------------------------------------------------
    def _shape(self, work: int, grid: int | None, block: int | None) -> tuple[int, int]:
        block = self.block if block is None else block
        grid = min(self.max_grid, -(-work // block)) if grid is None else grid
        if grid < 1 or block < 1:
            raise ValueError(f"grid and block must be positive, got grid={grid} block={block}")
        return grid, block

    # -- the kernels -------------------------------------------------------------------------------------------
    def launch_empty(self) -> None:
        """One launch that touches no memory (fill_pattern over 0 bytes): a unit of queued work for stream tests."""
        self._launch("fill_pattern", 1, 1, [0, 0, 0, 0])

    def fill(self, buf, offset: int, nbytes: int, pattern: int, *, grid: int | None = None,
             block: int | None = None) -> None:
        """Write the 4-byte pattern over buf[offset : offset + nbytes] (see reference.fill)."""
        offset, nbytes = reference.check_range(buf, offset, nbytes)
        pattern = reference.check_pattern(pattern)
        if nbytes:
            self._launch("fill_pattern", *self._shape(nbytes, grid, block), [buf, offset, nbytes, pattern])

    def guard_check(self, buf, offset: int, nbytes: int, pattern: int, *, grid: int | None = None,
                    block: int | None = None) -> int:
        """The first offset in the range whose byte differs from the pattern, or -1 (see reference.guard_check)."""
        offset, nbytes = reference.check_range(buf, offset, nbytes)
        pattern = reference.check_pattern(pattern)
        if not nbytes:
            return -1
        first_bad = self.to_device(np.array([ULLONG_MAX], dtype=np.uint64))
        self._launch("guard_check", *self._shape(nbytes, grid, block), [buf, offset, nbytes, pattern, first_bad])
        found = int(self.to_host(first_bad)[0])
        return -1 if found == ULLONG_MAX else found

    def block_copy(self, dst, dst_offset: int, src, src_offset: int, nbytes: int, *, grid: int | None = None,
                   block: int | None = None) -> None:
        """Copy between non-overlapping ranges (see reference.block_copy); overlap raises ValueError."""
        dst_offset, src_offset, nbytes = reference.check_copy(
            dst, dst_offset, src, src_offset, nbytes, self.address(dst), self.address(src)
        )
        if nbytes:
            self._launch("block_copy", *self._shape(nbytes, grid, block),
                         [dst, dst_offset, src, src_offset, nbytes])

    def move(self, buf, dst: int, src: int, nbytes: int, *, grid: int | None = None,
             block: int | None = None) -> None:
        """memmove inside one buffer, as block_copy launches in move_plan's order (see reference.move).

        On a GPU the launches go to one stream, which runs them one after another: that ordering is what makes
        the plan correct.
        """
        reference.check_range(buf, dst, nbytes)
        reference.check_range(buf, src, nbytes)
        for d, s, n in reference.move_plan(dst, src, nbytes):
            self.block_copy(buf, d, buf, s, n, grid=grid, block=block)

    def copy_blocks(self, cache, pairs: Iterable[tuple[int, int]], *, grid: int | None = None,
                    block: int | None = None) -> None:
        """cache[dst] = cache[src] for every (src, dst) pair (see reference.copy_blocks)."""
        num_blocks, block_bytes = reference.check_cache(cache)
        arr = reference.check_pairs(num_blocks, pairs)
        if self.address(cache) % 4:
            raise ValueError("cache must start on a 4-byte boundary (the kernel copies 32-bit words)")
        if not len(arr):
            return
        grid = min(self.max_grid, len(arr)) if grid is None else grid
        grid, block = self._shape(len(arr), grid, block)
        self._launch("copy_blocks", grid, block, [cache, self.to_device(arr), len(arr), block_bytes // 4])
