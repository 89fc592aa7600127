"""State restore: a recorded run's segments rebuilt, at their recorded addresses, inside an empty allocator.

PyTorch has no such call. A replay needs it because a real trace starts mid-run, over segments that existed before
its first entry (minialloc.replay.state_at_trace_start works out which). CachingAllocator.restore_segments,
held_pool, replay_pool and release_cached_segment delegate here; nothing on the malloc/free path does.

This module is the allocator's friend (as a C++ friend function): it writes the allocator's block tables and
counters directly, the way alloc_found_block and alloc_block would have left them, because going through malloc
could not put blocks at given addresses. The allocator imports it; it sees the allocator only through the
AllocatorTables protocol (tables.py), never by importing allocator.py.
"""

from __future__ import annotations

from .blocks import Block, BlockPool
from .devices.base import DeviceOutOfMemory
from .expandable import ExpandableSegment, reservation_pages
from .mempool import DEFAULT_POOL, PoolId
from .tables import AllocatorTables

__all__ = ["held_pool", "release_cached_segment", "restore_segments"]


def restore_segments(a: AllocatorTables, segments: list[dict]) -> None:
    """Rebuild segments and blocks given in the snapshot schema (see snapshot.py) at their own addresses.

    The allocator must be empty, and the device must place memory where it is told (SimulatedGPU.place_next; a
    real driver picks its own addresses, so it is refused). 'active_pending_free' blocks come back free: the
    events they waited on are not in a snapshot. Peak statistics start at the restored state."""
    if not getattr(a.device, "supports_placement", False):
        raise TypeError(f"{type(a.device).__name__} chooses its own addresses: a recorded state can only "
                        "be rebuilt on a SimulatedGPU")
    with a.lock:
        if a._total_reserved or a._active or a._expandable_segments:
            raise ValueError("restore_segments needs an allocator that holds no memory yet")
        ordinary = [s for s in segments if not s.get("is_expandable")]
        for seg in sorted(ordinary, key=lambda s: s["address"]):
            _restore_ordinary(a, seg)
        ranges: dict[tuple[int, bool, PoolId], list[dict]] = {}
        for seg in segments:
            if seg.get("is_expandable"):
                key = (seg["stream"], seg.get("segment_type") == "small",
                       tuple(seg.get("segment_pool_id", DEFAULT_POOL)))
                ranges.setdefault(key, []).append(seg)
        for (stream, small, _pool_id), group in sorted(ranges.items()):
            _restore_expandable(a, stream, small, sorted(group, key=lambda s: s["address"]))
        a.stats.reset_peak()


def held_pool(a: AllocatorTables, pool_id: PoolId) -> tuple[BlockPool, BlockPool]:
    """The private pool with this id as (small, large), made if new and held for good (a recorded run's pool,
    whose handle a replay does not have: empty_cache never frees it)."""
    if pool_id not in a._private:
        a._incref_pool(pool_id)
    private = a._private[pool_id]
    return private.small, private.large


def release_cached_segment(a: AllocatorTables, ptr: int) -> bool:
    """Give back the cached segment starting at ptr if it is wholly free (release_block); False if not. A replay
    following a recorded run releases exactly the segments the run released."""
    with a.lock:
        for pool in a._block_pools():
            for b in pool.free_blocks():
                if b.ptr == ptr and b.segment is None and not b.is_split():
                    a._release_block(b)
                    return True
        return False


