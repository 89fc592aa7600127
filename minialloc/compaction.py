"""Compaction: move live blocks so that the free space of each segment becomes one piece (allocator.defragment()).

PyTorch cannot do this: a tensor's address escapes into views, kernel arguments, other libraries and CUDA graphs,
so a block can never move. minialloc can move the blocks allocated through a Buffer, a handle whose address is
looked up at each use (`buf.ptr`): between two uses the allocator may copy its bytes elsewhere and update it.

What moves and what stays:
- a block allocated through a Buffer, with no use recorded on another stream, may move;
- a block allocated by malloc (its raw pointer is out there), a block used on another stream (record_stream:
  that stream may still be reading it), and a freed block waiting on such events are PINNED: they never move.

Within a segment, movable blocks slide toward the segment's start, keeping their order, so the free space between
two pinned blocks (or the segment's ends) becomes one piece; with nothing pinned, one piece per segment. Moving
within a segment is the safe default: a segment is one device allocation, its blocks share one stream (launches
there are ordered after the program's own work on it), and no other segment's bookkeeping changes. The data moves
with the kernels (debug.DeviceData): on a GPU, block_copy launches on the segment's stream, in move_plan's order
where source and destination overlap (a block moved down by d < its size takes ceil(size / d) launches); on a
SimulatedGPU(store_data=True), their NumPy twins. On an accounting-only simulator there are no bytes: only the
bookkeeping moves, and no host memory is touched.

release_empty=True goes further: a segment whose blocks can all move, and all fit into the holes of other segments
of the same pool and stream, is emptied into them and given back to the device. Segments are tried emptiest first,
and a segment that received blocks is not emptied afterwards.

Expandable segments are skipped: their holes cost no memory once empty_cache unmaps the wholly free pages in
them, and a new request maps pages at the end of the range, so packing them would gain nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from sortedcontainers import SortedList

from .allocator import Block, BlockPool, InvalidPointerError
from .debug import DeviceData, device_data
from .kernels.reference import POISON

if TYPE_CHECKING:
    from .allocator import CachingAllocator


class Buffer:
    """nbytes of device memory on `stream`, allocated by `allocator.buffer(nbytes, stream)`.

    Read `buf.ptr` each time you launch work on it: defragment() may have moved it. Free it with buf.free()
    (allocator.free(buf.ptr) is refused). read() and write() reach its bytes where the device holds data."""

    __slots__ = ("_allocator", "_block", "nbytes", "stream")

    def __init__(self, allocator: CachingAllocator, nbytes: int, stream: int = 0) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"a Buffer needs a positive int number of bytes, got {nbytes!r}")
        self._allocator = allocator
        self.nbytes = nbytes
        self.stream = stream
        with allocator._lock:
            ptr = allocator.malloc(nbytes, stream)
            self._block: Block | None = allocator._active[ptr]
            allocator._buffers[self._block] = self
            if "free" not in allocator.__dict__:
                allocator._bind_checked_methods()  # from now on free(ptr) must refuse a Buffer's pointer

    @property
    def ptr(self) -> int:
        """The current address (it changes when defragment() moves the block)."""
        block = self._block
        if block is None:
            raise InvalidPointerError("this Buffer has been freed")
        return block.ptr

    @property
    def freed(self) -> bool:
        return self._block is None

    def free(self) -> None:
        a = self._allocator
        with a._lock:
            block = self._block
            if block is None:
                raise InvalidPointerError("Buffer.free(): this Buffer was already freed (double free?)")
            del a._buffers[block]
            self._block = None
            a.free(block.ptr)  # may raise GuardViolation in debug mode, after the free is done

    def _data(self) -> DeviceData:
        data = device_data(self._allocator.device)
        if data is None:
            raise RuntimeError("this device holds no data (accounting only): use SimulatedGPU(store_data=True)")
        return data

    def write(self, data: bytes | np.ndarray, offset: int = 0) -> None:
        """Copy bytes into the buffer at `offset`."""
        src = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
        src = np.ascontiguousarray(src).reshape(-1)
        if offset < 0 or offset + src.size > self.nbytes:
            raise ValueError(f"write of {src.size} bytes at offset {offset} runs past the buffer's {self.nbytes}")
        with self._allocator._lock:  # so the block cannot move between reading ptr and writing
            self._data().write(self.ptr + offset, src, self.stream)

    def read(self, nbytes: int | None = None, offset: int = 0) -> np.ndarray:
        """A host copy of nbytes (default: up to the end) from `offset`."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"read of {nbytes} bytes at offset {offset} runs past the buffer's {self.nbytes}")
        with self._allocator._lock:
            return self._data().read(self.ptr + offset, nbytes, self.stream)

    def __repr__(self) -> str:
        where = "freed" if self._block is None else f"{self._block.ptr:#x}"
        return f"Buffer({where}, {self.nbytes} bytes, stream={self.stream})"


