"""The caching allocator: PyTorch's CUDA caching allocator, rule for rule, in Python.

Why cache at all? cudaMalloc and cudaFree are slow (they can synchronize the whole device), and a training step
allocates and frees thousands of tensors. So the allocator asks the device for big SEGMENTS, cuts them into
BLOCKS for the program, and keeps freed blocks for reuse instead of giving them back. The rules, each mirroring a
function of DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp:

1. Rounding (round_size). Every request is rounded up to a multiple of 512 bytes; optionally
   (roundup_power2_divisions) to one of N equal steps between two powers of two, so slightly different sizes
   share blocks.
2. Two pools (get_pool). Rounded sizes up to 1 MiB go to the small pool, larger ones to the large pool; the pools
   never lend to each other.
3. Segment sizes (get_allocation_size). A small request gets a 2 MiB segment; a large one under 10 MiB gets a
   20 MiB segment; a larger one gets exactly its size rounded up to 2 MiB.
4. Best fit per stream (get_free_block). Free blocks are ordered by (stream, size, address); a request takes the
   smallest free block of at least its size ON THE SAME STREAM. With max_split_size set, big "oversize" blocks
   only serve big requests, and only when they waste less than max_non_split_rounding.
5. Splitting (should_split). If the block found is bigger than needed, the front is handed out and the rest goes
   back to the pool: always in the small pool (remainder >= 512 B), in the large pool only when the remainder is
   over 1 MiB and the request is under max_split_size. An unsplit remainder stays inside the handed-out block.
6. Merging (free_block, try_merge_blocks). A freed block merges with free neighbours of its segment, so a segment
   whose blocks are all free is one block again, and only then can it go back to the device.
7. When nothing fits (malloc): garbage-collect old cached blocks if a memory fraction and
   garbage_collection_threshold are set; ask the device for a new segment (alloc_block); on failure release one
   oversize cached block big enough, or several (release_available_cached_blocks), and retry; then release EVERY
   unsplit cached block (release_cached_blocks, what empty_cache does) and retry once more; then raise
   OutOfMemoryError.
8. Streams (record_stream, insert_events, process_events). A block used on another stream is freed only when
   events recorded on those streams complete; meanwhile it is "active_pending_free".

Why fragmentation kills programs: a segment can go back to the device only when ALL of its blocks are free. A
few live blocks scattered over many segments pin them all, and their free pieces are too small or on the wrong
stream for the request at hand. empty_cache cannot help then; expandable segments (expandable.py) can.

Expandable segments (expandable_segments:True): instead of one device malloc per segment, one virtual range per
(stream, pool) grows by mapping pages where a block needs them, and empty_cache unmaps every wholly free page.

Sizes of 0: malloc(0) returns the null pointer 0 and touches nothing, as PyTorch's allocate(0) returns a null
DataPtr; free(0) is a no-op, like cudaFree(nullptr).

Thread safety: one re-entrant lock around every public method, as PyTorch has one mutex per device.

Beyond PyTorch (minialloc's own): debug_guards:True puts guard bytes after every block (debug.py), and blocks
allocated through Buffer handles can be moved by defragment() (compaction.py). Neither costs the default path
anything: while one is in use, checked versions of malloc and free are bound on the instance.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from .config import AllocatorConfig
from .device import DeviceOutOfMemory, Event
from .expandable import ExpandableSegment
from .oom import OOMReport, OutOfMemoryError
from .sizes import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
)
from .stats import DeviceStats

if TYPE_CHECKING:
    from .compaction import Buffer, DefragmentReport
    from .debug import Guards

SIZE_MAX = 2**64 - 1  # "unset" for max_split_size, as std::numeric_limits<size_t>::max()
DEFAULT_TRACE_ENTRIES = 100_000


class InvalidPointerError(ValueError):
    """free or record_stream was given a pointer this allocator did not hand out, or handed out and took back."""


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
        self.key: tuple = ()  # its sort key while in a pool
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

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({self.ptr:#x}, {self.size}, stream={self.stream}, {state})"


class BlockPool:
    """Free blocks of one size class, ordered by (stream, size, address) for best fit (BlockComparatorSize)."""

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
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


def round_size(size: int, divisions: int) -> int:
    """round_size: up to a multiple of 512, or to one of `divisions` steps between powers of two."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:  # 0 or 1 division: plain 512-byte rounding
        return roundup_power2_next_division(size, divisions)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """1200 with 4 divisions lies between 1024 and 2048, whose quarters are 1024, 1280, 1536, 1792: -> 1280."""
    if size <= 4 or divisions <= 1 or size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def get_allocation_size(size: int) -> int:
    """get_allocation_size: the segment asked of the device for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def _check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int number of bytes, got {type(size).__name__} {size!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    return size


def _check_stream(stream: object) -> int:
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise TypeError(f"stream must be a non-negative int (0 is the default stream), got {stream!r}")
    return stream


def _check_ptr(ptr: object) -> int:
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise TypeError(f"pointer must be an int address returned by malloc, got {type(ptr).__name__} {ptr!r}")
    return ptr


def _python_frames(limit: int = 16) -> list[dict]:
    """The caller's Python stack as snapshot frames ({filename, line, name}), minialloc's own frames skipped."""
    frames = []
    f = sys._getframe(1)
    while f is not None and len(frames) < limit:
        code = f.f_code
        if "/minialloc/" not in code.co_filename.replace("\\", "/"):
            frames.append({"filename": code.co_filename, "line": f.f_lineno, "name": code.co_name})
        f = f.f_back
    return frames


class CachingAllocator:
    """A caching allocator over one device (SimulatedGPU, or CudaGPU on real hardware).

    `config` is a string in PYTORCH_CUDA_ALLOC_CONF's grammar ("expandable_segments:True,max_split_size_mb:128"),
    an AllocatorConfig, or None to read the MINIALLOC_ALLOC_CONF environment variable.
    """

    def __init__(self, device: Any, config: str | AllocatorConfig | None = None) -> None:
        self.device = device
        self._lock = threading.RLock()
        self.stats = DeviceStats()
        self._small = BlockPool(is_small=True)
        self._large = BlockPool(is_small=False)
        self._active: dict[int, Block] = {}  # ptr -> block, allocated or waiting on events (active_blocks)
        self._events: dict[int, deque[tuple[Event, Block]]] = {}  # stream -> outstanding events (cuda_events)
        self._expandable_segments: list[ExpandableSegment] = []
        self._total_reserved = 0  # total_allocated_memory: bytes held from the device
        self._set_fraction = False
        self._allowed = 0  # allowed_memory_maximum
        # entries are kept as tuples (cheap on the hot path) and become PyTorch's dicts in snapshot()
        self._trace: deque[tuple] | None = deque(maxlen=DEFAULT_TRACE_ENTRIES)
        self._record_stacks = False
        self._trace_note = ""  # user_metadata for the trace entries being written
        self._buffers: dict[Block, Buffer] = {}  # blocks allocated through a Buffer: defragment() may move them
        self._debug: Guards | None = None  # while debug_guards is on
        self._apply_config(self._as_config(config))

    # -- configuration ---------------------------------------------------------------------------------------
    @staticmethod
    def _as_config(config: str | AllocatorConfig | None) -> AllocatorConfig:
        if config is None:
            return AllocatorConfig.from_env()
        if isinstance(config, AllocatorConfig):
            return config
        if isinstance(config, str):
            return AllocatorConfig.parse(config)
        raise TypeError(f"config must be a string like 'max_split_size_mb:128' or an AllocatorConfig, got {config!r}")

    def _apply_config(self, config: AllocatorConfig) -> None:
        debug = None
        if config.debug_guards:
            from .debug import Guards

            debug = self._debug or Guards(self)  # refuses a device without data, before anything changes
        self._debug = debug
        self.config = config
        self._max_split = SIZE_MAX if config.max_split_size is None else config.max_split_size
        self._max_non_split_rounding = config.max_non_split_rounding
        self._gc_threshold = config.garbage_collection_threshold
        self._any_divisions = any(config.roundup_power2_divisions)
        self._expandable = config.expandable_segments
        self._bind_checked_methods()

    def _bind_checked_methods(self) -> None:
        """Debug guards and Buffers need extra steps in malloc and free. Rather than test for them on every call,
        bind checked versions on the instance while either is in use: the class's methods stay as fast as ever."""
        for name in ("malloc", "free", "_alloc_found_block", "_free_block"):
            self.__dict__.pop(name, None)
        if self._debug is not None:
            self.malloc = self._debug.malloc
            self._alloc_found_block = self._debug.alloc_found_block
            self._free_block = self._debug.free_block
        if self._debug is not None or self._buffers:
            self.free = self._checked_free

    def set_allocator_settings(self, text: str) -> None:
        """Change settings at runtime (torch.cuda.memory._set_allocator_settings): keys not named keep their value."""
        with self._lock:
            self._apply_config(self.config.updated(text))

    # -- allocation --------------------------------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int:
        """A block of at least `size` bytes usable on `stream` (DeviceCachingAllocator::malloc); its address."""
        # exact type checks first: they are the cheap common case (bool is an int subclass, and is refused)
        if type(stream) is not int or stream < 0:
            _check_stream(stream)
        if type(size) is not int or size <= 0:
            if _check_size(size) == 0:
                return 0  # a null allocation, as PyTorch's allocate(0)
        orig_size = size
        with self._lock:
            if self._events:
                self._process_events()
            if self._any_divisions:
                size = round_size(size, self.config.roundup_divisions_for(size))
            elif size < K_MIN_BLOCK_SIZE:
                size = K_MIN_BLOCK_SIZE
            else:
                size = -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE  # round_size without divisions
            pool = self._small if size <= K_SMALL_SIZE else self._large
            alloc_size = get_allocation_size(size)

            block = self._get_free_block(pool, size, stream)
            if block is None:
                if self._set_fraction and self._gc_threshold > 0.0:
                    self._garbage_collect_cached_blocks()
                block = self._alloc_block(pool, size, alloc_size, stream, is_retry=False)
                if block is None and self._release_available_cached_blocks(pool, size, stream):
                    block = self._alloc_block(pool, size, alloc_size, stream, is_retry=False)
                if block is None:
                    self._release_cached_blocks()
                    block = self._alloc_block(pool, size, alloc_size, stream, is_retry=True)
            if block is None:
                raise self._out_of_memory(orig_size, size, alloc_size, stream)
            return self._alloc_found_block(block, pool, size, orig_size, stream, self._should_split(block, size))

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """get_free_block: the smallest cached block of at least `size` on `stream`, taken out of the pool."""
        if self._set_fraction and self._gc_threshold > 0.0:
            pool.get_free_blocks_call_count += 1  # ages every cached block by one "tick"
        blocks = pool.blocks
        i = blocks.bisect_left((stream, size))
        n = len(blocks)
        if i == n or blocks[i][0] != stream:
            return None
        block: Block = blocks[i][3]
        if block.segment is not None:
            if self._expandable:
                # an expandable block can grow into the unmapped space after it: best fit by what it can reach
                def reach(b: Block) -> int:
                    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

                j = i + 1
                while block.segment is not None and j < n and blocks[j][0] == stream:
                    nxt = blocks[j][3]
                    if reach(nxt) >= reach(block):
                        break
                    i, block, j = j, nxt, j + 1
            else:
                # expandable segments were switched off: only ordinary blocks may serve new requests
                i += 1
                while i < n and blocks[i][0] == stream and blocks[i][3].segment is not None:
                    i += 1
                if i == n or blocks[i][0] != stream:
                    return None
                block = blocks[i][3]
        if size < self._max_split and block.size >= self._max_split:
            return None  # an oversize block never serves a small request
        if size >= self._max_split and block.size >= size + self._max_non_split_rounding:
            return None  # nor a big one it would waste too much of
        del blocks[i]
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self._expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(
        self, block: Block, pool: BlockPool, size: int, orig_size: int, stream: int, split: bool
    ) -> int:
        """alloc_found_block: split off the front if worthwhile, mark it allocated, count it."""
        stats = self.stats
        small = pool.is_small
        already_split = block.is_split()
        if split:
            remaining = block
            block = Block(remaining.ptr, size, stream, pool)
            block.segment = remaining.segment
            block.splice(remaining.prev, remaining)
            remaining.ptr += size
            remaining.size -= size
            pool.insert(remaining)
            if remaining.segment is None:  # expandable segments do not count inactive splits
                if already_split:
                    stats.decrease("inactive_split_bytes", small, size)
                else:
                    stats.increase("inactive_split_bytes", small, remaining.size)
                    stats.increase("inactive_split", small, 1)
        elif already_split and block.segment is None:
            stats.decrease("inactive_split_bytes", small, block.size)
            stats.decrease("inactive_split", small, 1)

        block.allocated = True
        block.requested_size = orig_size
        self._active[block.ptr] = block
        stats.block_allocated(small, block.size, orig_size)
        if block.size >= self._max_split:
            stats.oversize_allocations.increase(1)
        if self._trace is not None:
            block.frames = _python_frames() if self._record_stacks else []
            self._record("alloc", block.ptr, orig_size, stream, block.frames)
        return block.ptr

    def _alloc_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int, is_retry: bool) -> Block | None:
        """alloc_block: a new segment from the device (or new pages, with expandable segments); None if refused."""
        if is_retry:
            self.stats.num_alloc_retries += 1
        if self._set_fraction and self._total_reserved + alloc_size > self._allowed:
            return None
        if self._expandable:
            return self._try_allocate_expandable_block(pool, size, stream)
        try:
            ptr = self.device.malloc(alloc_size)
        except DeviceOutOfMemory:
            return None
        self._total_reserved += alloc_size
        block = Block(ptr, alloc_size, stream, pool)
        self.stats.increase("segment", pool.is_small, 1)
        self.stats.increase("reserved_bytes", pool.is_small, alloc_size)
        if alloc_size >= self._max_split:
            self.stats.oversize_segments.increase(1)
        self.stats.num_device_alloc += 1
        if self._trace is not None:
            self._record("segment_alloc", ptr, alloc_size, stream)
        return block

    # -- freeing -----------------------------------------------------------------------------------------------
    def free(self, ptr: int) -> None:
        """Return a block to the cache (DeviceCachingAllocator::free). The device gets it back only on release."""
        if type(ptr) is not int:
            _check_ptr(ptr)
        if ptr == 0:
            return
        with self._lock:
            block = self._active.get(ptr)
            if block is None or not block.allocated:
                raise self._invalid_pointer("free", ptr)
            block.allocated = False
            self.stats.free_requested(block.pool.is_small, block.size)
            if self._trace is not None:
                self._record("free_requested", ptr, block.requested_size, block.stream, block.frames)
            if block.size >= self._max_split:
                self.stats.oversize_allocations.decrease(1)
            if block.stream_uses:
                self._insert_events(block)  # used on other streams: free once their work is done
            else:
                self._free_block(block)

    def _checked_free(self, ptr: int) -> None:
        """free, refusing a Buffer's pointer and checking debug guards (bound as self.free while those are used)."""
        with self._lock:
            block = self._active.get(ptr) if type(ptr) is int else None
            if block is not None and block in self._buffers:
                raise InvalidPointerError(
                    f"free({ptr:#x}): this block belongs to a Buffer, which defragment() may move: call its free()"
                )
            violation = None
            if self._debug is not None and block is not None and block.allocated:
                violation = self._debug.check(block)
            CachingAllocator.free(self, ptr)
        if violation is not None:
            raise violation

    def _free_block(self, block: Block) -> None:
        """free_block: merge with free neighbours and return to the pool."""
        if self._trace is not None:
            self._record("free_completed", block.ptr, block.requested_size, block.stream, block.frames)
        block.frames = []
        original_size = block.size
        requested_size = block.requested_size
        pool = block.pool
        del self._active[block.ptr]
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            if candidate is not None and not candidate.allocated:
                subsumed = self._try_merge_blocks(block, candidate, pool)
                if subsumed:
                    net_blocks -= 1
                    net_bytes -= subsumed
        pool.insert(block)
        if block.is_split():
            net_blocks += 1
            net_bytes += block.size
        stats = self.stats
        small = pool.is_small
        if block.segment is None:
            # free pieces of split segments: memory empty_cache cannot return (inactive_split)
            if net_blocks > 0:
                stats.increase("inactive_split", small, net_blocks)
            elif net_blocks < 0:
                stats.decrease("inactive_split", small, -net_blocks)
            if net_bytes > 0:
                stats.increase("inactive_split_bytes", small, net_bytes)
            elif net_bytes < 0:
                stats.decrease("inactive_split_bytes", small, -net_bytes)
        stats.free_completed(small, original_size, requested_size)

    @staticmethod
    def _try_merge_blocks(dst: Block, src: Block | None, pool: BlockPool) -> int:
        """try_merge_blocks: absorb a free neighbour with no pending work and the same mapped state."""
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

    # -- streams -----------------------------------------------------------------------------------------------
    def record_stream(self, ptr: int, stream: int) -> None:
        """Mark a block as used on another stream: its free waits for that stream's queued work (recordStream)."""
        ptr = _check_ptr(ptr)
        stream = _check_stream(stream)
        with self._lock:
            block = self._active.get(ptr)
            if block is None or not block.allocated:
                raise self._invalid_pointer("record_stream", ptr)
            if stream == block.stream:
                return  # uses on the allocation stream need no synchronization
            if block.stream_uses is None:
                block.stream_uses = set()
            block.stream_uses.add(stream)

    def _insert_events(self, block: Block) -> None:
        streams, block.stream_uses = block.stream_uses or set(), None
        for s in sorted(streams):
            event = self.device.record_event(s)
            block.event_count += 1
            self._events.setdefault(s, deque()).append((event, block))

    def _process_events(self) -> None:
        """process_events: free the blocks whose recorded events have all completed."""
        for stream in list(self._events):
            queue = self._events[stream]
            while queue:
                event, block = queue[0]
                if not event.query():
                    break
                queue.popleft()
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            if not queue:
                del self._events[stream]

    def _synchronize_and_free_events(self) -> None:
        self.stats.num_sync_all_streams += 1
        for queue in self._events.values():
            for event, block in queue:
                event.synchronize()
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
        self._events.clear()

    def process_events(self) -> None:
        """Free every block whose cross-stream work has completed (malloc does this first, too)."""
        with self._lock:
            self._process_events()

    # -- giving memory back ------------------------------------------------------------------------------------
    def _release_block(self, block: Block) -> None:
        """release_block: cudaFree a whole cached segment."""
        self.stats.num_device_free += 1
        if self._trace is not None:
            self._record("segment_free", block.ptr, block.size, block.stream)
        self.device.free(block.ptr)
        self._total_reserved -= block.size
        small = block.pool.is_small
        self.stats.decrease("segment", small, 1)
        self.stats.decrease("reserved_bytes", small, block.size)
        if block.size >= self._max_split:
            self.stats.oversize_segments.decrease(1)
        block.pool.remove(block)

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: free just enough oversize cached blocks (only with max_split_size)."""
        if self._max_split == SIZE_MAX:
            return False
        key_size = max(size, self._max_split)
        blocks = pool.blocks
        i = blocks.bisect_left((stream, key_size))
        if i == len(blocks) or blocks[i][0] != stream or blocks[i][3].segment is not None:
            # no single block is big enough: free oversize blocks from the largest down
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key_size and i >= 0:
                b: Block = blocks[i][3]
                if b.size < self._max_split or b.stream != stream:
                    break
                if b.segment is None and not b.is_split():
                    released += b.size
                    self._release_block(b)
                i -= 1
            return released >= key_size
        self._release_block(blocks[i][3])
        return True

    def _release_cached_blocks(self) -> bool:
        """release_cached_blocks: wait for pending frees, then return every unsplit cached block (empty_cache)."""
        self._synchronize_and_free_events()
        self._release_blocks(self._large)
        self._release_blocks(self._small)
        return True

    def _release_blocks(self, pool: BlockPool) -> None:
        to_unmap = []
        for key in list(pool.blocks):
            block: Block = key[3]
            if block.segment is not None:
                to_unmap.append(block)  # unmapping changes the pool: do it after the walk
            elif block.prev is None and block.next is None:
                self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if block.prev is None and block.next is None:
                self._release_expandable_segment(block)

    def _garbage_collect_cached_blocks(self) -> None:
        """garbage_collect_cached_blocks: free unsplit large cached blocks older than average, until under threshold."""
        threshold = int(self._gc_threshold * self._allowed)
        if self._total_reserved <= threshold:
            return
        target = self._total_reserved - threshold
        pool = self._large

        def freeable(b: Block) -> bool:
            return not b.is_split() and b.segment is None

        ages = [pool.get_free_blocks_call_count - k[3].gc_count_base for k in pool.blocks if freeable(k[3])]
        total_age, count = float(sum(ages)), len(ages)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            age_threshold = total_age / count
            freed_one = False
            for key in list(pool.blocks):
                b = key[3]
                age = pool.get_free_blocks_call_count - b.gc_count_base
                if freeable(b) and age >= age_threshold:
                    freed_one = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    def empty_cache(self) -> None:
        """Return every cached segment that holds no live block to the device (torch.cuda.empty_cache)."""
        with self._lock:
            # the releases it causes are marked in the trace, so a replay can tell them from a malloc's retry
            self._trace_note = "empty_cache"
            try:
                self._release_cached_blocks()
            finally:
                self._trace_note = ""

    # -- expandable segments -----------------------------------------------------------------------------------
    @staticmethod
    def _allocatable(b: Block | None) -> bool:
        return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest place in this stream's segments with `size` bytes of free-or-unmapped
        address space; a new segment (address space only) when there is none."""
        unmapped = pool.unmapped
        i = unmapped.bisect_left((stream,))
        while i < len(unmapped) and unmapped[i][0] == stream:
            c: Block = unmapped[i][2]
            if self._allocatable(c.prev):
                c = c.prev  # a free mapped block just before the hole can be part of the answer
            room, b = 0, c
            while room < size and self._allocatable(b):
                room += b.size
                b = b.next
            if room >= size:
                return c
            i += 1
        segment = ExpandableSegment(self.device, stream, K_SMALL_BUFFER if pool.is_small else K_LARGE_BUFFER)
        self._expandable_segments.append(segment)
        candidate = Block(segment.ptr, segment.size, stream, pool)
        candidate.mapped = False
        candidate.segment = segment
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, to_map: Block, size: int) -> bool:
        """map_block: back the front `size` bytes of an unmapped block with pages, and merge it with free neighbours."""
        assert to_map.segment is not None and not to_map.mapped and size <= to_map.size
        mapped = to_map.segment.map(to_map.ptr, size)
        if mapped == 0:
            return False
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
        self._try_merge_blocks(to_map, to_map.prev, pool)
        self._try_merge_blocks(to_map, to_map.next, pool)
        pool.insert(to_map)
        self._total_reserved += mapped
        self.stats.increase("reserved_bytes", pool.is_small, mapped)
        self.stats.num_device_alloc += 1
        if self._trace is not None:
            self._record("segment_map", mapped_ptr, mapped, to_map.stream)
        return True

    def _try_allocate_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        candidate = self._find_expandable_block(pool, size, stream)
        # candidate is: unmapped -> ..., or free -> unmapped -> ...
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(nxt, min(size - candidate.size, nxt.size)):
                return None
            candidate = nxt  # map_block merged the free front into it
        pool.remove(candidate)
        return candidate

    def _unmap_block(self, block: Block) -> None:
        """unmap_block: give back every wholly free page of a free expandable block."""
        assert block.segment is not None
        ptr, size = block.segment.unmap(block.ptr, block.size)
        if size == 0:
            return
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
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self._total_reserved -= size
        self.stats.decrease("reserved_bytes", pool.is_small, size)
        self.stats.num_device_free += 1
        if self._trace is not None:
            self._record("segment_unmap", ptr, size, block.stream)

    def _release_expandable_segment(self, block: Block) -> None:
        segment = block.segment
        assert segment is not None and not block.mapped and block.size == segment.size
        self._expandable_segments.remove(segment)
        block.pool.remove_unmapped(block)
        segment.release()

    # -- out of memory and bad pointers --------------------------------------------------------------------------
    def _largest_cached_block(self) -> int:
        return max((k[1] for pool in (self._small, self._large) for k in pool.blocks), default=0)

    def _out_of_memory(self, orig_size: int, size: int, alloc_size: int, stream: int) -> OutOfMemoryError:
        device_free, total = self.device.mem_get_info()
        self.stats.num_ooms += 1
        if self._trace is not None:
            self._record("oom", device_free, size, stream)
        allocated = self.stats.current("allocated_bytes")
        reserved = self.stats.current("reserved_bytes")
        device_room = device_free
        if self._set_fraction:
            device_room = max(0, min(device_free, self._allowed - self._total_reserved))
        report = OOMReport(
            requested_size=orig_size,
            alloc_size=alloc_size,
            device_index=getattr(self.device, "index", 0),
            total_capacity=total,
            device_free=device_free,
            process_in_use=total - device_free,
            allowed=self._allowed if self._set_fraction else None,
            allocated=allocated,
            reserved=reserved,
            largest_free_block=max(self._largest_cached_block(), device_room),
            expandable_segments=self._expandable,
        )
        return OutOfMemoryError(report)

    def _invalid_pointer(self, what: str, ptr: int) -> InvalidPointerError:
        """Say what the pointer is: freed already, inside a live block, or not ours at all."""
        for block in self._all_blocks():
            if block.ptr == ptr:
                return InvalidPointerError(
                    f"{what}({ptr:#x}): invalid device pointer: this block was already freed (double free?)"
                )
            if block.ptr < ptr < block.ptr + block.size:
                state = "live block" if block.allocated else "free block"
                return InvalidPointerError(
                    f"{what}({ptr:#x}): invalid device pointer: it lies {ptr - block.ptr} bytes inside the {state} "
                    f"at {block.ptr:#x} ({block.size} bytes); pass the address malloc returned"
                )
        return InvalidPointerError(
            f"{what}({ptr:#x}): invalid device pointer: it was not returned by this allocator's malloc"
        )

    # -- limits --------------------------------------------------------------------------------------------------
    def set_per_process_memory_fraction(self, fraction: float) -> None:
        """Cap RESERVED memory at fraction x total (torch.cuda.set_per_process_memory_fraction).

        As in PyTorch up to 2.8, any fraction, 1.0 included, sets the limit and so enables
        garbage_collection_threshold; the newest releases treat 1.0 as "no limit"."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"invalid fraction {fraction!r}: set a float within [0, 1]")
        with self._lock:
            _, total = self.device.mem_get_info()
            self._allowed = int(fraction * total)
            self._set_fraction = True

    # -- statistics ----------------------------------------------------------------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """Every key of torch.cuda.memory_stats(), with the same meaning."""
        with self._lock:
            return self.stats.as_dict(-1 if self._max_split == SIZE_MAX else self._max_split)

    def memory_allocated(self) -> int:
        return self.stats.current("allocated_bytes")

    def memory_reserved(self) -> int:
        return self.stats.current("reserved_bytes")

    def max_memory_allocated(self) -> int:
        return self.stats.peak("allocated_bytes")

    def max_memory_reserved(self) -> int:
        return self.stats.peak("reserved_bytes")

    def reset_peak_memory_stats(self) -> None:
        with self._lock:
            self.stats.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        with self._lock:
            self.stats.reset_accumulated()

    def memory_summary(self, abbreviated: bool = False) -> str:
        """PyTorch's memory_summary table for this allocator."""
        from .summary import memory_summary

        return memory_summary(self.memory_stats(), device=getattr(self.device, "index", 0), abbreviated=abbreviated)

    def largest_free_block(self) -> int:
        """The largest cached free block (what a request could get without asking the device)."""
        with self._lock:
            return self._largest_cached_block()

    # -- movable blocks (compaction.py) --------------------------------------------------------------------------
    def buffer(self, nbytes: int, stream: int = 0) -> Buffer:
        """A block of nbytes behind a handle (compaction.Buffer): its address, buf.ptr, is looked up at each use,
        so defragment() may move it. Free it with buf.free()."""
        from .compaction import Buffer

        return Buffer(self, nbytes, stream)

    def defragment(self, release_empty: bool = False) -> DefragmentReport:
        """Move Buffer blocks toward the start of their segments so each segment's free space becomes one piece;
        a report (compaction.DefragmentReport) says what moved. See compaction.defragment."""
        from .compaction import defragment

        with self._lock:
            return defragment(self, release_empty)

    # -- history and snapshots -----------------------------------------------------------------------------------
    def record_memory_history(
        self, enabled: bool | str | None = True, max_entries: int = DEFAULT_TRACE_ENTRIES, stacks: bool = False
    ) -> None:
        """Turn the trace ring buffer on or off (torch.cuda.memory._record_memory_history).

        enabled: True or "all" records, False or None stops and clears. max_entries bounds the ring buffer.
        stacks: also keep each allocation's Python stack as snapshot frames (slower).
        """
        if enabled not in (True, False, None, "all", "state"):
            raise ValueError(f"enabled must be True, False, None, 'all' or 'state', got {enabled!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        with self._lock:
            on = enabled not in (False, None)
            if not on:
                self._trace = None
            else:
                old = self._trace or ()
                self._trace = deque(old, maxlen=max_entries)
            self._record_stacks = on and stacks

    def _record(self, action: str, addr: int, size: int, stream: int, frames: list | None = None) -> None:
        self._trace.append((action, addr, size, stream, time.time_ns() // 1000, frames, self._trace_note))  # type: ignore[union-attr]

    @staticmethod
    def _trace_entry(t: tuple) -> dict:
        action, addr, size, stream, time_us, frames, note = t
        # PyTorch names the address field device_free in OOM entries
        return {"action": action, "device_free" if action == "oom" else "addr": addr, "size": size,
                "stream": stream, "time_us": time_us, "frames": list(frames or ()), "compile_context": "N/A",
                "user_metadata": note}

    def _all_blocks(self) -> Iterator[Block]:
        """Every mapped block: free ones in the pools and active ones (get_all_blocks)."""
        for pool in (self._small, self._large):
            for key in pool.blocks:
                yield key[3]
        yield from self._active.values()

    def snapshot(self) -> dict:
        """The allocator's state in torch.cuda.memory._snapshot()'s schema: segments, device_traces, settings."""
        with self._lock:
            device_index = getattr(self.device, "index", 0)
            segments = []
            total_active = 0
            for head in self._all_blocks():
                if head.prev is not None and head.prev.mapped:
                    continue  # not the first block of a segment (or of a mapped range, when expandable)
                blocks = []
                seg = {
                    "device": device_index, "address": head.ptr, "total_size": 0, "allocated_size": 0,
                    "active_size": 0, "requested_size": 0, "stream": head.stream,
                    "segment_type": "small" if head.pool.is_small else "large", "segment_pool_id": (0, 0),
                    "is_expandable": head.segment is not None, "frames": [], "blocks": blocks,
                }
                b: Block | None = head
                while b is not None and b.mapped:
                    active = b.allocated or b.event_count > 0 or bool(b.stream_uses)
                    state = "active_allocated" if b.allocated else ("active_pending_free" if active else "inactive")
                    blocks.append({"address": b.ptr, "size": b.size, "requested_size": b.requested_size,
                                   "state": state, "frames": list(b.frames)})
                    seg["total_size"] += b.size
                    if b.allocated:
                        seg["allocated_size"] += b.size
                    if active:
                        seg["active_size"] += b.size
                        seg["requested_size"] += b.requested_size
                    b = b.next
                total_active += seg["active_size"]
                segments.append(seg)
            segments.sort(key=lambda s: s["address"])
            if self._trace is not None:
                self._record("snapshot", 0, total_active, 0)
            traces = [self._trace_entry(t) for t in (self._trace or ())]
            return {
                "segments": segments,
                "device_traces": [traces],
                "allocator_settings": self.config.settings_dict(),
                "external_annotations": [],
            }

    # -- introspection for tests and the course -------------------------------------------------------------------
    @property
    def expandable_segments(self) -> list[ExpandableSegment]:
        return list(self._expandable_segments)

    def check_invariants(self) -> None:
        """Assert the allocator's bookkeeping agrees with itself and with the device (used by the tests)."""
        with self._lock:
            _check_invariants(self)


def _check_invariants(a: CachingAllocator) -> None:
    heads: list[Block] = []
    seen: set[int] = set()
    for pool in (a._small, a._large):
        for key in pool.blocks:
            b = key[3]
            assert b.mapped and not b.allocated and b.pool is pool and key == b.key, f"bad pool entry {b}"
        for key in pool.unmapped:
            b = key[2]
            assert not b.mapped and b.segment is not None and b.pool is pool, f"bad unmapped entry {b}"
            seen.add(id(b))
    every = list(a._all_blocks())
    for b in every:
        seen.add(id(b))
    starts = [b for b in every if b.prev is None]
    starts += [k[2] for pool in (a._small, a._large) for k in pool.unmapped if k[2].prev is None]
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
