"""Worked examples, one per rule of PyTorch's caching allocator. Each names the PyTorch function it mirrors."""

import pytest

from minialloc import CachingAllocator, MiB, OutOfMemoryError, SimulatedGPU
from minialloc.allocator import get_allocation_size, round_size, roundup_power2_next_division

GiB = 1024 * MiB


def make(config: str = "", capacity: int | str = "8GiB") -> tuple[SimulatedGPU, CachingAllocator]:
    gpu = SimulatedGPU(capacity)
    return gpu, CachingAllocator(gpu, config)


def stat(a: CachingAllocator, key: str) -> int:
    return a.memory_stats()[key]


# round_size / get_allocation_size
def test_malloc_1_byte_reserves_one_2mib_segment():
    gpu, a = make()
    a.malloc(1)
    assert a.memory_reserved() == 2 * MiB
    assert a.memory_allocated() == 512  # kMinBlockSize
    assert stat(a, "requested_bytes.all.current") == 1
    assert stat(a, "segment.small_pool.current") == 1
    assert gpu.used_bytes == 2 * MiB


# get_allocation_size + alloc_found_block (split): 3 MiB -> 20 MiB segment, 17 MiB inactive split
def test_malloc_3mib_splits_a_20mib_segment():
    _, a = make()
    a.malloc(3 * MiB)
    assert a.memory_reserved() == 20 * MiB
    assert a.memory_allocated() == 3 * MiB
    assert stat(a, "inactive_split_bytes.large_pool.current") == 17 * MiB
    assert stat(a, "inactive_split.all.current") == 1
    (seg,) = a.snapshot()["segments"]
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(3 * MiB, "active_allocated"), (17 * MiB, "inactive")]


# should_split: a remainder of 1 MiB or less stays inside the block
def test_malloc_11mib_reserves_and_allocates_12mib():
    _, a = make()
    a.malloc(11 * MiB)
    assert a.memory_reserved() == 12 * MiB
    assert a.memory_allocated() == 12 * MiB
    assert stat(a, "requested_bytes.all.current") == 11 * MiB
    assert stat(a, "inactive_split.all.current") == 0


# get_free_block + small-pool should_split: two 1 KiB blocks share one 2 MiB segment
def test_two_small_mallocs_share_a_segment():
    _, a = make()
    p, q = a.malloc(1024), a.malloc(1024)
    assert q == p + 1024
    assert stat(a, "segment.all.current") == 1
    assert a.memory_reserved() == 2 * MiB


@pytest.mark.parametrize(
    "n,expected",
    [(1, 512), (512, 512), (513, 1024), (1024 * 1024, 1024 * 1024), (1024 * 1024 + 1, 1024 * 1024 + 512)],
)
def test_round_size(n, expected):
    assert round_size(n, 0) == expected


@pytest.mark.parametrize(
    "n,expected",
    [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
     (11 * MiB, 12 * MiB), (2 * GiB + 1, 2 * GiB + 2 * MiB)],
)
def test_get_allocation_size(n, expected):
    assert get_allocation_size(n) == expected


# roundup_power2_next_division and round_size with roundup_power2_divisions
def test_power2_divisions():
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024  # powers of two stay
    assert round_size(1200, 4) == 1536  # not above 512 * 4: plain 512 rounding applies
    assert round_size(4600, 4) == 5120  # quarters of [4096, 8192): 4096, 5120, ...
    _, a = make("roundup_power2_divisions:4")
    a.malloc(4600)
    assert a.memory_allocated() == 5120
    _, b = make()
    b.malloc(4600)
    assert b.memory_allocated() == 4608


