"""Property tests: random traces of malloc / free / record_stream / synchronize / empty_cache keep every invariant."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minialloc import CachingAllocator, MiB, OutOfMemoryError, SimulatedGPU

CONFIGS = [
    "",
    "max_split_size_mb:40",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6",
    "expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:40",
]

sizes = st.one_of(
    st.sampled_from([512, 1024, 3 * MiB, 11 * MiB, 25 * MiB]),  # repeated sizes, so freed pieces fit exactly
    st.integers(1, 4096),  # small pool
    st.integers(MiB // 2, 3 * MiB),  # around the pool boundary
    st.integers(3 * MiB, 60 * MiB),  # large pool, 20 MiB segments and rounded ones
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 10**6)),
        st.tuples(st.just("record_stream"), st.integers(0, 10**6), st.integers(0, 3)),
        st.tuples(st.just("sync"), st.one_of(st.none(), st.integers(0, 3))),
        st.tuples(st.just("empty_cache")),
        st.tuples(st.just("toggle_expandable")),
    ),
    max_size=120,
)


def check(gpu: SimulatedGPU, a: CachingAllocator, live: dict[int, int], peaks: dict[str, int]) -> None:
    a.check_invariants()  # segments tile, blocks are merged, pools hold exactly the free blocks
    assert a.memory_reserved() == gpu.used_bytes  # reserved = sum of segments = device usage
    snap = a.snapshot()
    blocks = sorted(
        (b["address"], b["size"]) for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
    )
    assert {addr for addr, _ in blocks} == set(live)
    for (addr, size), nxt in zip(blocks, blocks[1:], strict=False):
        assert addr + size <= nxt[0]  # live blocks never overlap
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            assert seg["address"] <= b["address"] and b["address"] + b["size"] <= seg["address"] + seg["total_size"]
    assert a.memory_allocated() == sum(size for _, size in blocks)
    for name, value in (("allocated", a.memory_allocated()), ("reserved", a.memory_reserved())):
        peaks[name] = max(peaks[name], value)
    assert a.max_memory_allocated() == peaks["allocated"]
    assert a.max_memory_reserved() == peaks["reserved"]
    stats = a.memory_stats()
    for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "segment", "allocation"):
        assert stats[f"{key}.all.current"] == stats[f"{key}.small_pool.current"] + stats[f"{key}.large_pool.current"]
        assert stats[f"{key}.all.current"] == stats[f"{key}.all.allocated"] - stats[f"{key}.all.freed"]


def run_trace(config: str, trace: list, capacity: str = "256MiB") -> None:
    gpu = SimulatedGPU(capacity)
    a = CachingAllocator(gpu, config)
    if "garbage_collection" in config:
        a.set_per_process_memory_fraction(0.8)
    live: dict[int, int] = {}
    peaks = {"allocated": 0, "reserved": 0}
    expandable = "expandable_segments:True" in config
    for op in trace:
        if op[0] == "malloc":
            try:
                p = a.malloc(op[1], stream=op[2])
                live[p] = op[1]
            except OutOfMemoryError as e:
                assert e.report.allocated == a.memory_allocated()  # the message's numbers are the stats
                assert e.report.reserved == a.memory_reserved()
        elif op[0] == "free" and live:
            p = sorted(live)[op[1] % len(live)]
            a.free(p)
            del live[p]
        elif op[0] == "record_stream" and live:
            a.record_stream(sorted(live)[op[1] % len(live)], op[2])
        elif op[0] == "sync":
            gpu.synchronize(op[1])
            a.process_events()
        elif op[0] == "empty_cache":
            a.empty_cache()
            if a.config.expandable_segments:
                check_expandable_after_empty_cache(a)
        elif op[0] == "toggle_expandable":
            expandable = not expandable
            a.set_allocator_settings(f"expandable_segments:{expandable}")
        check(gpu, a, live, peaks)
    for p in list(live):
        a.free(p)
    gpu.synchronize()
    a.empty_cache()
    check(gpu, a, {}, peaks)
    assert a.memory_reserved() == 0 and gpu.used_bytes == 0 and gpu.mapped_pages == 0
    assert a.expandable_segments == []


def check_expandable_after_empty_cache(a: CachingAllocator) -> None:
    """After empty_cache every mapped page of an expandable segment holds at least one live byte."""
    snap = a.snapshot()
    mapped = 0
    for es in a.expandable_segments:
        mapped += es.mapped_pages * es.page_size
        for i, h in enumerate(es.handles):
            if h is None:
                continue
            lo, hi = es.ptr + i * es.page_size, es.ptr + (i + 1) * es.page_size
            assert any(
                b["state"] != "inactive" and b["address"] < hi and lo < b["address"] + b["size"]
                for s in snap["segments"] for b in s["blocks"]
            ), f"page {lo:#x} is mapped but holds nothing live"
    native = sum(s["total_size"] for s in snap["segments"] if not s["is_expandable"])
    assert mapped + native == a.memory_reserved()  # mapped pages x page size = reserved bytes


@pytest.mark.parametrize("config", CONFIGS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=ops)
def test_random_traces_keep_invariants(config, trace):
    run_trace(config, trace)


@settings(max_examples=40, deadline=None)
@given(trace=ops, fail_at=st.integers(0, 40), failures=st.integers(1, 3))
def test_device_failures_leave_allocator_consistent(trace, fail_at, failures):
    """A device malloc failing at any point: OutOfMemoryError or a successful retry, never a broken state."""
    gpu = SimulatedGPU("256MiB")
    a = CachingAllocator(gpu, "")
    live: list[int] = []
    for i, op in enumerate(trace):
        if i == fail_at:
            gpu.fail_next_mallocs(failures)
        if op[0] == "malloc":
            ooms = a.memory_stats()["num_ooms"]
            try:
                live.append(a.malloc(op[1], op[2]))
            except OutOfMemoryError:
                assert a.memory_stats()["num_ooms"] == ooms + 1
        elif op[0] == "free" and live:
            a.free(live.pop(op[1] % len(live)))
        a.check_invariants()
        assert a.memory_reserved() == gpu.used_bytes
    gpu.fail_next_mallocs(0)
    for p in live:
        a.free(p)
    a.empty_cache()
    assert gpu.used_bytes == 0


@pytest.mark.parametrize("config", ["", "expandable_segments:True"])
def test_fault_injection_on_fresh_segment_raises_oom(config):
    gpu = SimulatedGPU("1GiB")
    a = CachingAllocator(gpu, config)
    before = a.memory_stats()
    gpu.fail_next_mallocs(2)  # the first try and the retry both fail
    with pytest.raises(OutOfMemoryError):
        a.malloc(30 * MiB)
    after = a.memory_stats()
    assert after["num_ooms"] == 1 and after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"]
    a.check_invariants()
    assert a.malloc(30 * MiB) != 0  # and it recovers
