"""Blocks and pools: the caching allocator's data, apart from its rules (allocator.py), so that the extensions
written against the allocator's seam (extension.py: debug guards, compaction) can name them without importing
the allocator itself.

A BLOCK is a piece of a segment: handed out (allocated), free in a pool, or, in an expandable segment, address
space with no pages behind it. A POOL keeps its free blocks in two sorted lists whose entries are plain tuples,
the cheapest keys SortedList can compare on the hot path:

- `pool.blocks`: (stream, size, ptr, block), in best-fit order (BlockComparatorSize);
- `pool.unmapped`: (stream, ptr, block), expandable segments only (BlockComparatorAddress).

Read an entry by unpacking it (`stream, size, ptr, block = entry`) or through `free_blocks()` /
`unmapped_blocks()`, never by position: the block is last in both, but the two layouts differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from .expandable import ExpandableSegment


class InvalidPointerError(ValueError):
    """free or record_stream was given a pointer this allocator did not hand out, or handed out and took back."""

    @classmethod
    def about(cls, what: str, ptr: int, blocks: Iterable[Block]) -> InvalidPointerError:
        """The error for `what(ptr)` saying what the pointer is, among the allocator's `blocks`: freed already,
        inside a block, or not the allocator's at all."""
        for block in blocks:
            if block.ptr == ptr:
                return cls(f"{what}({ptr:#x}): invalid device pointer: this block was already freed (double free?)")
            if block.ptr < ptr < block.ptr + block.size:
                state = "live block" if block.allocated else "free block"
                return cls(
                    f"{what}({ptr:#x}): invalid device pointer: it lies {ptr - block.ptr} bytes inside the {state} "
                    f"at {block.ptr:#x} ({block.size} bytes); pass the address malloc returned"
                )
        return cls(f"{what}({ptr:#x}): invalid device pointer: it was not returned by this allocator's malloc")


class Block:
    """A piece of a segment: handed out (allocated), free in a pool, or (expandable) not backed by pages."""

    __slots__ = (
        "ptr", "size", "requested_size", "stream", "pool", "allocated", "prev", "next", "event_count",
        "stream_uses", "gc_count_base", "mapped", "segment", "key", "frames",
    )

    def __init__(self, ptr: int, size: int, stream: int, pool: BlockPool) -> None:
        self.ptr = ptr
        self.size = size
        self.requested_size = 0
        self.stream = stream
        self.pool = pool
        self.allocated = False
        self.prev: Block | None = None  # neighbours in the same segment, by address
        self.next: Block | None = None
        self.event_count = 0  # events still to complete before this block may be reused
        self.stream_uses: set[int] | None = None  # other streams that used it (record_stream)
        self.gc_count_base = 0
        self.mapped = True  # False only for address space of an expandable segment with no pages behind it
        self.segment: ExpandableSegment | None = None
        self.key: tuple = ()  # its entry in its pool's sorted list while it is there
        self.frames: list[dict] = []

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: Block | None, after: Block | None) -> None:
        """Insert self between two neighbours."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    def segment_blocks(self) -> list[Block]:
        """Every block of this block's segment (or reservation, when expandable), by address."""
        b = self
        while b.prev is not None:
            b = b.prev
        out = []
        cur: Block | None = b
        while cur is not None:
            out.append(cur)
            cur = cur.next
        return out

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({self.ptr:#x}, {self.size}, stream={self.stream}, {state})"


class BlockPool:
    """Free blocks of one size class, ordered by (stream, size, address) for best fit (BlockComparatorSize)."""

    def __init__(self, is_small: bool, pool_id: tuple[int, int] = (0, 0)) -> None:
        self.is_small = is_small
        self.pool_id = pool_id  # (0, 0): the default pools; else a private pool's (mempool.py)
        self.blocks: SortedList = SortedList()  # (stream, size, ptr, block)
        self.unmapped: SortedList = SortedList()  # (stream, ptr, block), expandable segments only
        self.get_free_blocks_call_count = 0  # the clock garbage collection measures block age with

    def insert(self, block: Block) -> None:  # BlockPool::insert_into_blocks
        block.gc_count_base = self.get_free_blocks_call_count
        block.key = (block.stream, block.size, block.ptr, block)
        self.blocks.add(block.key)

    def remove(self, block: Block) -> None:
        self.blocks.remove(block.key)

    def insert_unmapped(self, block: Block) -> None:
        block.key = (block.stream, block.ptr, block)
        self.unmapped.add(block.key)

    def remove_unmapped(self, block: Block) -> None:
        self.unmapped.remove(block.key)

    def free_blocks(self) -> Iterator[Block]:
        """The cached free blocks, in best-fit order (stream, size, address)."""
        for _stream, _size, _ptr, block in self.blocks:
            yield block

    def unmapped_blocks(self) -> Iterator[Block]:
        """The unmapped ranges of expandable segments, by (stream, address)."""
        for _stream, _ptr, block in self.unmapped:
            yield block

    def largest_free_size(self) -> int:
        return max((size for _stream, size, _ptr, _block in self.blocks), default=0)


def try_merge_blocks(dst: Block, src: Block | None, pool: BlockPool) -> int:
    """try_merge_blocks: dst absorbs a free neighbour with no pending work and the same mapped state, which leaves
    its pool. Returns the bytes absorbed (0: no merge)."""
    if src is None or src.allocated or src.event_count > 0 or src.stream_uses or dst.mapped != src.mapped:
        return 0
    if dst.prev is src:  # [src dst]
        dst.ptr = src.ptr
        dst.prev = src.prev
        if dst.prev is not None:
            dst.prev.next = dst
    else:  # [dst src]
        dst.next = src.next
        if dst.next is not None:
            dst.next.prev = dst
    dst.size += src.size
    if src.mapped:
        pool.remove(src)
    else:
        pool.remove_unmapped(src)
    return src.size