def _restore_blocks(a: AllocatorTables, seg: dict, pool: BlockPool, segment: ExpandableSegment | None,
                    prev: Block | None) -> Block | None:
    """Blocks of one segment (or one mapped range), spliced after prev, counted as alloc_found_block and
    free_block count them; returns the last one."""
    stream, small = seg["stream"], pool.is_small
    stats = a.stats
    end = seg["address"]
    split = segment is None and len(seg["blocks"]) > 1
    for info in seg["blocks"]:
        address = info.get("address", end)
        if address != end:
            raise ValueError(f"segment {seg['address']:#x}: block at {address:#x}, expected {end:#x}")
        b = Block(address, info["size"], stream, pool)
        b.segment = segment
        b.splice(prev, None)
        if info["state"] == "active_allocated":
            b.allocated = True
            b.requested_size = info.get("requested_size", info["size"])
            b.frames = list(info.get("frames", ()))
            a._active[address] = b
            stats.block_allocated(small, b.size, b.requested_size)
            if b.size >= a.max_split_size:
                stats.oversize_allocations.increase(1)
        else:
            if prev is not None and prev.mapped and not prev.allocated:
                raise ValueError(f"segment {seg['address']:#x}: free blocks at {prev.ptr:#x} and {address:#x} "
                                 "are neighbours; a consistent state has them merged")
            pool.insert(b)
            if split:
                stats.increase("inactive_split", small, 1)
                stats.increase("inactive_split_bytes", small, b.size)
        prev, end = b, address + b.size
    if end != seg["address"] + seg["total_size"]:
        raise ValueError(f"segment {seg['address']:#x}: blocks end at {end:#x}, total_size says "
                         f"{seg['address'] + seg['total_size']:#x}")
    a._total_reserved += seg["total_size"]
    stats.increase("reserved_bytes", small, seg["total_size"])
    return prev


def _restore_pools(a: AllocatorTables, seg: dict) -> tuple[BlockPool, BlockPool]:
    """(small, large) of the segment's pool; a private one is made, held by the run, if it is new."""
    pool_id = tuple(seg.get("segment_pool_id", DEFAULT_POOL))
    return a.pools() if pool_id == DEFAULT_POOL else held_pool(a, pool_id)  # type: ignore[arg-type]


def _restore_ordinary(a: AllocatorTables, seg: dict) -> None:
    small = seg.get("segment_type") == "small"
    pool = _restore_pools(a, seg)[0 if small else 1]
    a.device.place_next(seg["address"])
    try:
        a.device.malloc(seg["total_size"])
    except DeviceOutOfMemory:
        raise ValueError(f"the device is too small for the recorded segments: {a.device!r} cannot hold "
                         f"the segment at {seg['address']:#x}") from None
    _restore_blocks(a, seg, pool, None, None)
    a.stats.increase("segment", small, 1)
    if seg["total_size"] >= a.max_split_size:
        a.stats.oversize_segments.increase(1)


def _restore_expandable(a: AllocatorTables, stream: int, small: bool, ranges: list[dict]) -> None:
    """Expandable segments holding `ranges` (mapped ranges of one stream and pool, by address): each reservation
    starts at the lowest range not in the one before (PyTorch maps from the start of a range up), with its pages
    mapped under the ranges and unmapped blocks in the gaps."""
    page = a._expandable_page_size(small)
    reservation = reservation_pages(a.device.total_memory, page) * page  # as ExpandableSegment reserves
    group: list[dict] = []
    for seg in ranges:
        if group and seg["address"] + seg["total_size"] > group[0]["address"] + reservation:
            _restore_reservation(a, stream, small, group)
            group = []
        group.append(seg)
    if group:
        _restore_reservation(a, stream, small, group)


def _restore_reservation(a: AllocatorTables, stream: int, small: bool, ranges: list[dict]) -> None:
    pool = _restore_pools(a, ranges[0])[0 if small else 1]
    a.device.place_next_reservation(ranges[0]["address"])
    segment = ExpandableSegment(a.device, stream, a._expandable_page_size(small))
    a._expandable_segments.append(segment)
    prev: Block | None = None
    end = segment.ptr

    def hole(ptr: int, size: int, before: Block | None) -> Block:
        b = Block(ptr, size, stream, pool)
        b.mapped, b.segment = False, segment
        b.splice(before, None)
        pool.insert_unmapped(b)
        return b

    for seg in ranges:
        if seg["address"] + seg["total_size"] > segment.ptr + segment.size:
            raise ValueError(f"expandable range {seg['address']:#x}+{seg['total_size']} does not fit in a "
                             f"{segment.size}-byte reservation: give the device more capacity")
        if segment.map(seg["address"], seg["total_size"]) != seg["total_size"]:
            raise ValueError(f"the device is too small for the recorded segments: {a.device!r} cannot map "
                             f"{seg['total_size']} bytes at {seg['address']:#x}")
        if seg["address"] > end:
            prev = hole(end, seg["address"] - end, prev)
        prev = _restore_blocks(a, seg, pool, segment, prev)
        end = seg["address"] + seg["total_size"]
    if end < segment.ptr + segment.size:
        hole(end, segment.ptr + segment.size - end, prev)
