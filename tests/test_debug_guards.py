"""Data mode of the simulated GPU (view, views, copy) and debug mode (guard bytes, zeroed and poisoned memory)."""

from __future__ import annotations

import numpy as np
import pytest

from minialloc import CachingAllocator, ConfigError, DeviceError, MiB, OutOfMemoryError, SimulatedGPU
from minialloc.debug import GUARD_BYTES, GUARD_PATTERN, Guards, GuardViolation, HostData, KernelData
from minialloc.device import DataGPU
from minialloc.kernels import reference
from minialloc.kernels.reference import POISON
from minialloc.sizes import PAGE_SIZE

GUARD = GUARD_PATTERN & 0xFF
POISON_BYTE = POISON & 0xFF


# -- data mode -------------------------------------------------------------------------------------------------------
def test_data_mode_is_a_simulated_gpu_of_limited_capacity():
    with pytest.raises(ValueError, match=r"store_data=True .* limited to 1024.00 MiB"):
        SimulatedGPU("2GiB", store_data=True)
    gpu = SimulatedGPU("1GiB", store_data=True)
    assert isinstance(gpu, DataGPU) and isinstance(gpu, SimulatedGPU) and gpu.store_data
    assert gpu.total_memory == 1024 * MiB and "store_data=True" in repr(gpu)
    plain = SimulatedGPU("8GiB")
    assert type(plain) is SimulatedGPU and not hasattr(plain, "view")  # accounting only: no bytes at all


def test_view_of_malloced_memory():
    gpu = SimulatedGPU("64MiB", store_data=True)
    p, q = gpu.malloc(PAGE_SIZE), gpu.malloc(PAGE_SIZE)
    assert q == p + PAGE_SIZE  # adjacent addresses, yet one view never spans two allocations
    v = gpu.view(p + 10, 100)
    assert v.dtype == np.uint8 and v.size == 100 and not v.any()  # fresh memory reads as zeros
    v[:] = 7
    assert (gpu.view(p, 110)[10:] == 7).all()  # a view, not a copy
    assert gpu.view(p + PAGE_SIZE - 1, 1).size == 1 and gpu.view(p, 0).size == 0
    with pytest.raises(DeviceError, match="runs past the end of the allocation"):
        gpu.view(p + PAGE_SIZE - 1, 2)
    with pytest.raises(DeviceError, match="not device memory"):
        gpu.view(p - 1, 1)
    gpu.free(p)
    with pytest.raises(DeviceError, match="not device memory"):
        gpu.view(p, 1)
    assert gpu.view(q, 1).size == 1
    with pytest.raises(TypeError):
        gpu.view(float(q), 1)
    with pytest.raises(ValueError):
        gpu.view(q, -1)


def test_view_resolves_virtual_addresses_through_the_mapping():
    gpu = SimulatedGPU("64MiB", store_data=True)
    va = gpu.mem_address_reserve(4 * PAGE_SIZE)
    h2 = gpu.mem_create(2 * PAGE_SIZE)  # one handle over two pages: one piece
    h1 = gpu.mem_create(PAGE_SIZE)
    gpu.mem_map(va, 2 * PAGE_SIZE, 0, h2)
    gpu.mem_map(va + 2 * PAGE_SIZE, PAGE_SIZE, 0, h1)
    with pytest.raises(DeviceError, match="not accessible"):
        gpu.view(va, 1)
    gpu.mem_set_access(va, 3 * PAGE_SIZE)
    assert gpu.view(va + PAGE_SIZE - 8, 16).size == 16  # across a page boundary of one handle
    pieces = gpu.views(va + 2 * PAGE_SIZE - 8, 16)  # across two handles
    assert [p.size for p in pieces] == [8, 8]
    with pytest.raises(DeviceError, match="spans 2 physical allocations"):
        gpu.view(va + 2 * PAGE_SIZE - 8, 16)
    with pytest.raises(DeviceError, match="not mapped"):
        gpu.views(va + 3 * PAGE_SIZE - 8, 16)  # into the unmapped fourth page
    # the bytes belong to the physical handle: unmapped and mapped elsewhere, they come along
    gpu.view(va + 2 * PAGE_SIZE + 5, 1)[0] = 42
    gpu.mem_unmap(va + 2 * PAGE_SIZE, PAGE_SIZE)
    gpu.mem_map(va + 3 * PAGE_SIZE, PAGE_SIZE, 0, h1)
    gpu.mem_set_access(va + 3 * PAGE_SIZE, PAGE_SIZE)
    assert gpu.view(va + 3 * PAGE_SIZE + 5, 1)[0] == 42
    with pytest.raises(DeviceError, match="not mapped"):
        gpu.view(va + 2 * PAGE_SIZE + 5, 1)


@pytest.mark.parametrize("dst, src", [(0, 100), (100, 0), (0, 5000), (3, 3)])
def test_copy_is_memmove(dst, src):
    gpu = SimulatedGPU("16MiB", store_data=True)
    p = gpu.malloc(PAGE_SIZE)
    rng = np.random.default_rng(0)
    gpu.view(p, PAGE_SIZE)[:] = rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8)
    expected = gpu.view(p, PAGE_SIZE).copy()
    expected[dst : dst + 4096] = expected[src : src + 4096].copy()
    gpu.copy(p + dst, p + src, 4096)
    assert (gpu.view(p, PAGE_SIZE) == expected).all()


