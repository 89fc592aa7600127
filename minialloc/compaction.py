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
with the kernels (device.data(), a DeviceData): on a GPU, block_copy launches on the segment's stream, in
move_plan's order where source and destination overlap (a block moved down by d < its size takes ceil(size / d)
launches); on a SimulatedGPU(store_data=True), their NumPy twins. On an accounting-only simulator there are no
bytes: only the bookkeeping moves, and no host memory is touched.

release_empty=True goes further: a segment whose blocks can all move, and all fit into the holes of other segments
of the same pool and stream, is emptied into them and given back to the device. Segments are tried emptiest first,
and a segment that received blocks is not emptied afterwards.

Expandable segments are skipped: their holes cost no memory once empty_cache unmaps the wholly free pages in
them, and a new request maps pages at the end of the range, so packing them would gain nothing.

Written against the allocator's seam (extension.py), never its insides: Buffers are tracked by an extension,
BufferRegistry, whose check_free hook refuses free(buf.ptr); blocks are found with block_at() and blocks(), moved
with move_block() and whole free segments given back with release_segment(). So this module does not import the
allocator, and the allocator can offer buffer() and defragment() by importing it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sortedcontainers import SortedList

from .blocks import Block, BlockPool, InvalidPointerError, try_merge_blocks
from .devices.data import DeviceData
from .extension import AllocatorExtension, AllocatorHost


class BufferRegistry(AllocatorExtension):
    """The blocks of one allocator that belong to a Buffer: the ones defragment() may move. Installed with the
    allocator's first Buffer; from then on free() of a Buffer's raw pointer is refused."""

    def __init__(self) -> None:
        self.buffers: dict[Block, Buffer] = {}

    def check_free(self, block: Block) -> None:
        if block in self.buffers:
            raise InvalidPointerError(
                f"free({block.ptr:#x}): this block belongs to a Buffer, which defragment() may move: call its free()"
            )


def buffer_registry(a: AllocatorHost) -> BufferRegistry:
    """a's BufferRegistry, installed on first use."""
    with a.lock:
        return a.find_extension(BufferRegistry) or a.add_extension(BufferRegistry())


