"""The allocator's bookkeeping checked against itself: every block in exactly one place, segments without gaps,
no two free neighbours left unmerged, and every counter equal to what the blocks add up to.

Used by the tests and tools/gpu_check.py through CachingAllocator.check_invariants(). It reads the allocator's
tables directly (a friend, like restore.py, typed through tables.AllocatorTables) and changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blocks import Block
    from .tables import AllocatorTables

__all__ = ["check_allocator_invariants"]


def check_allocator_invariants(a: AllocatorTables) -> None:
    """Assert every invariant of `a`; an AssertionError names the first block or counter that is wrong."""
    heads: list[Block] = []
    seen: set[int] = set()
    for pool in a._block_pools():
        for key in pool.blocks:
            _stream, _size, _ptr, b = key
            assert b.mapped and not b.allocated and b.pool is pool and key == b.key, f"bad pool entry {b}"
        for b in pool.unmapped_blocks():
            assert not b.mapped and b.segment is not None and b.pool is pool, f"bad unmapped entry {b}"
            seen.add(id(b))
    every = list(a._all_blocks())
    for b in every:
        seen.add(id(b))
    starts = [b for b in every if b.prev is None]
    starts += [b for pool in a._block_pools() for b in pool.unmapped_blocks() if b.prev is None]
    for head in starts:
        heads.append(head)
    reserved = allocated = active = active_bytes = requested = 0
    split_blocks = split_bytes = segments = 0
    for head in heads:
        b: Block | None = head
        end = head.ptr
        segments += head.segment is None
        while b is not None:
            assert b.ptr == end, f"gap or overlap at {b}"
            assert id(b) in seen, f"block {b} is in a segment but in no pool and not active"
            if b.mapped:
                reserved += b.size
            if b.allocated:
                allocated += b.size
            if b.allocated or b.event_count > 0:
                active += 1
                active_bytes += b.size
                requested += b.requested_size
            elif b.segment is None and b.is_split():
                split_blocks += 1
                split_bytes += b.size
            if b.next is not None:
                assert b.next.prev is b
                free_here = not b.allocated and b.event_count == 0 and not b.stream_uses
                free_next = not b.next.allocated and b.next.event_count == 0 and not b.next.stream_uses
                assert not (free_here and free_next and b.mapped == b.next.mapped), f"unmerged {b} {b.next}"
            end = b.ptr + b.size
            b = b.next
    assert reserved == a._total_reserved == a.stats.current("reserved_bytes"), (reserved, a._total_reserved)
    current = a.stats.current
    assert allocated == current("allocated_bytes"), (allocated, current("allocated_bytes"))
    assert (active, active_bytes, requested) == (current("active"), current("active_bytes"), current("requested_bytes"))
    assert (split_blocks, split_bytes) == (current("inactive_split"), current("inactive_split_bytes"))
    assert segments == current("segment")
