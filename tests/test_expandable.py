"""Expandable segments: the driver's virtual memory rules, PyTorch's expandable policy, and the canonical scenario."""

from __future__ import annotations

import pytest

from minialloc import CachingAllocator, DeviceError, DeviceOutOfMemory, MiB, OutOfMemoryError, SimulatedGPU
from minialloc.replay import replay
from minialloc.workloads import CANONICAL_CAPACITY, canonical_scenario

GiB = 1024 * MiB


# -- the simulated driver's virtual memory API ----------------------------------------------------------------
def test_vmm_map_unmap_and_capacity_counts_physical_pages_only():
    gpu = SimulatedGPU("64MiB")
    assert gpu.mem_get_allocation_granularity() == 2 * MiB
    va = gpu.mem_address_reserve(1 * GiB)  # address space is plentiful: far more than capacity
    assert gpu.mem_get_info()[0] == 64 * MiB
    h = gpu.mem_create(4 * MiB)
    assert gpu.mem_get_info()[0] == 60 * MiB
    gpu.mem_map(va + 10 * MiB, 4 * MiB, 0, h)
    gpu.mem_set_access(va + 10 * MiB, 4 * MiB)
    assert gpu.is_accessible(va + 12 * MiB) and gpu.mapped_pages == 2
    gpu.mem_unmap(va + 10 * MiB, 4 * MiB)
    gpu.mem_release(h)
    gpu.mem_address_free(va, 1 * GiB)
    assert gpu.mem_get_info()[0] == 64 * MiB


def test_vmm_misuse_is_an_error_as_in_the_driver():
    gpu = SimulatedGPU("64MiB")
    va = gpu.mem_address_reserve(32 * MiB)
    h = gpu.mem_create(4 * MiB)
    with pytest.raises(DeviceError, match="multiple of the granularity"):
        gpu.mem_create(3 * MiB)
    with pytest.raises(DeviceError, match="multiples of the granularity"):
        gpu.mem_map(va + MiB, 2 * MiB, 0, h)
    gpu.mem_map(va, 4 * MiB, 0, h)
    with pytest.raises(DeviceError, match="already mapped"):
        gpu.mem_map(va + 2 * MiB, 2 * MiB, 2 * MiB, h)
    with pytest.raises(DeviceError, match="not entirely mapped"):
        gpu.mem_unmap(va + 4 * MiB, 2 * MiB)
    with pytest.raises(DeviceError, match="not entirely mapped"):
        gpu.mem_set_access(va, 6 * MiB)
    with pytest.raises(DeviceError, match="not inside a reserved"):
        gpu.mem_map(va + 40 * MiB, 2 * MiB, 0, gpu.mem_create(2 * MiB))
    with pytest.raises(DeviceError, match="still mapped"):
        gpu.mem_release(h)
    with pytest.raises(DeviceError, match="still mapped"):
        gpu.mem_address_free(va, 32 * MiB)
    with pytest.raises(DeviceError, match="exceeds the handle"):
        gpu.mem_map(va + 8 * MiB, 4 * MiB, 2 * MiB, h)
    with pytest.raises(DeviceOutOfMemory):
        gpu.mem_create(64 * MiB)


# -- expandable_segments:True, as PyTorch does it --------------------------------------------------------------
def test_large_request_maps_one_20mib_page_in_a_reserved_range():
    gpu = SimulatedGPU("8GiB")
    a = CachingAllocator(gpu, "expandable_segments:True")
    a.record_memory_history()  # history is off until asked, as in PyTorch
    a.malloc(3 * MiB)
    stats = a.memory_stats()
    assert a.memory_reserved() == 20 * MiB == gpu.used_bytes
    assert stats["num_device_alloc"] == 1 and stats["segment.all.current"] == 0  # a map is not a segment
    (es,) = a.expandable_segments
    assert es.page_size == 20 * MiB and es.size >= 9 * GiB  # 1 1/8 of the device, in pages
    (seg,) = a.snapshot()["segments"]
    assert seg["is_expandable"] and seg["total_size"] == 20 * MiB
    actions = [e["action"] for e in a.snapshot()["device_traces"][0]]
    assert actions[:2] == ["segment_map", "alloc"]


def test_small_pool_uses_2mib_pages_and_streams_get_their_own_segment():
    a = CachingAllocator(SimulatedGPU("8GiB"), "expandable_segments:True")
    a.malloc(512)
    a.malloc(512, stream=1)
    a.malloc(30 * MiB)
    pages = sorted((es.stream, es.page_size) for es in a.expandable_segments)
    assert pages == [(0, 2 * MiB), (0, 20 * MiB), (1, 2 * MiB)]
    assert a.memory_reserved() == 2 * MiB + 2 * MiB + 40 * MiB


def test_segment_grows_contiguously_and_splitting_is_always_allowed():
    a = CachingAllocator(SimulatedGPU("8GiB"), "expandable_segments:True")
    p = a.malloc(30 * MiB)
    q = a.malloc(30 * MiB)
    assert q == p + 30 * MiB  # the same range, right after: no new segment
    assert len(a.expandable_segments) == 1 and a.memory_reserved() == 60 * MiB


