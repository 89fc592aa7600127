"""Launch wrappers shared by the CPU emulation and the GPU: check arguments, choose a grid, launch.

A subclass supplies three things: the array module (`xp`: numpy or cupy), how to read an array's address,
and how to launch a kernel by name with its arguments in KERNELS order. Everything else, the checks (the same
functions the NumPy twins use) and the launch shapes, is written once here, so the emulation tests exercise
exactly the code the GPU runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import reference

ULLONG_MAX = 2**64 - 1  # guard_check's "no mismatch yet" value
MAX_THREADS_PER_BLOCK = 1024  # every GPU since compute capability 2.0; a launch above it fails on the device


def _check_threads(block: int) -> None:
    if block > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"block={block} threads: a CUDA block holds at most {MAX_THREADS_PER_BLOCK} threads")


class Kernels(ABC):
    """The kernels behind checked Python calls. `block` threads per block; grids are capped at `max_grid`
    blocks and grid-stride loops cover the rest. Every call also takes grid= and block= to force a shape.

    The attention kernels are the exception to both defaults: one CUDA block per (sequence, head), uncapped, of
    ATTENTION_BLOCK threads (a multiple of 32, at most 256: the kernel's shared arrays are sized for 8 warps).
    """

    xp: Any = np
    ATTENTION_BLOCK = 128  # 4 warps, 16 token groups of 8 lanes: one 16-token KV block per round

    def __init__(self, block: int = 256, max_grid: int = 1024) -> None:
        if block < 1 or max_grid < 1:
            raise ValueError("block and max_grid must be positive")
        _check_threads(block)
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
        _check_threads(block)  # the CPU emulation would run it; a GPU refuses the launch
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

    def copy_blocks_in_order(self, cache, pairs: Iterable[tuple[int, int]], *, grid: int | None = None,
                             block: int | None = None) -> int:
        """Run an ordered copy list (the block manager's, chains allowed) as copy_blocks launches, one per wave
        of reference.copy_waves; on a GPU the launches share a stream, so they run in order. Returns the number of
        launches. Equals reference.copy_blocks_reference on the same list."""
        waves = reference.copy_waves(pairs)
        for wave in waves:
            self.copy_blocks(cache, wave, grid=grid, block=block)
        return len(waves)

    # -- attention -----------------------------------------------------------------------------------------------
    def _attention_shape(self, items: int, grid: int | None, block: int | None) -> tuple[int, int]:
        block = self.ATTENTION_BLOCK if block is None else block
        if block % 32 or not 32 <= block <= 256:
            raise ValueError(f"attention kernels need a block of 32-256 threads in whole warps, got {block}")
        grid = min(items, 2**31 - 1) if grid is None else grid
        if grid < 1:
            raise ValueError(f"grid must be positive, got {grid}")
        return grid, block

    def _attention_out(self, out, q):
        if out is None:
            return self.xp.empty(q.shape, dtype=self.xp.float32)
        if tuple(out.shape) != tuple(q.shape) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a contiguous float32 array shaped like q {tuple(q.shape)}")
        return out

    def prepare_paged_attention(self, q, kv_cache, block_tables, context_lens, scale: float, *, out=None,
                                grid: int | None = None, block: int | None = None) -> Callable[[], Any]:
        """Check the arguments and upload the metadata once; returns a function that launches the kernel and
        returns `out` (what a benchmark times: nothing but the launch). q and kv_cache live where the kernels
        run; block_tables and context_lens are host arrays (see reference.check_paged_attention)."""
        args = reference.check_paged_attention(q, kv_cache, block_tables, context_lens)
        assert args.block_tables is not None
        out = self._attention_out(out, q)
        tables, lens = self.to_device(args.block_tables), self.to_device(args.context_lens)
        shape = self._attention_shape(args.num_seqs * args.num_heads, grid, block)
        launch_args = [out, q, kv_cache, tables, lens, args.num_seqs, args.num_heads, args.num_kv_heads,
                       args.head_dim, args.block_size, args.block_tables.shape[1], float(scale)]

        def launch():
            self._launch("paged_attention", *shape, launch_args)
            return out

        return launch

    def paged_attention(self, q, kv_cache, block_tables, context_lens, scale: float, *, out=None,
                        grid: int | None = None, block: int | None = None):
        """Decode attention through block tables into `out` (new if None); see reference.paged_attention."""
        return self.prepare_paged_attention(q, kv_cache, block_tables, context_lens, scale, out=out, grid=grid,
                                            block=block)()

    def prepare_dense_attention(self, q, k, v, context_lens, scale: float, *, out=None, grid: int | None = None,
                                block: int | None = None) -> Callable[[], Any]:
        """As prepare_paged_attention, over contiguous k and v [num_seqs, max_len, kv_heads, head_dim]."""
        args = reference.check_dense_attention(q, k, v, context_lens)
        out = self._attention_out(out, q)
        lens = self.to_device(args.context_lens)
        shape = self._attention_shape(args.num_seqs * args.num_heads, grid, block)
        launch_args = [out, q, k, v, lens, args.num_seqs, args.num_heads, args.num_kv_heads, args.head_dim,
                       args.max_len, float(scale)]

        def launch():
            self._launch("dense_attention", *shape, launch_args)
            return out

        return launch

    def dense_attention(self, q, k, v, context_lens, scale: float, *, out=None, grid: int | None = None,
                        block: int | None = None):
        """Decode attention over contiguous K and V into `out` (new if None); see reference.dense_attention."""
        return self.prepare_dense_attention(q, k, v, context_lens, scale, out=out, grid=grid, block=block)()