def test_one_division_means_plain_512_byte_rounding():
    # round_size: only divisions > 1 round to power-of-two steps
    assert round_size(1000, 1) == 1024 and round_size(MiB + 1, 1) == MiB + 512
    _, a = make("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    p, q = a.malloc(1000), a.malloc(1000)
    assert q - p == 1024 and a.memory_allocated() == 2048


def test_power2_divisions_for_large_sizes_by_size_class():
    _, a = make("roundup_power2_divisions:[256:1,>:2]")
    a.malloc(300 * MiB)  # class 256 MiB: 1 division = no power-of-two rounding
    assert a.memory_allocated() == 300 * MiB
    a.malloc(600 * MiB)  # class 512 MiB: halves of [512, 1024) MiB -> 768 MiB
    assert a.memory_allocated() == 300 * MiB + 768 * MiB


# OOM message: "Tried to allocate" is the segment size (alloc_size)
def test_oom_reports_2gib_for_2gib_request():
    _, a = make(capacity="1GiB")
    # format_size's bounds are inclusive: exactly 1 GiB prints as MiB, as in PyTorch
    msg = r"Tried to allocate 2\.00 GiB\. GPU 0 has a total capacity of 1024\.00 MiB"
    with pytest.raises(OutOfMemoryError, match=msg):
        a.malloc(2 * GiB)
    assert stat(a, "num_ooms") == 1


def test_oom_reports_segment_size_for_3mib_request():
    _, a = make(capacity="16MiB")
    a.record_memory_history()
    with pytest.raises(OutOfMemoryError, match=r"Tried to allocate 20\.00 MiB"):
        a.malloc(3 * MiB)
    oom = a.snapshot()["device_traces"][0][-1]
    assert oom["action"] == "oom" and oom["size"] == 3 * MiB and oom["device_free"] == 16 * MiB


# release_cached_blocks then retry (num_alloc_retries)
def test_release_and_retry_frees_unsplit_cached_segments():
    gpu, a = make(capacity="100MiB")
    p = a.malloc(60 * MiB)
    a.free(p)  # 60 MiB cached, 40 MiB free on the device
    q = a.malloc(70 * MiB)  # no cached fit, device malloc fails, release everything, retry succeeds
    assert q != 0 and a.memory_reserved() == 70 * MiB == gpu.used_bytes
    assert stat(a, "num_alloc_retries") == 1
    assert stat(a, "num_device_free") == 1


# empty_cache = release_cached_blocks: split segments holding a live block stay
def test_empty_cache_keeps_segments_with_live_blocks():
    _, a = make()
    p, q = a.malloc(1), a.malloc(1)
    big = a.malloc(50 * MiB)
    a.free(p)
    a.free(big)
    a.empty_cache()
    assert a.memory_reserved() == 2 * MiB
    a.free(q)
    a.empty_cache()
    assert a.memory_reserved() == 0
    assert stat(a, "num_sync_all_streams") == 2


# get_free_block: max_split_size rules for oversize blocks
def test_oversize_blocks_serve_only_large_requests_within_rounding():
    _, a = make("max_split_size_mb:64")
    p = a.malloc(100 * MiB)
    assert stat(a, "oversize_segments.current") == 1 and stat(a, "oversize_allocations.current") == 1
    a.free(p)
    q = a.malloc(50 * MiB)  # under max_split_size: must not take the 100 MiB oversize block
    assert q != p and a.memory_reserved() == 150 * MiB
    r = a.malloc(90 * MiB)  # oversize and within 20 MiB: reuses it whole, unsplit
    assert r == p and a.memory_allocated() == 150 * MiB
    a.free(r)
    s = a.malloc(70 * MiB)  # 100 >= 70 + 20: rejected, a new segment
    assert s != p and a.memory_reserved() == 220 * MiB
    assert a.memory_stats()["max_split_size"] == 64 * MiB


def test_max_non_split_rounding_widens_reuse():
    _, a = make("max_split_size_mb:64,max_non_split_rounding_mb:40")
    p = a.malloc(100 * MiB)
    a.free(p)
    assert a.malloc(70 * MiB) == p  # 100 < 70 + 40


def test_large_blocks_are_not_split_above_max_split_size():
    _, a = make("max_split_size_mb:64")
    p = a.malloc(80 * MiB)
    a.free(p)
    # 80 MiB block serves a 70 MiB request whole: allocated counts the whole block, no inactive split
    assert a.malloc(70 * MiB) == p
    assert a.memory_allocated() == 80 * MiB and stat(a, "inactive_split.all.current") == 0


# release_available_cached_blocks: free just enough oversize blocks before the big retry
def test_release_available_cached_blocks_frees_oversize_blocks_largest_first():
    _, a = make("max_split_size_mb:64", capacity="300MiB")
    small = a.malloc(80 * MiB)
    p, q = a.malloc(100 * MiB), a.malloc(100 * MiB)
    a.free(p)
    a.free(q)
    a.free(small)
    r = a.malloc(150 * MiB)  # needs both 100 MiB blocks back; the 80 MiB one is not enough with one of them
    assert r != 0
    assert stat(a, "num_alloc_retries") == 0  # solved before release_cached_blocks
    assert stat(a, "num_device_free") == 2
    assert a.memory_reserved() == 80 * MiB + 150 * MiB


def test_release_available_cached_blocks_frees_one_block_when_enough():
    _, a = make("max_split_size_mb:64", capacity="300MiB")
    p, q = a.malloc(100 * MiB), a.malloc(180 * MiB)
    a.free(p)
    a.free(q)
    r = a.malloc(120 * MiB)  # 180 >= 120 + 20: not reused; device has 20 MiB; free the 180 MiB block only
    assert r != 0 and stat(a, "num_device_free") == 1 and a.memory_reserved() == 220 * MiB


# get_free_block is per stream
def test_free_blocks_are_reused_only_on_their_stream():
    _, a = make()
    p = a.malloc(MiB, stream=0)
    a.free(p)
    q = a.malloc(MiB, stream=1)
    assert q != p and stat(a, "segment.all.current") == 2
    a.free(q)
    assert a.malloc(MiB, stream=0) == p


# recordStream / insert_events / process_events
def test_record_stream_defers_the_free_until_the_stream_syncs():
    gpu, a = make()
    p = a.malloc(MiB)
    a.record_stream(p, 2)
    a.free(p)
    blocks = a.snapshot()["segments"][0]["blocks"]
    assert blocks[0]["state"] == "active_pending_free"
    assert stat(a, "allocated_bytes.all.current") == 0 and stat(a, "active_bytes.all.current") == MiB
    q = a.malloc(MiB)  # stream 2 has not finished: p is not reusable yet
    assert q != p
    a.free(q)
    gpu.synchronize(2)
    assert a.malloc(MiB) == p  # process_events freed it first


def test_record_stream_on_own_stream_is_ignored():
    _, a = make()
    p = a.malloc(MiB, stream=3)
    a.record_stream(p, 3)
    a.free(p)
    assert stat(a, "active.all.current") == 0


def test_empty_cache_synchronizes_pending_frees():
    _, a = make()
    p = a.malloc(MiB)
    a.record_stream(p, 1)
    a.free(p)
    a.empty_cache()
    assert a.memory_reserved() == 0 and stat(a, "num_sync_all_streams") == 1


# setMemoryFraction: reserved memory is capped; the message says how much is allowed
def test_memory_fraction_caps_reserved_and_is_reported():
    _, a = make()
    a.set_per_process_memory_fraction(0.5)
    a.malloc(3 * GiB)
    with pytest.raises(OutOfMemoryError, match=r"4\.00 GiB allowed; Of the allocated memory 3\.00 GiB") as e:
        a.malloc(2 * GiB)
    assert e.value.report.allowed == 4 * GiB


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (1.5, ValueError, "Invalid fraction value: 1.5. Allowed range: 0~1"),
        (-0.1, ValueError, "Invalid fraction value: -0.1. Allowed range: 0~1"),
        ("0.5", TypeError, "Invalid type for fraction argument, must be `float`"),
        (True, TypeError, "must be `float`"),
        (None, TypeError, "must be `float`"),
        (1, TypeError, "must be `float`"),  # an int, even a valid-looking one: torch/cuda/memory.py checks float
    ],
)
def test_invalid_fraction(bad, error, message):
    _, a = make()
    before = a.memory_stats()
    with pytest.raises(error) as info:
        a.set_per_process_memory_fraction(bad)
    assert message in str(info.value)
    assert a.memory_stats() == before and a.get_per_process_memory_fraction() == 1.0


