"""Block surgery inside expandable segments: where a request fits, and how blocks split and merge when pages are
mapped under them or unmapped from them.

The allocator keeps the decisions and the accounting (allocator.py: find_expandable_block, map_block,
unmap_block, which count reserved bytes and write trace entries); expandable.py talks to the driver; this module
only edits the block lists, the part of those PyTorch functions that is the same whatever is counted.
"""

from __future__ import annotations

from .blocks import Block, BlockPool, try_merge_blocks
from .expandable import ExpandableSegment

__all__ = ["find_room", "map_front", "range_block", "unmap_free_pages"]


def _allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses


def find_room(pool: BlockPool, size: int, stream: int) -> Block | None:
    """The lowest place in this stream's expandable segments with `size` bytes of free-or-unmapped address space
    (find_expandable_block's search): a free mapped block just before an unmapped hole, or the hole itself."""
    unmapped = pool.unmapped
    i = unmapped.bisect_left((stream,))
    while i < len(unmapped):
        found_stream, _ptr, c = unmapped[i]
        if found_stream != stream:
            break
        if _allocatable(c.prev):
            c = c.prev  # a free mapped block just before the hole can be part of the answer
        room, b = 0, c
        while room < size and _allocatable(b):
            room += b.size
            b = b.next
        if room >= size:
            return c
        i += 1
    return None


def range_block(segment: ExpandableSegment, pool: BlockPool) -> Block:
    """A new segment's whole address range as one unmapped block of `pool`."""
    block = Block(segment.ptr, segment.size, segment.stream, pool)
    block.mapped = False
    block.segment = segment
    pool.insert_unmapped(block)
    return block


def map_front(to_map: Block, size: int) -> tuple[int, int]:
    """Map pages under the front `size` bytes of an unmapped block, and merge it with free neighbours (map_block's
    edits); returns (address, bytes mapped), bytes 0 when the device had no page."""
    assert to_map.segment is not None and not to_map.mapped and size <= to_map.size
    mapped = to_map.segment.map(to_map.ptr, size)
    if mapped == 0:
        return to_map.ptr, 0
    pool = to_map.pool
    pool.remove_unmapped(to_map)
    to_map.mapped = True
    if mapped < to_map.size:
        remaining = Block(to_map.ptr + mapped, to_map.size - mapped, to_map.stream, pool)
        remaining.mapped = False
        remaining.segment = to_map.segment
        remaining.splice(to_map, to_map.next)
        pool.insert_unmapped(remaining)
        to_map.size = mapped
    mapped_ptr = to_map.ptr
    try_merge_blocks(to_map, to_map.prev, pool)
    try_merge_blocks(to_map, to_map.next, pool)
    pool.insert(to_map)
    return mapped_ptr, mapped


def unmap_free_pages(block: Block) -> tuple[int, int]:
    """Unmap every wholly free page of a free expandable block (unmap_block's edits): the pieces before and after
    the pages stay free mapped blocks, the unmapped part merges with unmapped neighbours. Returns (address, bytes
    unmapped), bytes 0 when no whole page was free."""
    assert block.segment is not None
    ptr, size = block.segment.unmap(block.ptr, block.size)
    if size == 0:
        return ptr, 0
    pool = block.pool
    pool.remove(block)
    before = ptr - block.ptr
    if before > 0:
        head = Block(block.ptr, before, block.stream, pool)
        head.segment = block.segment
        head.splice(block.prev, block)
        pool.insert(head)
    after = block.size - before - size
    if after > 0:
        tail = Block(ptr + size, after, block.stream, pool)
        tail.segment = block.segment
        tail.splice(block, block.next)
        pool.insert(tail)
    block.ptr, block.size, block.mapped = ptr, size, False
    try_merge_blocks(block, block.prev, pool)
    try_merge_blocks(block, block.next, pool)
    pool.insert_unmapped(block)
    return ptr, size