@dataclass(frozen=True)
class DefragmentReport:
    bytes_moved: int
    blocks_moved: int
    blocks_pinned: int  # live blocks that could not move: raw pointers, other streams' uses, pending frees
    segments_compacted: int  # segments in which at least one block moved
    segments_released: int  # release_empty=True: segments emptied and given back to the device
    bytes_released: int
    largest_free_before: int  # the largest cached free block, before and after
    largest_free_after: int


def defragment(a: CachingAllocator, release_empty: bool = False) -> DefragmentReport:
    """Compact every ordinary segment of `a` (see the module's docstring); the caller holds a's lock."""
    if a._events:
        a._process_events()  # frees whose events completed are free space now, not pinned blocks
    data = device_data(a.device)  # None: accounting only, nothing to copy
    before = a._largest_cached_block()
    note, a._trace_note = a._trace_note, "defragment"
    tally = dict.fromkeys(("bytes_moved", "blocks_moved", "blocks_pinned", "segments_compacted",
                           "segments_released", "bytes_released"), 0)
    try:
        for head in _segment_heads(a):
            moved, nbytes, pinned = _compact_segment(a, _blocks(head), data)
            tally["blocks_moved"] += moved
            tally["bytes_moved"] += nbytes
            tally["blocks_pinned"] += pinned
            tally["segments_compacted"] += moved > 0
        if release_empty:
            for pool in (a._small, a._large):
                moved, nbytes, released, released_bytes = _release_empty(a, pool, data)
                tally["blocks_moved"] += moved
                tally["bytes_moved"] += nbytes
                tally["segments_released"] += released
                tally["bytes_released"] += released_bytes
    finally:
        a._trace_note = note
    return DefragmentReport(**tally, largest_free_before=before, largest_free_after=a._largest_cached_block())


# -- what a block is ------------------------------------------------------------------------------------------------
def _movable(a: CachingAllocator, b: Block) -> bool:
    return b.allocated and not b.stream_uses and b in a._buffers


def _free(b: Block) -> bool:
    return not b.allocated and b.event_count == 0  # in its pool (a free block never keeps stream_uses)


def _segment_heads(a: CachingAllocator, pool: BlockPool | None = None) -> list[Block]:
    return [b for b in a._all_blocks()
            if b.prev is None and b.segment is None and (pool is None or b.pool is pool)]


def _blocks(b: Block) -> list[Block]:
    """Every block of b's segment, by address."""
    while b.prev is not None:
        b = b.prev
    out = []
    while b is not None:
        out.append(b)
        b = b.next
    return out


def _split_free(blocks: list[Block]) -> tuple[int, int]:
    """inactive_split and inactive_split_bytes of one segment: free blocks of a segment split in pieces."""
    pieces = [b.size for b in blocks if _free(b) and b.is_split()]
    return len(pieces), sum(pieces)


def _update_split_stats(a: CachingAllocator, small: bool, before: tuple[int, int], after: tuple[int, int]) -> None:
    for name, old, new in (("inactive_split", before[0], after[0]), ("inactive_split_bytes", before[1], after[1])):
        if new > old:
            a.stats.increase(name, small, new - old)
        elif new < old:
            a.stats.decrease(name, small, old - new)


def _move(a: CachingAllocator, b: Block, dst: int, data: DeviceData | None) -> None:
    """Copy a live block's bytes to dst and re-key it; its Block object, and so its Buffer, stay the same."""
    src = b.ptr
    if data is not None:
        data.move(dst, src, b.size, b.stream)
    if a._trace is not None:  # PyTorch's trace has no "move": a free and an alloc keep replays and timelines right
        a._record("free_requested", src, b.requested_size, b.stream, b.frames)
        a._record("free_completed", src, b.requested_size, b.stream, b.frames)
        a._record("alloc", dst, b.requested_size, b.stream, b.frames)
    del a._active[src]
    b.ptr = dst
    a._active[dst] = b