def test_empty_cache_unmaps_every_wholly_free_page_wherever_it_sits():
    gpu = SimulatedGPU("8GiB")
    a = CachingAllocator(gpu, "expandable_segments:True")
    a.record_memory_history()
    p, q, r = a.malloc(100 * MiB), a.malloc(100 * MiB), a.malloc(100 * MiB)
    a.free(q)  # a hole in the middle of the range
    a.empty_cache()
    assert a.memory_reserved() == 200 * MiB == gpu.used_bytes
    unmaps = [e for e in a.snapshot()["device_traces"][0] if e["action"] == "segment_unmap"]
    assert [(e["addr"], e["size"]) for e in unmaps] == [(q, 100 * MiB)]
    assert len(a.snapshot()["segments"]) == 2  # each mapped range is reported as a segment
    a.free(p)
    a.free(r)
    a.empty_cache()
    assert a.memory_reserved() == 0 and gpu.used_bytes == 0 and a.expandable_segments == []


def test_a_new_segment_when_no_segment_has_contiguous_address_space():
    gpu = SimulatedGPU("100MiB")
    a = CachingAllocator(gpu, "expandable_segments:True")
    p = a.malloc(40 * MiB)
    a.malloc(40 * MiB)
    a.free(p)
    a.empty_cache()  # unmaps p's two pages: a 40 MiB hole before a live block
    a.malloc(50 * MiB)  # neither the hole nor the 40 MiB of address space left at the end is enough
    assert len(a.expandable_segments) == 2 and a.memory_reserved() == 100 * MiB


def test_switching_the_flag_at_runtime():
    a = CachingAllocator(SimulatedGPU("8GiB"), "expandable_segments:True")
    p = a.malloc(30 * MiB)
    a.set_allocator_settings("expandable_segments:False")
    q = a.malloc(30 * MiB)
    a.free(p)
    r = a.malloc(30 * MiB)  # the cached expandable block is not used while the flag is off
    assert r != p
    stats = a.memory_stats()
    assert stats["segment.all.current"] == 2 and len(a.expandable_segments) == 1
    a.set_allocator_settings("expandable_segments:True")
    assert a.malloc(30 * MiB) == p
    for x in (q, r, p):
        a.free(x)
    a.empty_cache()
    assert a.memory_reserved() == 0
    assert a.snapshot()["allocator_settings"]["expandable_segments"] is True


# -- the canonical scenario: "5 GB free, can't allocate 2 GB" ---------------------------------------------------
def test_canonical_scenario_fails_natively_with_over_4gib_free():
    gpu = SimulatedGPU(CANONICAL_CAPACITY)
    a = CachingAllocator(gpu, "")
    events = canonical_scenario()
    replay(events[:-1], a)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(events[-1].size)
    r = e.value.report
    stats = a.memory_stats()
    free, total = gpu.mem_get_info()
    # every number in the message is the allocator's or the device's at that moment
    assert (r.allocated, r.reserved) == (stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"])
    assert (r.device_free, r.total_capacity) == (free, total)
    assert r.alloc_size == 2 * GiB and r.device_free < 2 * GiB
    assert r.device_free + r.reserved_unallocated >= 4 * GiB  # about 5 GB free, in pieces
    assert r.largest_free_block < 2 * GiB and r.fragmentation > 0.5
    assert r.expandable_would_help and "expandable_segments:True" in str(e.value)
    assert "Tried to allocate 2.00 GiB" in str(e.value)
    assert "3.24 GiB is reserved by PyTorch but unallocated" in str(e.value)  # PyTorch 2.13's words
    assert str(e.value).endswith("\nminialloc: the largest free block is 1.44 GiB of 4.68 GiB free in all "
                                 "(fragmentation 0.69).")
    a.empty_cache()  # cannot help: every segment holds a live block
    with pytest.raises(OutOfMemoryError):
        a.malloc(events[-1].size)
    assert stats["num_device_free"] == a.memory_stats()["num_device_free"]


def test_canonical_scenario_succeeds_with_expandable_segments():
    gpu = SimulatedGPU(CANONICAL_CAPACITY)
    a = CachingAllocator(gpu, "expandable_segments:True")
    a.record_memory_history()
    result = replay(canonical_scenario(), a)
    assert result.ooms == 0
    trace = a.snapshot()["device_traces"][0]
    assert any(e["action"] == "segment_unmap" for e in trace)  # the holes went back to the device
    a.check_invariants()
    assert a.memory_reserved() == gpu.used_bytes


def test_expandable_hint_even_when_it_is_already_on():
    # PyTorch 2.13 prints the hint on every OOM, whatever the setting (pytorch#173049); so does minialloc.
    # Whether it would help is the report's expandable_would_help, not the message's.
    a = CachingAllocator(SimulatedGPU("1GiB"), "expandable_segments:True")
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(2 * GiB)
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in str(e.value)
    assert not e.value.report.expandable_would_help