def test_copy_between_allocations_and_handles():
    gpu = SimulatedGPU("16MiB", store_data=True)
    p, q = gpu.malloc(PAGE_SIZE), gpu.malloc(PAGE_SIZE)
    gpu.view(p, 10)[:] = np.arange(10)
    gpu.copy(q + 1, p, 10)
    assert list(gpu.view(q, 11)) == [0, *range(10)]
    va = gpu.mem_address_reserve(2 * PAGE_SIZE)
    for i in range(2):
        gpu.mem_map(va + i * PAGE_SIZE, PAGE_SIZE, 0, gpu.mem_create(PAGE_SIZE))
    gpu.mem_set_access(va, 2 * PAGE_SIZE)
    gpu.copy(va + PAGE_SIZE - 4, p, 10)  # into two handles
    assert list(np.concatenate(gpu.views(va + PAGE_SIZE - 4, 10))) == list(range(10))
    gpu.copy(va + PAGE_SIZE - 2, va + PAGE_SIZE - 4, 10)  # overlapping, across the handles
    assert list(np.concatenate(gpu.views(va + PAGE_SIZE - 4, 12))) == [0, 1, *range(10)]


def test_host_data_fills_over_pieces_as_one_fill():
    """A fill split across handles keeps the pattern's phase: the bytes equal one fill of the whole range."""
    gpu = SimulatedGPU("16MiB", store_data=True)
    va = gpu.mem_address_reserve(2 * PAGE_SIZE)
    for i in range(2):
        gpu.mem_map(va + i * PAGE_SIZE, PAGE_SIZE, 0, gpu.mem_create(PAGE_SIZE))
    gpu.mem_set_access(va, 2 * PAGE_SIZE)
    data = HostData(gpu)
    start, n, pattern = va + PAGE_SIZE - 7, 20, 0x04030201
    data.fill(start, n, pattern)
    expected = np.zeros(n, np.uint8)
    reference.fill(expected, 0, n, pattern)
    assert (data.read(start, n) == expected).all()
    assert data.guard_check(start, n, pattern) == -1
    gpu.views(start, n)[1][3] ^= 1  # byte 7 + 3 of the range, in the second handle
    assert data.guard_check(start, n, pattern) == 10


# -- debug guards ----------------------------------------------------------------------------------------------------
def guarded(capacity: str = "64MiB", config: str = "") -> tuple[SimulatedGPU, CachingAllocator]:
    gpu = SimulatedGPU(capacity, store_data=True)
    return gpu, CachingAllocator(gpu, ",".join(filter(None, ["debug_guards:True", config])))


def test_debug_guards_need_data():
    with pytest.raises(ConfigError, match=r"store_data=True.*or a real GPU"):
        CachingAllocator(SimulatedGPU("8GiB"), "debug_guards:True")
    a = CachingAllocator(SimulatedGPU("8GiB"), "")
    with pytest.raises(ConfigError, match="store_data=True"):
        a.set_allocator_settings("debug_guards:True")
    assert not a.config.debug_guards and "malloc" not in a.__dict__  # the refusal changed nothing


def test_new_memory_is_zeroed_and_guarded():
    gpu, a = guarded()
    p = a.malloc(1000)
    v = gpu.view(p, 1000 + GUARD_BYTES)
    assert not v[:1000].any() and (v[1000:] == GUARD).all()
    v[:1000] = 0x55
    a.free(p)
    q = a.malloc(1000)
    assert q == p and not gpu.view(q, 1000).any()  # the same block again, zeroed