# garbage_collect_cached_blocks: with a fraction and a threshold, old cached blocks go before a retry is needed
def test_garbage_collection_frees_cached_blocks_instead_of_retrying():
    _, gc = make("garbage_collection_threshold:0.5", capacity="200MiB")
    _, plain = make(capacity="200MiB")
    for a in (gc, plain):
        a.set_per_process_memory_fraction(0.999)  # under 1.0: a limit is set, so garbage collection acts
        ptrs = [a.malloc(40 * MiB) for _ in range(4)]
        for p in ptrs:
            a.free(p)
        a.malloc(50 * MiB)
    assert stat(plain, "num_alloc_retries") == 1  # 160 + 50 > 200: only release_cached_blocks saves it
    assert stat(gc, "num_alloc_retries") == 0
    assert gc.memory_reserved() == 50 * MiB


def test_garbage_collection_frees_older_blocks_first():
    _, a = make("garbage_collection_threshold:0.6", capacity="100MiB")
    a.record_memory_history()
    a.set_per_process_memory_fraction(0.999)
    old, young = a.malloc(40 * MiB), a.malloc(40 * MiB)
    a.free(old)
    for _ in range(4):  # each large-pool lookup ages the cached blocks by one
        a.free(a.malloc(12 * MiB, stream=1))
    a.free(young)
    a.malloc(30 * MiB, stream=2)  # no fit on stream 2: GC, 92 MiB reserved > 60 MiB threshold
    freed = [e["addr"] for e in a.snapshot()["device_traces"][0] if e["action"] == "segment_free"]
    assert freed == [old]
    assert a.memory_reserved() == 40 * MiB + 12 * MiB + 30 * MiB


