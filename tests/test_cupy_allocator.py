"""CuPy through minialloc: the wiring with a fake CuPy here, the real thing on a GPU."""

from __future__ import annotations

import contextlib
import gc
import sys
import types

import pytest

from minialloc import CachingAllocator, SimulatedGPU
from minialloc.cuda_device import cuda_unavailable_reason
from minialloc.cupy_allocator import Allocation, make_malloc, use


class FakeUnownedMemory:
    def __init__(self, ptr: int, size: int, owner: object, device_id: int = -1) -> None:
        if ptr == 0 and device_id < 0:
            raise RuntimeError("UnownedMemory requires explicit device ID for a null pointer.")
        self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


class FakeMemoryPointer:
    def __init__(self, mem: FakeUnownedMemory, offset: int) -> None:
        self.mem, self.ptr = mem, mem.ptr + offset


def fake_cupy() -> types.ModuleType:
    """The slice of CuPy's API that cupy_allocator uses, with a current stream and a thread-local allocator."""
    cupy = types.ModuleType("cupy")
    state = types.SimpleNamespace(stream=types.SimpleNamespace(ptr=0), allocator=None)

    @contextlib.contextmanager
    def using_allocator(fn):
        previous, state.allocator = state.allocator, fn
        try:
            yield
        finally:
            state.allocator = previous

    cupy.cuda = types.SimpleNamespace(
        UnownedMemory=FakeUnownedMemory, MemoryPointer=FakeMemoryPointer, using_allocator=using_allocator,
        get_current_stream=lambda: state.stream, alloc=lambda size: state.allocator(size), state=state,
    )
    return cupy


class StreamedGPU(SimulatedGPU):
    """A simulated GPU that maps CuPy streams to ids as CudaGPU does (ptr 0 is stream 0)."""

    def __init__(self, kind: str = "sim") -> None:
        super().__init__("1GiB")
        self.kind = kind
        self.ids: dict[int, int] = {0: 0}

    def stream_id(self, stream) -> int:
        return self.ids.setdefault(stream.ptr, len(self.ids))


def blocks(alloc: CachingAllocator) -> list[tuple[str, int, int]]:
    return [(b["state"], b["requested_size"], seg["stream"])
            for seg in alloc.snapshot()["segments"] for b in seg["blocks"] if b["state"] != "inactive"]


def test_use_refuses_the_simulator():
    with pytest.raises(RuntimeError, match="real GPU"), use(CachingAllocator(SimulatedGPU())):
        pass


def test_a_block_lives_as_long_as_cupy_holds_a_pointer_into_it():
    alloc = CachingAllocator(StreamedGPU())
    cupy = fake_cupy()
    malloc = make_malloc(alloc, cupy)
    mp = malloc(1000)
    assert isinstance(mp.mem._owner, Allocation) and mp.mem.size == 1000 and mp.mem.device_id == 0
    assert blocks(alloc) == [("active_allocated", 1000, 0)]
    view = FakeMemoryPointer(mp.mem, 100)  # an array view: same memory, another pointer
    # no gc.collect(): the block goes back the moment the last pointer does (reference counting, as CuPy's own
    # memory relies on), and a full collection cost a second per call late in a long test run
    del mp
    assert alloc.memory_allocated() == 1024
    del view
    assert alloc.memory_allocated() == 0 and blocks(alloc) == []
    alloc.check_invariants()


def test_blocks_follow_cupys_current_stream_and_size_zero_is_null():
    alloc = CachingAllocator(StreamedGPU())
    cupy = fake_cupy()
    malloc = make_malloc(alloc, cupy)
    cupy.cuda.state.stream = types.SimpleNamespace(ptr=0xBEEF)
    on_side = malloc(4096)
    assert blocks(alloc) == [("active_allocated", 4096, 1)]
    empty = malloc(0)
    assert empty.ptr == 0 and alloc.memory_allocated() == 4096
    del on_side, empty
    assert alloc.memory_allocated() == 0


def test_use_routes_cupy_allocations_inside_the_block_only(monkeypatch):
    cupy = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    alloc = CachingAllocator(StreamedGPU(kind="cuda"))
    with use(alloc):
        mp = cupy.cuda.alloc(2 << 20)
        assert alloc.memory_allocated() == 2 << 20
    assert cupy.cuda.state.allocator is None  # restored on exit
    del mp
    assert alloc.memory_allocated() == 0


@pytest.mark.skipif(cuda_unavailable_reason() is not None, reason="needs a CUDA GPU")
def test_cupy_arrays_live_in_minialloc_blocks_on_a_real_gpu():
    import cupy

    from minialloc.cuda_device import CudaGPU

    alloc = CachingAllocator(CudaGPU())
    with use(alloc):
        x = cupy.empty(3 << 20, cupy.uint8)
        x.fill(7)
    assert ("active_allocated", 3 << 20, 0) in blocks(alloc)
    assert x.data.ptr in {b["address"] for seg in alloc.snapshot()["segments"] for b in seg["blocks"]}
    assert int(x.sum()) == 7 * (3 << 20)
    del x
    gc.collect()
    assert alloc.memory_allocated() == 0 and alloc.memory_reserved() > 0  # cached, as PyTorch would
    alloc.empty_cache()
    assert alloc.memory_reserved() == 0