def test_requested_bytes_stay_the_programs():
    gpu, a = guarded()
    a.record_memory_history()  # history is off until asked, as in PyTorch
    p = a.malloc(512)
    stats = a.memory_stats()
    assert stats["requested_bytes.all.current"] == 512
    assert stats["allocated_bytes.all.current"] == 1024  # 512 + 64 guard bytes, rounded to 512
    snap = a.snapshot()
    assert [b["requested_size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"] \
        == [512]
    assert [t["size"] for t in snap["device_traces"][0] if t["action"] == "alloc"] == [512]
    a.free(p)
    assert a.memory_stats()["requested_bytes.all.current"] == 0
    a.check_invariants()


@pytest.mark.parametrize("past_end", [0, 1, 17, GUARD_BYTES - 1])
def test_write_past_the_end_is_reported_at_free(past_end):
    gpu, a = guarded()
    keep = a.malloc(3000)
    p = a.malloc(1000)
    gpu.view(p, 1000)[:] = 0xAB  # exactly the requested bytes: fine
    gpu.view(p + 1000 + past_end, 1)[0] = 0x41
    with pytest.raises(GuardViolation) as info:
        a.free(p)
    e = info.value
    assert (e.ptr, e.requested_size, e.offset, e.found) == (p, 1000, 1000 + past_end, 0x41)
    assert f"{p:#x}" in str(e) and "1000 bytes requested" in str(e) and f"offset {1000 + past_end}" in str(e)
    # the free itself completed: the block is back in the pool, poisoned, and the bookkeeping is whole
    assert a.memory_allocated() == a._active[keep].size and p not in a._active
    assert (gpu.view(p, 1024) == POISON_BYTE).all()
    a.check_invariants()
    with pytest.raises(ValueError, match="already freed"):
        a.free(p)


def test_exact_size_writes_are_no_violation():
    gpu, a = guarded()
    rng = np.random.default_rng(1)
    for size in (1, 511, 512, 513, 4096, 3 * MiB + 5):
        p = a.malloc(size)
        gpu.view(p, size)[:] = rng.integers(0, 256, size, dtype=np.uint8)
        a.free(p)
    a.check_invariants()


def test_freed_memory_is_poisoned():
    gpu, a = guarded()
    p = a.malloc(2 * MiB + 100)  # large pool, rounded size includes slack past the guard
    size = a._active[p].size
    gpu.view(p, 2 * MiB + 100)[:] = 1
    a.free(p)
    assert (gpu.view(p, size) == POISON_BYTE).all()


def test_poison_waits_for_other_streams():
    """A block used on another stream is poisoned only when that stream's work is done, not at free."""
    gpu, a = guarded()
    p = a.malloc(4096)
    gpu.view(p, 4096)[:] = 9
    a.record_stream(p, 1)
    a.free(p)
    assert (gpu.view(p, 4096) == 9).all()  # stream 1 may still read it
    gpu.synchronize(1)
    a.process_events()
    assert (gpu.view(p, 4096) == POISON_BYTE).all()
    a.check_invariants()


def test_guards_in_expandable_segments_across_pages():
    """The guard of a block that ends on a page boundary lies on two physical handles."""
    gpu, a = guarded("128MiB", "expandable_segments:True")
    first = a.malloc(15 * MiB)
    # the next block starts right after the first; its guard starts 30 bytes before the 20 MiB page boundary
    size = 20 * MiB - 30 - a._active[first].size
    p = a.malloc(size)
    assert p == first + a._active[first].size
    assert len(gpu.views(p + size, GUARD_BYTES)) == 2
    assert (np.concatenate(gpu.views(p + size, GUARD_BYTES)) == GUARD).all()
    gpu.views(p + size, GUARD_BYTES)[1][5] = 0
    with pytest.raises(GuardViolation) as info:
        a.free(p)
    assert info.value.offset == size + 30 + 5
    a.check_invariants()


def test_out_of_memory_reports_the_programs_size():
    gpu, a = guarded("16MiB")
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(100 * MiB)
    assert info.value.report.requested_size == 100 * MiB


def test_switching_debug_guards_at_runtime():
    gpu = SimulatedGPU("64MiB", store_data=True)
    a = CachingAllocator(gpu, "")
    assert not {"malloc", "free", "_alloc_found_block", "_free_block"} & set(a.__dict__)  # nothing on the hot path
    old = a.malloc(1000)  # no guard
    a.set_allocator_settings("debug_guards:True")
    new = a.malloc(1000)
    gpu.view(old + 1000, 1)[0] = 1  # not a guard: nothing to report
    a.free(old)
    gpu.view(new + 1000, 1)[0] = 1
    with pytest.raises(GuardViolation):
        a.free(new)
    a.set_allocator_settings("debug_guards:False")
    assert not set(a.__dict__) & {"malloc", "free", "_alloc_found_block", "_free_block"}
    assert a._active[a.malloc(1024)].size == 1024  # no guard any more
    a.check_invariants()


# -- the GPU's code path, on the CPU -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulated():
    from minialloc.kernels.emulation import EmulatedKernels, EmulationUnavailable

    try:
        return EmulatedKernels.build()
    except EmulationUnavailable as e:
        pytest.skip(str(e))


def test_kernel_data_runs_the_guards_through_the_cuda_kernels(emulated, monkeypatch):
    """KernelData is what a CudaGPU gets; here its kernels are the .cu sources compiled for the CPU, and its
    arrays views of the simulator's bytes."""
    gpu = SimulatedGPU("64MiB", store_data=True)
    monkeypatch.setattr(gpu, "data", lambda: KernelData(gpu.view, lambda stream: emulated))  # what CudaGPU.data is
    a = CachingAllocator(gpu, "debug_guards:True")
    guards = a.find_extension(Guards)
    assert guards is not None and isinstance(guards.data, KernelData)
    p = a.malloc(1000)
    assert not gpu.view(p, 1000).any() and (gpu.view(p + 1000, GUARD_BYTES) == GUARD).all()
    gpu.view(p + 1003, 1)[0] = 0
    with pytest.raises(GuardViolation) as info:
        a.free(p)
    assert (info.value.offset, info.value.found) == (1003, 0)
    assert (gpu.view(p, 1024) == POISON_BYTE).all()
    data = guards.data
    data.write(p + 8, np.arange(100, dtype=np.uint8))
    data.move(p + 3, p + 8, 100)  # overlapping: move_plan's block_copy launches
    assert list(data.read(p + 3, 100)) == list(range(100))
