"""Private memory pools (torch.cuda.MemPool / use_mem_pool, as PyTorch 2.13 has them), and replaying a run that
used one (issue 24, item 2)."""

from __future__ import annotations

import json
import pickle
import threading

import pytest

from minialloc import CachingAllocator, MiB, SimulatedGPU
from minialloc.cli import main
from minialloc.replay import check_trace
from minialloc.trace import read_device_trace


def pools_of(a: CachingAllocator) -> list[tuple[tuple[int, int], str, int]]:
    return [(tuple(s["segment_pool_id"]), s["segment_type"], s["total_size"]) for s in a.snapshot()["segments"]]


def test_mem_pools_get_pytorchs_ids_and_use_counts():
    a = CachingAllocator(SimulatedGPU("1GiB"))
    first, second = a.mem_pool(), a.mem_pool()
    assert (first.id, second.id) == ((0, 1), (0, 2))
    assert first.use_count() == 1  # the handle itself
    with a.use_mem_pool(first):
        assert first.use_count() == 2  # plus the open context
        with a.use_mem_pool(second):
            assert second.use_count() == 2
    assert (first.use_count(), second.use_count()) == (1, 1)
    with pytest.raises(ValueError, match="MemPool of this allocator"):
        with CachingAllocator(SimulatedGPU("1GiB")).use_mem_pool(first):
            pass


def test_a_private_pool_serves_only_its_own_allocations_and_frees_return_to_it():
    a = CachingAllocator(SimulatedGPU("1GiB"))
    a.free(a.malloc(4))  # a cached small block in the default pool
    pool = a.mem_pool()
    with a.use_mem_pool(pool):
        inside = a.malloc(4)  # not the default pool's cached block: a new 2 MiB segment of the private pool
        big = a.malloc(3 * MiB)
    assert pools_of(a) == [((0, 0), "small", 2 * MiB), ((0, 1), "small", 2 * MiB), ((0, 1), "large", 20 * MiB)]
    a.free(big)  # freed outside the context: back to the private pool all the same
    outside = a.malloc(3 * MiB)  # the default pool never takes the private pool's cached 20 MiB
    assert len(pools_of(a)) == 4 and pools_of(a)[-1] == ((0, 0), "large", 20 * MiB)
    assert {s["segment_pool_id"] for s in pool.snapshot()} == {(0, 1)}
    a.free(inside)
    a.free(outside)
    a.check_invariants()


def test_empty_cache_keeps_a_pool_in_use_and_frees_it_once_its_handle_is_gone():
    a = CachingAllocator(SimulatedGPU("1GiB"))
    pool = a.mem_pool()
    with a.use_mem_pool(pool):
        a.free(a.malloc(30 * MiB))
    a.free(a.malloc(30 * MiB))
    a.empty_cache()
    assert pools_of(a) == [((0, 1), "large", 30 * MiB)]  # why a CUDA graph's memory does not come back
    del pool  # its finalizer runs as the last reference goes, as ~MemPool does (no gc.collect() needed)
    a.empty_cache()
    assert a.memory_reserved() == 0 and pools_of(a) == []
    a.check_invariants()


def test_only_the_thread_inside_use_mem_pool_is_routed():
    a = CachingAllocator(SimulatedGPU("1GiB"))
    pool = a.mem_pool()
    got: list[int] = []
    with a.use_mem_pool(pool):
        worker = threading.Thread(target=lambda: got.append(a.malloc(4)))
        worker.start()
        worker.join()
        mine = a.malloc(4)
    by_address = {s["address"]: s["segment_pool_id"] for s in a.snapshot()["segments"]}
    assert by_address[got[0]] == (0, 0) and by_address[mine] == (0, 1)


def test_a_run_with_a_private_pool_replays_at_every_recorded_address(tmp_path, capsys):
    a = CachingAllocator(SimulatedGPU("4GiB"))
    a.record_memory_history()
    weights = [a.malloc(n * MiB) for n in (12, 3, 40)]
    pool = a.mem_pool()
    for step in range(3):
        with a.use_mem_pool(pool):
            graph = [a.malloc(n) for n in (4, 700_000, 5 * MiB, 33 * MiB)]
        scratch = [a.malloc(n) for n in (4, 6 * MiB, 33 * MiB)]  # the same sizes: must not land in the pool
        for p in graph[1::2] + scratch:
            a.free(p)
        if step == 1:
            a.empty_cache()  # leaves the pool's segments alone
    snap = a.snapshot()
    assert {s["segment_pool_id"] for s in snap["segments"]} == {(0, 0), (0, 1)}
    trace = read_device_trace(snap, 0)
    assert trace.pool_of and set(trace.pool_of.values()) == {(0, 1)}
    check = check_trace(trace, "")
    assert check.at_recorded_address == check.allocations == 3 + 3 * 7, check.summary()
    path = tmp_path / "pool.pickle"
    path.write_bytes(pickle.dumps(snap))
    assert main(["replay", str(path), "--check"]) == 0
    assert main(["diagnose", str(path), "--json", "--no-replay"]) == 0
    (d,) = json.loads(capsys.readouterr().out.split("\n", 2)[2])["devices"]
    assert any(p["pool"].startswith("private (0, 1)") for p in d["pools"]) and weights
