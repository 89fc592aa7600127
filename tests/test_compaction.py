"""Compaction: Buffer handles, defragment() within segments and across them (release_empty), data kept intact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minialloc import CachingAllocator, InvalidPointerError, MiB, OutOfMemoryError, SimulatedGPU
from minialloc.debug import GUARD_BYTES, GuardViolation, HostData, KernelData
from minialloc.kernels.reference import POISON
from minialloc.workloads import canonical_scenario


def check(gpu: SimulatedGPU, a: CachingAllocator) -> None:
    a.check_invariants()
    assert a.memory_reserved() == gpu.used_bytes


def fragmented(capacity: str = "256MiB", config: str = "") -> tuple[SimulatedGPU, CachingAllocator, list]:
    """Fill a device with 20 MiB segments of five 4 MiB buffers, then free buffers 0, 2 and 4 of each: 12 MiB free
    per segment in three 4 MiB holes, and the device has less than a segment left."""
    gpu = SimulatedGPU(capacity, store_data=True)
    a = CachingAllocator(gpu, config)
    bufs = []
    try:
        while True:
            bufs.append(a.buffer(4 * MiB))
    except OutOfMemoryError:
        pass
    rng = np.random.default_rng(0)
    for b in bufs:
        b.write(rng.integers(0, 256, b.nbytes, dtype=np.uint8))
    for i, b in enumerate(bufs):
        if i % 5 in (0, 2, 4):
            b.free()
    return gpu, a, [b for b in bufs if not b.freed]


def test_buffers_read_write_and_free():
    gpu = SimulatedGPU("64MiB", store_data=True)
    a = CachingAllocator(gpu)
    b = a.buffer(1000, stream=1)
    assert (b.nbytes, b.stream) == (1000, 1) and b.ptr in a._active and "Buffer(0x" in repr(b)
    b.write(b"hello", offset=10)
    assert bytes(b.read(5, offset=10)) == b"hello" and bytes(gpu.view(b.ptr + 10, 5)) == b"hello"
    with pytest.raises(ValueError, match="runs past"):
        b.write(bytes(991), offset=10)
    with pytest.raises(ValueError, match="runs past"):
        b.read(1, offset=1000)
    with pytest.raises(InvalidPointerError, match="belongs to a Buffer"):
        a.free(b.ptr)  # a raw free would leave the handle pointing at memory someone else gets next
    b.free()
    assert b.freed and "freed" in repr(b)
    with pytest.raises(InvalidPointerError, match="already freed"):
        b.free()
    with pytest.raises(InvalidPointerError, match="freed"):
        _ = b.ptr
    with pytest.raises(ValueError, match="positive"):
        a.buffer(0)
    check(gpu, a)


def test_defragment_makes_a_failing_request_fit():
    gpu, a, live = fragmented()
    assert len(live) == 24 and a.largest_free_block() == 4 * MiB
    contents = [b.read() for b in live]
    with pytest.raises(OutOfMemoryError):
        a.malloc(8 * MiB)  # a 20 MiB segment is too much for the device, and no hole holds 8 MiB
    old = [b.ptr for b in live]
    report = a.defragment()
    # in each segment the buffers at 4 and 12 MiB move to 0 and 4 MiB: every live block moves, once
    assert report.blocks_moved == 24 and report.bytes_moved == 24 * 4 * MiB
    assert (report.segments_compacted, report.blocks_pinned, report.segments_released) == (12, 0, 0)
    assert (report.largest_free_before, report.largest_free_after) == (4 * MiB, 12 * MiB)
    assert all(b.ptr == p - 4 * MiB * (1 + i % 2) for i, (b, p) in enumerate(zip(live, old, strict=True)))
    assert all((b.read() == c).all() for b, c in zip(live, contents, strict=True))
    check(gpu, a)
    assert a.memory_stats()["inactive_split.all.current"] == 12  # one free piece per segment
    a.malloc(8 * MiB)
    check(gpu, a)
    assert a.defragment().blocks_moved == 0  # already compact


def test_pinned_blocks_stay_put():
    """Raw pointers, blocks used on another stream and frees waiting on events never move; the free space
    between them becomes one piece per run."""
    gpu = SimulatedGPU("64MiB", store_data=True)
    a = CachingAllocator(gpu)
    sizes = [MiB + 512 * i for i in range(1, 4)]  # over 1 MiB: the large pool, all in one 20 MiB segment
    bufs = [a.buffer(n) for n in sizes]
    raw = a.malloc(2 * MiB)
    gpu.view(raw, 2 * MiB)[:] = 7
    more = [a.buffer(2 * MiB) for _ in range(4)]
    a.record_stream(more[1].ptr, 1)  # stream 1 may use it: pinned
    a.record_stream(more[3].ptr, 1)
    pending = more[3]
    pending.free()  # a free waiting on stream 1's event: pinned too
    for b in (bufs[0], bufs[1], more[0], more[2]):
        b.free()
    kept = [bufs[2], more[1]]
    for b in kept:
        b.write(np.full(b.nbytes, 3, np.uint8))
    before = {b.ptr for b in kept}
    report = a.defragment()
    assert report.blocks_pinned == 3 and report.blocks_moved == 1
    seg = [blk for blk in a._all_blocks() if blk.prev is None][0]
    layout = []
    while seg is not None:
        layout.append(("raw" if seg.ptr == raw else "live" if seg.allocated else
                       "pending" if seg.event_count else "free", seg.size))
        seg = seg.next
    assert [kind for kind, _ in layout] == ["live", "free", "raw", "free", "live", "free", "pending", "free"]
    assert bufs[2].ptr == min(before) - sizes[0] - sizes[1]  # slid to the segment's start
    assert more[1].ptr in before  # pinned by its use on stream 1
    assert (gpu.view(raw, 2 * MiB) == 7).all() and all((b.read() == 3).all() for b in kept)
    check(gpu, a)
    gpu.synchronize(1)
    a.process_events()
    check(gpu, a)


def test_trace_records_moves_as_free_and_alloc():
    gpu, a, live = fragmented("64MiB")
    a.record_memory_history()  # history is off until asked, as in PyTorch
    a.defragment()
    moves = [t for t in a.snapshot()["device_traces"][0] if t["user_metadata"] == "defragment"]
    assert [t["action"] for t in moves[:3]] == ["free_requested", "free_completed", "alloc"]
    assert {t["addr"] for t in moves if t["action"] == "alloc"} <= {b.ptr for b in live}


def test_release_empty_gives_whole_segments_back():
    gpu, a, live = fragmented()
    for b in live[::2]:
        b.free()  # one 4 MiB buffer per segment: 12 segments, 48 MiB live
    live = live[1::2]
    contents = [b.read() for b in live]
    report = a.defragment(release_empty=True)
    # 48 MiB fit in three segments; the other nine are emptied into the holes of those and given back
    assert report.segments_released == 9 and report.bytes_released == 9 * 20 * MiB
    assert a.memory_reserved() == 3 * 20 * MiB == gpu.used_bytes
    assert all((b.read() == c).all() for b, c in zip(live, contents, strict=True))
    check(gpu, a)
    assert a.defragment(release_empty=True).segments_released == 0


def test_release_empty_never_empties_a_segment_with_a_pinned_block():
    gpu = SimulatedGPU("128MiB", store_data=True)
    a = CachingAllocator(gpu)
    bufs = [a.buffer(4 * MiB) for _ in range(10)]  # two 20 MiB segments
    raw = a.malloc(4 * MiB)  # a third segment, pinned by a raw pointer
    for b in bufs[1:]:
        b.free()
    report = a.defragment(release_empty=True)
    assert report.segments_released == 1 and raw in a._active and a.memory_reserved() == 40 * MiB
    check(gpu, a)


def test_release_empty_leaves_oversize_holes_alone():
    """With max_split_size, the allocator never splits an oversize free block for a smaller request; nor does
    compaction. (Such a hole inside a split segment arises when the setting changes at runtime.)"""
    gpu = SimulatedGPU("256MiB", store_data=True)
    a = CachingAllocator(gpu)
    b = a.buffer(4 * MiB)  # a 20 MiB segment, 16 MiB free
    a.free(a.malloc(60 * MiB))
    a.malloc(18 * MiB)  # too big for the 16 MiB hole: split off the cached 60 MiB segment, 42 MiB left
    a.set_allocator_settings("max_split_size_mb:20")
    assert a.defragment(release_empty=True).segments_released == 0
    a.set_allocator_settings("max_split_size_mb:100")
    assert a.defragment(release_empty=True).segments_released == 1 and b.ptr in a._active
    check(gpu, a)


def test_canonical_scenario_needs_expandable_segments_not_compaction():
    """The course's scenario at 1/8 scale: every segment holds one live block and one hole, already in one piece,
    and no block fits another segment's hole, so defragment() finds nothing to do; expandable segments fit."""
    results = {}
    for config in ("", "expandable_segments:True"):
        gpu = SimulatedGPU("1GiB", store_data=True)
        a = CachingAllocator(gpu, config)
        live = {}
        for ev in canonical_scenario():
            if ev.op == "free":
                live.pop(ev.name).free()
                continue
            try:
                live[ev.name] = a.buffer(ev.size // 8)
            except OutOfMemoryError:
                report = a.defragment(release_empty=True)
                assert (report.blocks_moved, report.segments_released) == (0, 0)
                with pytest.raises(OutOfMemoryError):
                    a.buffer(ev.size // 8)
                results[config] = "OOM"
        results.setdefault(config, "fits")
        check(gpu, a)
    assert results == {"": "OOM", "expandable_segments:True": "fits"}


def test_expandable_segments_are_skipped():
    gpu = SimulatedGPU("128MiB", store_data=True)
    a = CachingAllocator(gpu, "expandable_segments:True")
    bufs = [a.buffer(4 * MiB) for _ in range(5)]
    bufs[0].free()
    assert a.defragment(release_empty=True).blocks_moved == 0
    check(gpu, a)


def test_debug_guards_move_with_their_blocks():
    gpu, a, live = fragmented("64MiB", "debug_guards:True")
    a.defragment()
    check(gpu, a)
    b = live[0]
    pieces = [blk for blk in a._all_blocks() if not blk.allocated and blk.segment is None]
    assert all((gpu.view(p.ptr, p.size) == POISON & 0xFF).all() for p in pieces)  # stale bytes look freed
    gpu.view(b.ptr + b.nbytes + 2, 1)[0] = 0
    with pytest.raises(GuardViolation) as info:
        b.free()
    assert info.value.offset == b.nbytes + 2 and info.value.offset < b.nbytes + GUARD_BYTES
    for other in live[1:]:
        other.free()  # moved guards are intact: no false positive
    check(gpu, a)


def test_accounting_only_compaction_allocates_no_host_memory(monkeypatch):
    """Without store_data the bookkeeping moves and no byte exists anywhere: every NumPy allocator is off limits."""
    def refuse(*args, **kwargs):
        raise AssertionError("host memory allocated in accounting-only mode")

    gpu = SimulatedGPU("80GiB")
    for name in ("zeros", "empty", "ones", "full", "array", "concatenate", "frombuffer", "zeros_like"):
        monkeypatch.setattr(np, name, refuse)
    for config in ("", "expandable_segments:True"):
        a = CachingAllocator(gpu, config)
        bufs = [a.buffer(s) for s in (512, 3 * MiB, 5 * MiB, 700, 40 * MiB, 3 * MiB)]
        raw = [a.malloc(s) for s in (1000, 30 * MiB)]
        for b in bufs[::2]:
            b.free()
        a.defragment(release_empty=True)
        check(gpu, a)
        for b in bufs[1::2]:
            b.free()
        for p in raw:
            a.free(p)
        a.empty_cache()
    assert gpu.used_bytes == 0


def test_moves_through_the_cuda_kernels(monkeypatch):
    """KernelData, what a CudaGPU gets, with the .cu kernels compiled for the CPU over the simulator's bytes."""
    from minialloc.kernels.emulation import EmulatedKernels, EmulationUnavailable

    try:
        kernels = EmulatedKernels.build(order=1)
    except EmulationUnavailable as e:
        pytest.skip(str(e))
    gpu = SimulatedGPU("64MiB", store_data=True)
    monkeypatch.setattr(gpu, "data", lambda: KernelData(gpu.view, lambda stream: kernels))  # what CudaGPU.data is
    a = CachingAllocator(gpu)
    bufs = [a.buffer(3 * MiB + 512 * i) for i in range(6)]
    rng = np.random.default_rng(2)
    for b in bufs:
        b.write(rng.integers(0, 256, b.nbytes, dtype=np.uint8))
    contents = [b.read() for b in bufs]
    bufs[0].free()
    bufs[3].free()
    report = a.defragment()
    assert report.blocks_moved == 4  # overlapping moves: 3 MiB blocks moving down by 3 MiB or less
    assert all((b.read() == c).all() for b, c in zip(bufs[1:3] + bufs[4:], contents[1:3] + contents[4:],
                                                     strict=True))
    check(gpu, a)


# -- property test ---------------------------------------------------------------------------------------------------
sizes = st.one_of(st.integers(1, 8192), st.integers(MiB // 2, 3 * MiB), st.integers(3 * MiB, 12 * MiB))
ops = st.lists(
    st.one_of(
        st.tuples(st.just("buffer"), sizes, st.integers(0, 1)),
        st.tuples(st.just("raw"), sizes, st.integers(0, 1)),
        st.tuples(st.just("free"), st.integers(0, 10**6)),
        st.tuples(st.just("record_stream"), st.integers(0, 10**6)),
        st.tuples(st.just("sync")),
        st.tuples(st.just("defragment"), st.booleans()),
        st.tuples(st.just("empty_cache")),
    ),
    max_size=50,
)


@pytest.mark.parametrize("config", ["", "max_split_size_mb:20", "debug_guards:True", "expandable_segments:True"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace=ops, seed=st.integers(0, 2**32 - 1))
def test_random_traces_keep_data_and_invariants(config, trace, seed):
    gpu = SimulatedGPU("96MiB", store_data=True)
    a = CachingAllocator(gpu, config)
    rng = np.random.default_rng(seed)
    live: list[tuple[object, bytes]] = []  # (Buffer or raw pointer, its contents)

    raw = HostData(gpu)  # raw pointers' bytes (a range may lie on several handles when expandable)

    def read(handle: object, n: int) -> bytes:
        return bytes(raw.read(handle, n)) if isinstance(handle, int) else bytes(handle.read())

    def free(handle: object) -> None:
        if isinstance(handle, int):
            a.free(handle)
        else:
            handle.free()

    for op in trace:
        if op[0] in ("buffer", "raw"):
            data = rng.integers(0, 256, op[1], dtype=np.uint8)
            try:
                handle = a.buffer(op[1], op[2]) if op[0] == "buffer" else a.malloc(op[1], op[2])
            except OutOfMemoryError:
                continue
            if isinstance(handle, int):
                raw.write(handle, data)
            else:
                handle.write(data)
            live.append((handle, data.tobytes()))
        elif op[0] in ("free", "record_stream") and live:
            handle, _ = live[op[1] % len(live)]
            ptr = handle if isinstance(handle, int) else handle.ptr
            if op[0] == "record_stream":
                a.record_stream(ptr, 1)
                continue
            del live[op[1] % len(live)]
            free(handle)
        elif op[0] == "sync":
            gpu.synchronize()
            a.process_events()
        elif op[0] == "defragment":
            raw_before = {h for h, _ in live if isinstance(h, int)}
            a.defragment(release_empty=op[1])
            assert raw_before <= set(a._active)  # raw pointers never move
        else:
            a.empty_cache()
        check(gpu, a)
        for handle, data in live:
            assert read(handle, len(data)) == data
    for handle, _ in live:
        free(handle)
    gpu.synchronize()
    a.empty_cache()
    assert a.memory_reserved() == gpu.used_bytes == 0