class Buffer:
    """nbytes of device memory on `stream`, allocated by `allocator.buffer(nbytes, stream)`.

    Read `buf.ptr` each time you launch work on it: defragment() may have moved it. Free it with buf.free()
    (allocator.free(buf.ptr) is refused). read() and write() reach its bytes where the device holds data."""

    __slots__ = ("_allocator", "_block", "_registry", "nbytes", "stream")

    def __init__(self, allocator: AllocatorHost, nbytes: int, stream: int = 0) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"a Buffer needs a positive int number of bytes, got {nbytes!r}")
        self._allocator = allocator
        self.nbytes = nbytes
        self.stream = stream
        self._registry = buffer_registry(allocator)  # from now on free(ptr) refuses a Buffer's pointer
        with allocator.lock:
            ptr = allocator.malloc(nbytes, stream)
            self._block: Block | None = allocator.block_at(ptr)
            self._registry.buffers[self._block] = self  # type: ignore[index]

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
        with a.lock:
            block = self._block
            if block is None:
                raise InvalidPointerError("Buffer.free(): this Buffer was already freed (double free?)")
            del self._registry.buffers[block]
            self._block = None
            a.free(block.ptr)  # may raise GuardViolation in debug mode, after the free is done

    def _data(self) -> DeviceData:
        data = self._allocator.device.data()
        if data is None:
            raise RuntimeError("this device holds no data (accounting only): use SimulatedGPU(store_data=True)")
        return data

    def write(self, data: bytes | np.ndarray, offset: int = 0) -> None:
        """Copy bytes into the buffer at `offset`."""
        src = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8)
        src = np.ascontiguousarray(src).reshape(-1)
        if offset < 0 or offset + src.size > self.nbytes:
            raise ValueError(f"write of {src.size} bytes at offset {offset} runs past the buffer's {self.nbytes}")
        with self._allocator.lock:  # so the block cannot move between reading ptr and writing
            self._data().write(self.ptr + offset, src, self.stream)

    def read(self, nbytes: int | None = None, offset: int = 0) -> np.ndarray:
        """A host copy of nbytes (default: up to the end) from `offset`."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"read of {nbytes} bytes at offset {offset} runs past the buffer's {self.nbytes}")
        with self._allocator.lock:
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


def defragment(a: AllocatorHost, release_empty: bool = False) -> DefragmentReport:
    """Compact every ordinary segment of `a` (see the module's docstring); the caller holds a's lock."""
    a.process_events()  # frees whose events completed are free space now, not pinned blocks
    data = a.device.data()  # None: accounting only, nothing to copy
    before = a.largest_free_block()
    buffers = buffer_registry(a).buffers
    note = a.get_memory_metadata()
    a.set_memory_metadata("defragment")
    tally = dict.fromkeys(("bytes_moved", "blocks_moved", "blocks_pinned", "segments_compacted",
                           "segments_released", "bytes_released"), 0)
    try:
        for head in _segment_heads(a):
            moved, nbytes, pinned = _compact_segment(a, buffers, head.segment_blocks(), data)
            tally["blocks_moved"] += moved
            tally["bytes_moved"] += nbytes
            tally["blocks_pinned"] += pinned
            tally["segments_compacted"] += moved > 0
        if release_empty:
            for pool in a.pools():
                moved, nbytes, released, released_bytes = _release_empty(a, buffers, pool, data)
                tally["blocks_moved"] += moved
                tally["bytes_moved"] += nbytes
                tally["segments_released"] += released
                tally["bytes_released"] += released_bytes
    finally:
        a.set_memory_metadata(note)
    return DefragmentReport(**tally, largest_free_before=before, largest_free_after=a.largest_free_block())


# -- what a block is ------------------------------------------------------------------------------------------------
def _movable(buffers: dict[Block, Buffer], b: Block) -> bool:
    return b.allocated and not b.stream_uses and b in buffers


def _free(b: Block) -> bool:
    return not b.allocated and b.event_count == 0  # in its pool (a free block never keeps stream_uses)


def _segment_heads(a: AllocatorHost, pool: BlockPool | None = None) -> list[Block]:
    return [b for b in a.blocks()
            if b.prev is None and b.segment is None and (pool is None or b.pool is pool)]


def _split_free(blocks: list[Block]) -> tuple[int, int]:
    """inactive_split and inactive_split_bytes of one segment: free blocks of a segment split in pieces."""
    pieces = [b.size for b in blocks if _free(b) and b.is_split()]
    return len(pieces), sum(pieces)


def _update_split_stats(a: AllocatorHost, small: bool, before: tuple[int, int], after: tuple[int, int]) -> None:
    for name, old, new in (("inactive_split", before[0], after[0]), ("inactive_split_bytes", before[1], after[1])):
        if new > old:
            a.stats.increase(name, small, new - old)
        elif new < old:
            a.stats.decrease(name, small, old - new)


def _move(a: AllocatorHost, b: Block, dst: int, data: DeviceData | None) -> None:
    """Copy a live block's bytes to dst and re-key it; its Block object, and so its Buffer, stay the same."""
    if data is not None:
        data.move(dst, b.ptr, b.size, b.stream)
    a.move_block(b, dst)


def _freed_space(a: AllocatorHost, piece: Block) -> None:
    """Tell the extensions that piece's bytes are nobody's now (debug guards poison them: stale bytes of moved
    blocks read as freed)."""
    for e in a.extensions:
        e.on_free_block(piece)


# -- within a segment -----------------------------------------------------------------------------------------------
def _compact_segment(a: AllocatorHost, buffers: dict[Block, Buffer], blocks: list[Block],
                     data: DeviceData | None) -> tuple[int, int, int]:
    """Slide the movable blocks of each run between pinned blocks to the run's start, free space after them.
    Returns (blocks moved, bytes moved, pinned live blocks)."""
    pool = blocks[0].pool
    split_before = _split_free(blocks)
    order: list[Block] = []  # the segment's blocks in their new order
    pieces: list[Block] = []  # the new free pieces, to go into the pool
    moved = moved_bytes = pinned = 0
    run: list[Block] = []
    for b in [*blocks, None]:
        if b is not None and (_movable(buffers, b) or _free(b)):
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
        _freed_space(a, piece)
        pool.insert(piece)
    _update_split_stats(a, pool.is_small, split_before, _split_free(order))
    return moved, moved_bytes, pinned


# -- across segments: empty whole segments into the holes of others --------------------------------------------------
def _release_empty(a: AllocatorHost, buffers: dict[Block, Buffer], pool: BlockPool, data: DeviceData | None
                   ) -> tuple[int, int, int, int]:
    """Returns (blocks moved, bytes moved, segments released, bytes released)."""
    segments = [h.segment_blocks() for h in _segment_heads(a, pool)]
    candidates = [s for s in segments
                  if any(b.allocated for b in s) and all(_movable(buffers, b) or _free(b) for b in s)]
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
            receivers.add(hole.segment_blocks()[0].ptr)
            moved, moved_bytes = moved + 1, moved_bytes + b.size
            last = _place(a, b, hole, data)
        assert last.prev is None and last.next is None, "an emptied segment is one free block"
        released, released_bytes = released + 1, released_bytes + last.size
        a.release_segment(last)
    return moved, moved_bytes, released, released_bytes


def _plan(a: AllocatorHost, pool: BlockPool, seg: list[Block]) -> list[tuple[Block, Block]] | None:
    """Best fit, largest block first, of seg's live blocks into free holes of other segments with live blocks on
    the same stream; None unless all fit. Several blocks may share a hole: each takes the front of what is left."""
    stream, base = seg[0].stream, seg[0].ptr
    holes = SortedList()  # (room, address, hole): room and address are unique, the Block is never compared
    for h in pool.free_blocks():
        if h.stream != stream or h.segment is not None or not h.is_split() or h.segment_blocks()[0].ptr == base:
            continue  # a wholly free segment is no target: filling it would not shrink what is reserved
        if h.size >= a.max_split_size:
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


def _place(a: AllocatorHost, b: Block, hole: Block, data: DeviceData | None) -> Block:
    """Move live block b to the front of free block `hole` (another segment); b's old place becomes free and
    merges with its free neighbours. Returns that free block."""
    pool = b.pool
    old_seg, new_seg = b.segment_blocks(), hole.segment_blocks()
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
        try_merge_blocks(gap, neighbour, pool)
    _freed_space(a, gap)
    pool.insert(gap)
    split_after = _split_free(gap.segment_blocks()), _split_free(b.segment_blocks())
    for old, new in zip(split_before, split_after, strict=True):
        _update_split_stats(a, pool.is_small, old, new)
    return gap