# -- within a segment -----------------------------------------------------------------------------------------------
def _compact_segment(a: CachingAllocator, blocks: list[Block], data: DeviceData | None
                     ) -> tuple[int, int, int]:
    """Slide the movable blocks of each run between pinned blocks to the run's start, free space after them.
    Returns (blocks moved, bytes moved, pinned live blocks)."""
    pool = blocks[0].pool
    split_before = _split_free(blocks)
    order: list[Block] = []  # the segment's blocks in their new order
    pieces: list[Block] = []  # the new free pieces, to go into the pool
    moved = moved_bytes = pinned = 0
    run: list[Block] = []
    for b in [*blocks, None]:
        if b is not None and (_movable(a, b) or _free(b)):
            run.append(b)
            continue
        live = [r for r in run if r.allocated]
        free = [r for r in run if not r.allocated]
        if live and free and not (len(free) == 1 and run[-1] is free[0]):  # else the run is packed already
            cursor, end = run[0].ptr, run[-1].ptr + run[-1].size
            for f in free:
                pool.remove(f)
            for r in live:
                if r.ptr != cursor:
                    _move(a, r, cursor, data)
                    moved, moved_bytes = moved + 1, moved_bytes + r.size
                cursor += r.size
            piece = free[0]  # reuse one free Block for the single piece left
            piece.ptr, piece.size = cursor, end - cursor
            pieces.append(piece)
            run = [*live, piece]
        order += run
        run = []
        if b is not None:
            order.append(b)
            pinned += b.allocated or b.event_count > 0
    if not pieces:
        return 0, 0, pinned
    for b, prev, nxt in zip(order, [None, *order[:-1]], [*order[1:], None], strict=True):
        b.prev, b.next = prev, nxt
    for piece in pieces:
        if a._debug is not None and data is not None:
            data.fill(piece.ptr, piece.size, POISON, piece.stream)  # stale bytes of moved blocks read as freed
        pool.insert(piece)
    _update_split_stats(a, pool.is_small, split_before, _split_free(order))
    return moved, moved_bytes, pinned


# -- across segments: empty whole segments into the holes of others --------------------------------------------------
def _release_empty(a: CachingAllocator, pool: BlockPool, data: DeviceData | None
                   ) -> tuple[int, int, int, int]:
    """Returns (blocks moved, bytes moved, segments released, bytes released)."""
    segments = [_blocks(h) for h in _segment_heads(a, pool)]
    candidates = [s for s in segments
                  if any(b.allocated for b in s) and all(_movable(a, b) or _free(b) for b in s)]
    candidates.sort(key=lambda s: (sum(b.size for b in s if b.allocated), s[0].ptr))
    receivers: set[int] = set()  # segments (by start address) that took blocks: never emptied afterwards
    moved = moved_bytes = released = released_bytes = 0
    for seg in candidates:
        base = seg[0].ptr
        if base in receivers:
            continue
        plan = _plan(a, pool, seg)
        if plan is None:
            continue
        for b, hole in plan:
            receivers.add(_blocks(hole)[0].ptr)
            moved, moved_bytes = moved + 1, moved_bytes + b.size
            last = _place(a, b, hole, data)
        assert last.prev is None and last.next is None, "an emptied segment is one free block"
        released, released_bytes = released + 1, released_bytes + last.size
        a._release_block(last)
    return moved, moved_bytes, released, released_bytes


def _plan(a: CachingAllocator, pool: BlockPool, seg: list[Block]) -> list[tuple[Block, Block]] | None:
    """Best fit, largest block first, of seg's live blocks into free holes of other segments with live blocks on
    the same stream; None unless all fit. Several blocks may share a hole: each takes the front of what is left."""
    stream, base = seg[0].stream, seg[0].ptr
    holes = SortedList()  # (room, address, hole): room and address are unique, the Block is never compared
    for key in pool.blocks:
        h: Block = key[3]
        if h.stream != stream or h.segment is not None or not h.is_split() or _blocks(h)[0].ptr == base:
            continue  # a wholly free segment is no target: filling it would not shrink what is reserved
        if h.size >= a._max_split:
            continue  # the allocator never splits an oversize block for a smaller request, nor do we
        holes.add((h.size, h.ptr, h))
    plan = []
    for b in sorted((b for b in seg if b.allocated), key=lambda b: -b.size):
        i = holes.bisect_left((b.size,))
        if i == len(holes):
            return None
        room, addr, hole = holes.pop(i)
        plan.append((b, hole))
        if room > b.size:
            holes.add((room - b.size, addr + b.size, hole))
    return plan


def _place(a: CachingAllocator, b: Block, hole: Block, data: DeviceData | None) -> Block:
    """Move live block b to the front of free block `hole` (another segment); b's old place becomes free and
    merges with its free neighbours. Returns that free block."""
    pool = b.pool
    old_seg, new_seg = _blocks(b), _blocks(hole)
    split_before = _split_free(old_seg), _split_free(new_seg)
    gap = Block(b.ptr, b.size, b.stream, pool)
    gap.splice(b.prev, b.next)  # take b out of its segment
    _move(a, b, hole.ptr, data)
    pool.remove(hole)
    if hole.size == b.size:
        b.splice(hole.prev, hole.next)
    else:
        b.splice(hole.prev, hole)
        hole.ptr, hole.size = hole.ptr + b.size, hole.size - b.size
        pool.insert(hole)
    for neighbour in (gap.prev, gap.next):
        a._try_merge_blocks(gap, neighbour, pool)
    if a._debug is not None and data is not None:
        data.fill(gap.ptr, gap.size, POISON, gap.stream)
    pool.insert(gap)
    for old, new in zip(split_before, (_split_free(_blocks(gap)), _split_free(_blocks(b))), strict=True):
        _update_split_stats(a, pool.is_small, old, new)
    return gap
