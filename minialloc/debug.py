"""Debug mode (debug_guards:True): guard bytes after every block, zeroed new memory, poisoned freed memory.

A write past the end of a block lands in someone else's memory and shows up much later, far from the bug. Debug
mode makes it show up at the free of the block that overflowed:

- malloc(n) asks for n + GUARD_BYTES (64) bytes before rounding, zeroes the n bytes the caller gets and fills the
  64 after them with GUARD_PATTERN (0xFD bytes, as MSVC's debug heap marks its "no man's land");
- free checks those 64 bytes (the guard_check kernel) and raises GuardViolation with the block's address, the
  requested size and the first bad offset, after the free itself has completed, so the allocator stays consistent;
- a block going back to the pool is filled with POISON (0xDB bytes), so a use after free reads garbage that is
  easy to recognise instead of plausible old data.

The statistics stay those of the program: requested_bytes counts n, not n + 64; allocated and reserved bytes do
include the guards, since they occupy the device. A block allocated before debug_guards was switched on has no
guard and is not checked.

Debug mode needs bytes behind the addresses: a SimulatedGPU(store_data=True), where the kernels' NumPy twins run
on host buffers, or a real GPU (CudaGPU), where the CUDA kernels run. DeviceData (HostData or KernelData, chosen by
device_data()) is that access: fill, guard_check, move, read and write on device addresses; compaction uses it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import ConfigError
from .kernels import reference
from .kernels.reference import POISON, ZERO
from .oom import OutOfMemoryError

if TYPE_CHECKING:
    from .allocator import Block, BlockPool, CachingAllocator

GUARD_BYTES = 64  # after every block; a multiple of 4, so the pattern's phase is the same in every guard
GUARD_PATTERN = 0xFDFDFDFD


class GuardViolation(ValueError):
    """A write past the end of a block, found at its free: `ptr`, `requested_size` and `offset` (from the block's
    start) of the first guard byte that changed, and `found`, the byte there."""

    def __init__(self, ptr: int, requested_size: int, offset: int, found: int) -> None:
        super().__init__(
            f"free({ptr:#x}): a write past the end of the block at {ptr:#x} ({requested_size} bytes requested): "
            f"guard byte at offset {offset} (end + {offset - requested_size}) is {found:#04x}, expected "
            f"{GUARD_PATTERN & 0xFF:#04x}. The block has been freed and poisoned."
        )
        self.ptr, self.requested_size, self.offset, self.found = ptr, requested_size, offset, found


def _rotate(pattern: int, k: int) -> int:
    """The pattern as seen from byte k of a fill: so a fill split into pieces writes the same bytes as one fill."""
    r = 8 * (k % 4)
    return ((pattern >> r) | (pattern << (32 - r))) & 0xFFFFFFFF


class HostData:
    """Device bytes of a SimulatedGPU(store_data=True), worked on by the kernels' NumPy twins.

    A range of an expandable segment may lie on several physical handles: each operation walks the pieces."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def fill(self, ptr: int, nbytes: int, pattern: int, stream: int = 0) -> None:
        done = 0
        for piece in self.device.views(ptr, nbytes):
            if pattern == _rotate(pattern, 1):
                piece.fill(pattern & 0xFF)  # four equal bytes (all of debug mode's): reference.fill, minus np.resize
            else:
                reference.fill(piece, 0, piece.size, _rotate(pattern, done))
            done += piece.size

    def guard_check(self, ptr: int, nbytes: int, pattern: int, stream: int = 0) -> int:
        done = 0
        for piece in self.device.views(ptr, nbytes):
            bad = reference.guard_check(piece, 0, piece.size, _rotate(pattern, done))
            if bad >= 0:
                return done + bad
            done += piece.size
        return -1

    def move(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None:
        self.device.copy(dst, src, nbytes)

    def read(self, ptr: int, nbytes: int, stream: int = 0) -> np.ndarray:
        return np.concatenate(self.device.views(ptr, nbytes))

    def write(self, ptr: int, data: np.ndarray, stream: int = 0) -> None:
        done = 0
        for piece in self.device.views(ptr, data.size):
            piece[:] = data[done : done + piece.size]
            done += piece.size


class KernelData:
    """Device bytes the CUDA kernels reach: `array(ptr, nbytes)` is an array over device memory, `kernels(stream)`
    launches on that stream (minialloc.kernels.launch.Kernels). Launches on a block's stream are ordered after the
    program's own work there, so moving or filling a block needs no synchronization; guard_check and read wait."""

    def __init__(self, array: Callable[[int, int], Any], kernels: Callable[[int], Any],
                 context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
        self.array = array
        self.kernels = kernels
        self.context = context

    @classmethod
    def for_cuda(cls, device: Any) -> KernelData:
        """CudaGPU: cupy arrays over raw addresses, CupyKernels on the device's streams."""
        import cupy

        from .cupy_allocator import as_cupy_array

        return cls(lambda ptr, n: as_cupy_array(ptr, n, device.index), device.kernels,
                   lambda: cupy.cuda.Device(device.index))

    def fill(self, ptr: int, nbytes: int, pattern: int, stream: int = 0) -> None:
        with self.context():
            self.kernels(stream).fill(self.array(ptr, nbytes), 0, nbytes, pattern)

    def guard_check(self, ptr: int, nbytes: int, pattern: int, stream: int = 0) -> int:
        with self.context():
            return self.kernels(stream).guard_check(self.array(ptr, nbytes), 0, nbytes, pattern)

    def move(self, dst: int, src: int, nbytes: int, stream: int = 0) -> None:
        """memmove: block_copy launches, split by move_plan when the ranges overlap."""
        with self.context():
            k = self.kernels(stream)
            if reference.ranges_overlap(dst, src, nbytes):
                lo = min(dst, src)
                k.move(self.array(lo, max(dst, src) + nbytes - lo), dst - lo, src - lo, nbytes)
            elif nbytes:
                k.block_copy(self.array(dst, nbytes), 0, self.array(src, nbytes), 0, nbytes)

    def read(self, ptr: int, nbytes: int, stream: int = 0) -> np.ndarray:
        with self.context():
            return np.array(self.kernels(stream).to_host(self.array(ptr, nbytes)), dtype=np.uint8)

    def write(self, ptr: int, data: np.ndarray, stream: int = 0) -> None:
        with self.context():
            k = self.kernels(stream)
            # block_copy from a device copy of the data: ordered on the stream like every other launch
            k.block_copy(self.array(ptr, data.size), 0, k.to_device(data), 0, data.size)
            k.synchronize()  # the staging copy must outlive the launch


DeviceData = HostData | KernelData


def device_data(device: Any) -> DeviceData | None:
    """How to reach the bytes of `device`'s memory; None for an accounting-only SimulatedGPU."""
    if getattr(device, "store_data", False):
        return HostData(device)
    if getattr(device, "kind", None) == "cuda":
        return KernelData.for_cuda(device)
    return None


class Guards:
    """debug_guards for one allocator: its malloc, _alloc_found_block and _free_block while debug mode is on
    (CachingAllocator binds them on the instance, so the default path runs no debug code at all)."""

    def __init__(self, allocator: CachingAllocator) -> None:
        data = device_data(allocator.device)
        if data is None:
            raise ConfigError(
                f"debug_guards:True needs memory with data behind it, but {allocator.device!r} is accounting only: "
                "use SimulatedGPU(capacity, store_data=True) (up to 1 GiB) or a real GPU (CudaGPU)"
            )
        self.allocator = allocator
        self.data = data
        self.guarded: set[Block] = set()  # live blocks that have a guard

    def malloc(self, size: int, stream: int = 0) -> int:
        a = self.allocator
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            return type(a).malloc(a, size, stream)  # its checks raise, or it returns the null pointer
        with a._lock:
            try:
                ptr = type(a).malloc(a, size + GUARD_BYTES, stream)
            except OutOfMemoryError as e:
                raise OutOfMemoryError(dataclasses.replace(e.report, requested_size=size)) from None
            block = a._active[ptr]
            self.guarded.add(block)
            self.data.fill(ptr, size, ZERO, stream)
            self.data.fill(ptr + size, GUARD_BYTES, GUARD_PATTERN, stream)
            return ptr

    def alloc_found_block(self, block: Block, pool: BlockPool, size: int, orig_size: int, stream: int,
                          split: bool) -> int:
        # every malloc comes through Guards.malloc, which added the guard: the program asked for that much less
        return type(self.allocator)._alloc_found_block(self.allocator, block, pool, size, orig_size - GUARD_BYTES,
                                                       stream, split)

    def check(self, block: Block) -> GuardViolation | None:
        """At free: the block's guard, if it has one, must be intact."""
        if block not in self.guarded:
            return None
        self.guarded.discard(block)
        end = block.requested_size
        bad = self.data.guard_check(block.ptr + end, GUARD_BYTES, GUARD_PATTERN, block.stream)
        if bad < 0:
            return None
        found = int(self.data.read(block.ptr + end + bad, 1, block.stream)[0])
        return GuardViolation(block.ptr, end, end + bad, found)

    def free_block(self, block: Block) -> None:
        """Poison a block as it goes back to the pool (after any other stream's use of it has completed)."""
        self.data.fill(block.ptr, block.size, POISON, block.stream)
        type(self.allocator)._free_block(self.allocator, block)
