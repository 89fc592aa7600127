"""Let CuPy allocate through minialloc: every cupy array made inside `use(allocator)` lives in its blocks.

    gpu = CudaGPU()
    alloc = CachingAllocator(gpu)
    with use(alloc):
        x = cupy.empty(1 << 20, cupy.uint8)     # a block of alloc; it shows in alloc.snapshot()
    del x                                      # the block goes back to alloc's cache

CuPy asks its current allocator for `size` bytes and wants a MemoryPointer back. We hand it
MemoryPointer(UnownedMemory(ptr, size, owner), 0): memory CuPy does not own, kept alive by `owner`. The owner is
a small object whose finalizer frees the block, so the block returns to minialloc exactly when CuPy drops the
last array, view or pointer into it. The block is taken on the minialloc stream of CuPy's current stream, so
freed blocks are reused in stream order, as PyTorch's allocator does.

This needs a real GPU: on the simulator an address is only a number, and a cupy array there would crash.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Allocation:
    """The owner of one block handed to CuPy; collecting it frees the block (its finalizer)."""

    __slots__ = ("ptr", "size", "stream", "__weakref__")

    def __init__(self, ptr: int, size: int, stream: int) -> None:
        self.ptr = ptr
        self.size = size
        self.stream = stream

    def __repr__(self) -> str:
        return f"Allocation({self.ptr:#x}, {self.size}, stream={self.stream})"


def make_malloc(allocator: Any, cupy: Any) -> Callable[[int], Any]:
    """The function CuPy calls: size -> MemoryPointer into a block of `allocator` (freed when CuPy lets go)."""
    device = allocator.device

    def malloc(size: int) -> Any:
        stream = device.stream_id(cupy.cuda.get_current_stream())
        # A garbage collection inside malloc could run a finalizer below, and so allocator.free, in the middle of
        # malloc's bookkeeping (the lock is re-entrant): keep the collector off meanwhile, as CuPy's pool does.
        collecting = gc.isenabled()
        gc.disable()
        try:
            ptr = allocator.malloc(size, stream)
        finally:
            if collecting:
                gc.enable()
        owner = Allocation(ptr, size, stream)
        if ptr:  # size 0 gets the null pointer, which is never freed
            # atexit=False: at interpreter exit the GPU may already be gone; the driver reclaims everything then
            weakref.finalize(owner, allocator.free, ptr).atexit = False
        memory = cupy.cuda.UnownedMemory(ptr, size, owner, device.index)
        return cupy.cuda.MemoryPointer(memory, 0)

    return malloc


def as_cupy_array(ptr: int, nbytes: int, device_index: int = 0, owner: Any = None) -> Any:
    """A 1-D uint8 cupy array over raw device memory [ptr, ptr + nbytes), kept alive by `owner` (not freed)."""
    import cupy

    memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_index)
    return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))


@contextmanager
def use(allocator: Any) -> Iterator[Callable[[int], Any]]:
    """Route CuPy's allocations in this thread through `allocator` (a CachingAllocator over a CudaGPU)."""
    device = allocator.device
    if getattr(device, "kind", None) != "cuda":
        raise RuntimeError(
            f"minialloc.cupy_allocator.use needs an allocator on a real GPU (CudaGPU), but this one runs on "
            f"{device!r}, whose addresses hold no memory: CuPy arrays cannot live there. "
            "Use minialloc.cuda_device.CudaGPU() on a machine with a CUDA GPU."
        )
    import cupy

    malloc = make_malloc(allocator, cupy)
    with cupy.cuda.using_allocator(malloc):
        yield malloc