# free_block / try_merge_blocks
def test_free_merges_neighbours_and_inactive_split_counts_pieces():
    _, a = make()
    p, q, r = a.malloc(MiB // 2), a.malloc(MiB // 2), a.malloc(MiB // 2)
    a.free(p)
    a.free(r)  # r merges with the free tail
    assert stat(a, "inactive_split.all.current") == 2
    a.free(q)  # everything merges back into one unsplit 2 MiB block
    assert stat(a, "inactive_split.all.current") == 0
    (seg,) = a.snapshot()["segments"]
    assert [b["size"] for b in seg["blocks"]] == [2 * MiB]


def test_peaks_and_reset():
    _, a = make()
    p = a.malloc(100 * MiB)
    a.free(p)
    assert a.max_memory_allocated() == 100 * MiB and a.memory_allocated() == 0
    a.reset_peak_memory_stats()
    assert a.max_memory_allocated() == 0 and a.max_memory_reserved() == 100 * MiB
    a.reset_accumulated_memory_stats()
    assert stat(a, "allocated_bytes.all.allocated") == 0 and stat(a, "num_device_alloc") == 0


def test_memory_stats_has_every_pytorch_key():
    _, a = make()
    keys = set(a.memory_stats())
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                 "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for t in ("all", "small_pool", "large_pool"):
            for f in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{t}.{f}" in keys
    for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
              "max_split_size", "oversize_allocations.peak", "oversize_segments.current"):
        assert k in keys
    assert a.memory_stats()["max_split_size"] == -1


def test_config_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("MINIALLOC_ALLOC_CONF", "max_split_size_mb:64")
    a = CachingAllocator(SimulatedGPU("1GiB"))
    assert a.memory_stats()["max_split_size"] == 64 * MiB
    b = CachingAllocator(SimulatedGPU("1GiB"), "")  # an explicit config wins
    assert b.memory_stats()["max_split_size"] == -1


