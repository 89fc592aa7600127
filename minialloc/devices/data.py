"""Device bytes: how debug guards and compaction fill, check, move, read and write memory at device addresses.

`device.data()` gives the right one, so no caller asks what kind of device it has:
- HostData: a SimulatedGPU(store_data=True) (a DataGPU), whose bytes are host NumPy arrays worked on by the
  kernels' NumPy twins (minialloc.kernels.reference);
- KernelData: a real GPU (CudaGPU), where the CUDA kernels launch on the block's stream;
- None: an accounting-only SimulatedGPU, which has no bytes at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels import reference


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

        from ..cupy_allocator import as_cupy_array

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