def test_trace_ring_buffer_and_history_switch():
    _, a = make()
    a.record_memory_history(max_entries=3)
    for _ in range(5):
        a.free(a.malloc(512))
    trace = a.snapshot()["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "free_requested", "free_completed"]
    # the snapshot's own entry is written after its traces were gathered: the next snapshot shows it
    assert a.snapshot()["device_traces"][0][-1]["action"] == "snapshot"
    a.record_memory_history(enabled=False)
    a.malloc(512)
    assert a.snapshot()["device_traces"] == [[]]


def test_stacks_are_recorded_when_asked():
    _, a = make()
    a.record_memory_history(stacks=True)
    a.malloc(512)
    frames = a.snapshot()["segments"][0]["blocks"][0]["frames"]
    assert frames and frames[0]["name"] == "test_stacks_are_recorded_when_asked"


# ---------------------------------------------------------------------------------------------------------------
# Issue 15: PyTorch 2.13, exactly. One worked example per item, with PyTorch 2.13's outcome and where it comes
# from. "2.13 parser" results were measured by running PyTorch 2.13.0's own c10 parser
# (AcceleratorAllocatorConfig::parseArgs, reachable on a CPU build as torch._C._accelerator_setAllocatorSettings);
# the allocator's lines are DeviceCachingAllocator / NativeCachingAllocator in c10/cuda/CUDACachingAllocator.cpp.
# ---------------------------------------------------------------------------------------------------------------


# 1. AcceleratorAllocatorConfig::parseArgs starts with "max_split_size_ = SIZE_MAX;
#    roundup_power2_divisions_.assign(16, 0); garbage_collection_threshold_ = 0; max_non_split_rounding_size_ =
#    large_segment_size_" before it reads the string. 2.13 parser: after
#    "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.5", the string
#    "expandable_segments:True" leaves max_split_size -1 (unset), divisions all 0, threshold 0, expandable True.
def test_issue15_1_runtime_settings_reparse_from_defaults():
    _, a = make("max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.5")
    a.set_allocator_settings("expandable_segments:True")
    c = a.config
    assert (c.max_split_size, c.garbage_collection_threshold, c.expandable_segments) == (None, 0.0, True)
    assert c.roundup_power2_divisions == (0,) * 16
    # and the allocator follows: 1200 B is no longer rounded to a quarter step, 600 MiB blocks are split again
    p = a.malloc(1200)
    assert a.snapshot()["segments"][0]["blocks"][0]["size"] == 1536  # 512-rounding only (1280 with divisions 4)
    a.free(p)
    settings = a.snapshot()["allocator_settings"]
    assert settings["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # last_allocator_settings_
    assert settings["max_split_size"] == -1 and settings["garbage_collection_threshold"] == 0.0
    # expandable_segments survives a later string that does not name it (the 2.13 parser keeps it)
    a.set_allocator_settings("max_split_size_mb:64")
    assert a.config.expandable_segments and a.config.max_split_size == 64 * MiB


# 2. DeviceCachingAllocator::setMemoryFraction: "allowed_memory_maximum = std::nullopt; if (fraction < 1.0)
#    allowed_memory_maximum = fraction * totalGlobalMem", and malloc garbage-collects only "if
#    (allowed_memory_maximum.has_value() && garbage_collection_threshold() > 0.0)". torch/cuda/memory.py 2.13:
#    "if not isinstance(fraction, float): raise TypeError(...)". So 1.0 is "no limit" and GC stays off.
def test_issue15_2_fraction_one_means_no_limit_and_no_gc():
    runs = {}
    for name, config, fraction in (("native", "", None), ("gc at 1.0", "garbage_collection_threshold:0.5", 1.0),
                                   ("gc at 0.999", "garbage_collection_threshold:0.5", 0.999)):
        _, a = make(config, capacity="200MiB")
        if fraction is not None:
            a.set_per_process_memory_fraction(fraction)
        for p in [a.malloc(40 * MiB) for _ in range(4)]:
            a.free(p)
        a.malloc(50 * MiB)
        runs[name] = (stat(a, "num_alloc_retries"), a.memory_reserved())
    assert runs["gc at 1.0"] == runs["native"] == (1, 50 * MiB)  # same as no threshold at all
    assert runs["gc at 0.999"] == (0, 50 * MiB)  # a real limit: garbage collection made room, no retry
    _, a = make()
    a.set_per_process_memory_fraction(0.5)
    a.set_per_process_memory_fraction(1.0)  # lifts the limit again
    assert a.get_per_process_memory_fraction() == 1.0
    a.malloc(6 * GiB)
    with pytest.raises(TypeError, match="must be `float`"):
        a.set_per_process_memory_fraction(1)


# 3. record_trace: "if (!record_history && trace_trackers_.empty()) return;" and record_history starts false
#    (memory.py: _record_memory_history switches it on). Entries carry frames only with a context
#    (memory_snapshot.cpp); user_metadata is "" unless torch.cuda.memory._set_memory_metadata set it.
def test_issue15_3_history_is_off_until_asked():
    _, a = make()
    a.free(a.malloc(3 * MiB))
    assert a.snapshot()["device_traces"] == [[]]  # PyTorch: [[]] before _record_memory_history()
    a.record_memory_history()
    p = a.malloc(3 * MiB)
    a.set_memory_metadata("step 1")
    a.free(p)
    a.empty_cache()
    snap = a.snapshot()
    trace = snap["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "free_requested", "free_completed", "segment_free"]
    assert list(trace[0]) == ["action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata"]
    assert [e["user_metadata"] for e in trace] == ["", "step 1", "step 1", "step 1"]
    assert all(e["stream"] == 0 for e in trace)  # the default stream is 0, as PyTorch writes it
    # empty_cache's releases are marked by annotations around them, not in the entries
    start, end = snap["external_annotations"]
    assert (start["name"], start["stage"], end["stage"]) == ("empty_cache", "START", "END")
    assert start["time_us"] <= trace[3]["time_us"] <= end["time_us"] and trace[2]["time_us"] < start["time_us"]
    a.record_memory_history(stacks=True)
    a.malloc(512)
    seg_alloc, alloc = a.snapshot()["device_traces"][0][-2:]
    assert (seg_alloc["action"], alloc["action"]) == ("segment_alloc", "alloc")
    for entry in (seg_alloc, alloc):  # with stacks, segment entries carry the malloc's context too
        assert entry["frames"][0]["name"] == "test_issue15_3_history_is_off_until_asked"


# 4. parseRoundUpPower2Divisions: '>' fills from last_index + 1, so the last explicit interval keeps its value.
#    2.13 parser: [256:1,512:2,1024:4,>:8] -> 1 1 1 1 1 1 1 1 1 2 4 8 8 8 8 8 (2.9 and earlier: entry 10 = 8).
def test_issue15_4_greater_bucket_keeps_the_last_interval():
    _, a = make("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert a.config.roundup_power2_divisions == (1,) * 9 + (2, 4) + (8,) * 5
    # a 1.3 GiB request is in the 1024 MB class: quarters of [1 GiB, 2 GiB), not eighths
    p = a.malloc(1300 * MiB)
    assert a.snapshot()["segments"][0]["total_size"] == 1280 * MiB + 256 * MiB
    a.free(p)


# 5. DeviceCachingAllocator::malloc's TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to
#    allocate ", ..., " is allocated by PyTorch, ", private_pool_msg, "and ", ..., " If reserved but unallocated
#    memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ...") - the hint always;
#    reportProcessMemoryInfo returns "" without NVML.
def test_issue15_5_oom_message_is_pytorchs_then_minialloc_line():
    _, a = make("expandable_segments:True", capacity="1GiB")
    a.malloc(900 * MiB)
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(300 * MiB)
    pytorch_text, ours = str(info.value).split("\n")
    assert pytorch_text == (
        "CUDA out of memory. Tried to allocate 300.00 MiB. GPU 0 has a total capacity of 1024.00 MiB of which "
        "124.00 MiB is free. Of the allocated memory 900.00 MiB is allocated by PyTorch, and 0 bytes is reserved "
        "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-"
        "cuda-alloc-conf)"
    )  # the hint is printed although expandable segments are on, as PyTorch prints it
    assert ours == "minialloc: the largest free block is 124.00 MiB of 124.00 MiB free in all (fragmentation 0.00)."


def test_issue15_5_per_process_lines_come_from_the_device():
    import os

    class NVMLGPU(SimulatedGPU):
        def process_memory_info(self) -> list[tuple[int, int]]:
            return [(os.getpid(), self.used_bytes), (4242, 2 * GiB)]

    a = CachingAllocator(NVMLGPU("1GiB"), "")
    a.malloc(900 * MiB)
    with pytest.raises(OutOfMemoryError, match=r"is free\. Including non-PyTorch memory, this process has "
                       r"900\.00 MiB memory in use\. Process 4242 has 2\.00 GiB memory in use\. Of the allocated"):
        a.malloc(300 * MiB)


# 6. The DeviceCachingAllocator constructor: "stats.max_split_size = AcceleratorAllocatorConfig::max_split_size()";
#    nothing sets it afterwards. The snapshot's allocator_settings reads the live config (NativeCachingAllocator::
#    snapshot: md.max_split_size = AcceleratorAllocatorConfig::max_split_size()).
def test_issue15_6_stats_max_split_size_is_fixed_at_creation():
    _, a = make()
    a.set_allocator_settings("max_split_size_mb:64")
    assert a.memory_stats()["max_split_size"] == -1
    assert a.snapshot()["allocator_settings"]["max_split_size"] == 64 * MiB
    _, b = make("max_split_size_mb:64")
    b.set_allocator_settings("")
    assert b.memory_stats()["max_split_size"] == 64 * MiB


# 7. NativeCachingAllocator::allocate: "TORCH_CHECK_WITH(OutOfMemoryError, size < one_exa_bytes, "CUDA out of
#    memory. Tried to allocate more than 1EB memory.")" before malloc: no counter, no trace entry.
def test_issue15_7_one_exabyte_is_refused_at_once():
    _, a = make()
    a.record_memory_history()
    before = a.memory_stats()
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(2**60)
    assert str(info.value) == "CUDA out of memory. Tried to allocate more than 1EB memory."
    assert info.value.report is None
    assert a.memory_stats() == before and a.snapshot()["device_traces"] == [[]]
    with pytest.raises(OutOfMemoryError, match="Tried to allocate 1024.00 GiB"):  # just under: the usual path
        a.malloc(2**40)
    assert stat(a, "num_ooms") == 1


# 8. parseMaxSplitSize: "max_split_size_mb too small, must be >= " large_segment_size / kMB (20 by default);
#    parseLargeSegmentSize: "must be > 10 MB"; get_allocation_size returns large_segment_size() for requests
#    under kMinLargeAlloc, and find_expandable_block sizes the large pool's pages by it;
#    DeviceCachingAllocator's constructor calls setMemoryFraction(per_process_memory_fraction()).
def test_issue15_8_config_keys_of_2_13():
    _, a = make("max_split_size_mb:20")
    assert a.memory_stats()["max_split_size"] == 20 * MiB
    from minialloc import ConfigError

    with pytest.raises(ConfigError, match="must be >= 20"):
        make("max_split_size_mb:19")
    _, b = make("large_segment_size_mb:40")
    b.malloc(3 * MiB)
    assert b.memory_reserved() == 40 * MiB  # the 1-10 MiB segment is the large segment size
    _, e = make("large_segment_size_mb:40,expandable_segments:True")
    e.malloc(3 * MiB)
    assert e.memory_reserved() == 40 * MiB and e.expandable_segments[0].page_size == 40 * MiB
    _, f = make("per_process_memory_fraction:0.5")
    assert f.get_per_process_memory_fraction() == 0.5
    f.malloc(3 * GiB)
    with pytest.raises(OutOfMemoryError, match=r"4\.00 GiB allowed; "):
        f.malloc(2 * GiB)
    f.set_allocator_settings("per_process_memory_fraction:1.0")  # read at creation only
    assert f.get_per_process_memory_fraction() == 0.5


# 9. torch/cuda/memory.py memory_summary: "PyTorch CUDA memory summary, device ID {device_index:<17d}" centred
#    in 75 columns (tests/test_summary.py compares the whole table with torch's own function).
def test_issue15_9_summary_title_is_pytorchs():
    _, a = make()
    assert a.memory_summary().split("\n")[1] == f"|{'':18}PyTorch CUDA memory summary, device ID 0{'':17}|"
