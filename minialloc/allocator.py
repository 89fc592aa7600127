"""The caching allocator: PyTorch 2.13's CUDA caching allocator, rule for rule, in Python.

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
7. When nothing fits (malloc): garbage-collect old cached blocks if a memory fraction under 1.0 and
   garbage_collection_threshold are set; ask the device for a new segment (alloc_block); on failure release one
   oversize cached block big enough, or several (release_available_cached_blocks), and retry; then release EVERY
   unsplit cached block (release_cached_blocks, what empty_cache does) and retry once more; then raise
   OutOfMemoryError.
8. Streams (record_stream, insert_events, process_events). A block used on another stream is freed only when
   events recorded on those streams complete; meanwhile it is "active_pending_free".

Why fragmentation kills programs: a segment can go back to the device only when ALL of its blocks are free. A
few live blocks scattered over many segments pin them all, and their free pieces are too small or on the wrong
stream for the request at hand. empty_cache cannot help then; expandable segments (expandable.py) can.

Private pools (mempool.py): alloc.mem_pool() and `with alloc.use_mem_pool(pool):` route a thread's allocations to
a pool of their own (torch.cuda.MemPool, use_mem_pool, and what CUDA graphs use); empty_cache leaves a pool in use
alone.

Expandable segments (expandable_segments:True): instead of one device malloc per segment, one virtual range per
(stream, pool) grows by mapping pages where a block needs them, and empty_cache unmaps every wholly free page.

Sizes of 0: malloc(0) returns the null pointer 0 and touches nothing, as PyTorch's allocate(0) returns a null
DataPtr; free(0) is a no-op, like cudaFree(nullptr). A request of 1 EB (2**60 bytes) or more is refused at once
with OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory."), before any counter or trace
entry, as NativeCachingAllocator::allocate does.

History: nothing is recorded until record_memory_history() is called, as in PyTorch (snapshot()["device_traces"]
is [[]] until then). Record history before the run you want to read.

The PyTorch source read for these rules: c10/cuda/CUDACachingAllocator.cpp of the 2.12/2.13 development line
(with large_segment_size and per_process_memory_fraction), c10/core/AllocatorConfig.h and
c10/cuda/CUDAAllocatorConfig.h of the 2.13.0 release, and torch/cuda/memory.py of 2.13.0.

Thread safety: one re-entrant lock around every public method, as PyTorch has one mutex per device.

Beyond PyTorch (minialloc's own): debug_guards:True puts guard bytes after every block (debug.py), and blocks
allocated through Buffer handles can be moved by defragment() (compaction.py). Both are EXTENSIONS written against
the seam in extension.py: hooks that malloc and free call at fixed points (AllocatorExtension), and the methods of
AllocatorHost (block_at, blocks, move_block, release_segment...; ExtensionHost implements them). They import that
seam and never this module, so the allocator can offer them (config key, buffer(), defragment()) without an import
circle. With no extension installed, malloc and free test one empty tuple: the default path runs no extension code.

This file is the policy only. The rest of CachingAllocator lives where its idea does: blocks and pools, the data
the rules work on, in blocks.py; the public calls that are not rules (statistics, memory fraction, MemPool,
history, snapshot(), the replays' restore_segments) in memory_api.py, which CachingAllocator inherits and which
calls history.py (the trace ring buffer), snapshot_writer.py, mempool.py, restore.py and invariants.py; the block
edits of expandable segments in expandable_blocks.py. None of those imports this module: restore.py and
invariants.py see the allocator through the protocol in tables.py, a MemPool through mempool.PoolOwner.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from .blocks import Block, BlockPool, InvalidPointerError, try_merge_blocks
from .config import AllocatorConfig
from .debug import Guards
from .devices.base import Device, DeviceOutOfMemory, StreamEvent
from .expandable import ExpandableSegment
from .expandable_blocks import find_room, map_front, range_block, unmap_free_pages
from .extension import AllocatorExtension, ExtensionHost
from .history import History, clock_past, python_frames
from .memory_api import MemoryAPI, check_ptr, check_size, check_stream
from .mempool import PoolId, PrivatePool
from .oom import OOMReport, OutOfMemoryError, process_info
from .sizes import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
)
from .stats import DeviceStats

__all__ = [  # Block, BlockPool and InvalidPointerError live in blocks.py; they are still importable from here
    "Block", "BlockPool", "CachingAllocator", "InvalidPointerError", "get_allocation_size", "round_size",
    "roundup_power2_next_division",
]

SIZE_MAX = 2**64 - 1  # "unset" for max_split_size, as std::numeric_limits<size_t>::max()
ONE_EXA_BYTES = 1 << 60  # NativeCachingAllocator::allocate refuses size >= one_exa_bytes before anything else


def round_size(size: int, divisions: int) -> int:
    """round_size: up to a multiple of 512, or to one of `divisions` steps between powers of two.

    malloc calls exactly this function on every request (the plain 512-byte case is its fast path)."""
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


def get_allocation_size(size: int, large_segment_size: int = K_LARGE_BUFFER) -> int:
    """get_allocation_size: the segment asked of the device for a rounded request. Large requests under 10 MiB
    get AcceleratorAllocatorConfig::large_segment_size() (large_segment_size_mb, default 20 MiB)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return large_segment_size
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class CachingAllocator(ExtensionHost, MemoryAPI):
    """A caching allocator over one device (SimulatedGPU, or CudaGPU on real hardware).

    `config` is a string in PYTORCH_CUDA_ALLOC_CONF's grammar ("expandable_segments:True,max_split_size_mb:128"),
    an AllocatorConfig, or None to read the MINIALLOC_ALLOC_CONF environment variable.
    """

    def __init__(self, device: Device, config: str | AllocatorConfig | None = None) -> None:
        self.device = device
        self._lock = threading.RLock()
        self.stats = DeviceStats()
        self._small = BlockPool(is_small=True)
        self._large = BlockPool(is_small=False)
        # private pools by id, and the pool each thread allocates from while inside use_mem_pool (a stack per
        # thread); both empty on the default path, which then tests one empty dict
        self._private: dict[PoolId, PrivatePool] = {}
        self._routing: dict[int, list[PoolId]] = {}
        self._next_mempool_id = 1  # MemPool ids are (0, 1), (0, 2), ... as PyTorch's uid_ counter hands them out
        self._active: dict[int, Block] = {}  # ptr -> block, allocated or waiting on events (active_blocks)
        self._events: dict[int, deque[tuple[StreamEvent, Block]]] = {}  # stream -> outstanding events (cuda_events)
        self._expandable_segments: list[ExpandableSegment] = []
        self._total_reserved = 0  # total_allocated_memory: bytes held from the device
        self._set_fraction = False  # allowed_memory_maximum.has_value(): a fraction under 1.0 is set
        self._allowed = 0  # allowed_memory_maximum
        # None until record_memory_history(), as PyTorch's record_history is off (history.py)
        self._history: History | None = None
        self._memory_metadata = ""  # user_metadata (torch.cuda.memory._set_memory_metadata), kept while off too
        # hooks of minialloc's own additions (debug guards, Buffers): empty on PyTorch's path, and then free
        self._extensions: tuple[AllocatorExtension, ...] = ()
        config = self._as_config(config)
        self._apply_config(config)
        # Both are read once, when PyTorch constructs the DeviceCachingAllocator: the memory fraction from
        # per_process_memory_fraction and stats.max_split_size, which memory_stats() reports from then on.
        self._stats_max_split = -1 if config.max_split_size is None else config.max_split_size
        self._set_memory_fraction(config.per_process_memory_fraction)

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
        guards = self.find_extension(Guards)
        if config.debug_guards and guards is None:
            self.add_extension(Guards(self.device))  # refuses a device without data, before anything changes
        elif guards is not None and not config.debug_guards:
            self.remove_extension(guards)
        self.config = config
        self._max_split = SIZE_MAX if config.max_split_size is None else config.max_split_size
        self._max_non_split_rounding = config.max_non_split_rounding
        self._gc_threshold = config.garbage_collection_threshold
        self._any_divisions = any(config.roundup_power2_divisions)
        self._expandable = config.expandable_segments
        self._large_segment_size = config.large_segment_size

    def set_allocator_settings(self, text: str) -> None:
        """Change settings at runtime, as torch._C._accelerator_setAllocatorSettings (which
        torch.cuda.memory._set_allocator_settings calls) does in PyTorch 2.13: the string is parsed from the
        defaults of max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions and
        garbage_collection_threshold, so those go back to unset unless named; the other settings keep their values
        (see AllocatorConfig.updated). memory_stats()["max_split_size"] and the memory fraction do not change:
        PyTorch reads them when the allocator is created."""
        with self._lock:
            self._apply_config(self.config.updated(text))

    # -- allocation --------------------------------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int:
        """A block of at least `size` bytes usable on `stream` (DeviceCachingAllocator::malloc); its address."""
        # exact type checks first: they are the cheap common case (bool is an int subclass, and is refused)
        if type(stream) is not int or stream < 0:
            check_stream(stream)
        if type(size) is not int or size <= 0 or size >= 1152921504606846976:  # ONE_EXA_BYTES, as a constant
            if check_size(size) == 0:
                return 0  # a null allocation, as PyTorch's allocate(0)
            if size >= ONE_EXA_BYTES:
                raise OutOfMemoryError.more_than_1eb()
        orig_size = size
        with self._lock:
            extensions = self._extensions
            if extensions:
                size = self._extended_request(size)
            if self._events:
                self._process_events()
            size = round_size(size, self.config.roundup_divisions_for(size) if self._any_divisions else 0)
            if self._routing and threading.get_ident() in self._routing:  # inside use_mem_pool (get_pool)
                private = self._private[self._routing[threading.get_ident()][-1]]
                pool = private.small if size <= K_SMALL_SIZE else private.large
            else:
                pool = self._small if size <= K_SMALL_SIZE else self._large
            alloc_size = get_allocation_size(size, self._large_segment_size)

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
            ptr = self._alloc_found_block(block, pool, size, orig_size, stream, self._should_split(block, size))
            if extensions:
                block = self._active[ptr]
                for e in extensions:
                    e.on_malloc(block)
            return ptr

    def _extended_request(self, size: int) -> int:
        """The size the rules see once every extension has added its room (request_size)."""
        for e in self._extensions:
            size = e.request_size(size)
        if size >= ONE_EXA_BYTES:
            raise OutOfMemoryError.more_than_1eb()
        return size

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """get_free_block: the smallest cached block of at least `size` on `stream`, taken out of the pool."""
        if self._set_fraction and self._gc_threshold > 0.0:
            pool.get_free_blocks_call_count += 1  # ages every cached block by one "tick"
        blocks = pool.blocks
        i = blocks.bisect_left((stream, size))
        n = len(blocks)
        if i == n:
            return None
        found_stream, _size, _ptr, block = blocks[i]  # a pool entry (see blocks.py)
        if found_stream != stream:
            return None
        if block.segment is not None:
            if self._expandable:
                # an expandable block can grow into the unmapped space after it: best fit by what it can reach
                def reach(b: Block) -> int:
                    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

                j = i + 1
                while block.segment is not None and j < n:
                    next_stream, _size, _ptr, nxt = blocks[j]
                    if next_stream != stream or reach(nxt) >= reach(block):
                        break
                    i, block, j = j, nxt, j + 1
            else:
                # expandable segments were switched off: only ordinary blocks may serve new requests
                while True:
                    i += 1
                    if i == n:
                        return None
                    found_stream, _size, _ptr, block = blocks[i]
                    if found_stream != stream:
                        return None
                    if block.segment is None:
                        break
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
        history = self._history
        if history is not None:
            block.frames = python_frames() if history.stacks else []
            history.record("alloc", block.ptr, orig_size, stream, block.frames or None)
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
        if self._history is not None:
            self._history.record("segment_alloc", ptr, alloc_size, stream, self._history.context())
        return block

    # -- freeing -----------------------------------------------------------------------------------------------
    def free(self, ptr: int) -> None:
        """Return a block to the cache (DeviceCachingAllocator::free). The device gets it back only on release."""
        if type(ptr) is not int:
            check_ptr(ptr)
        if ptr == 0:
            return
        with self._lock:
            block = self._active.get(ptr)
            if block is None or not block.allocated:
                raise self._invalid_pointer("free", ptr)
            problem = None
            if self._extensions:
                problem = self._extended_free(block)
            block.allocated = False
            self.stats.free_requested(block.pool.is_small, block.size)
            history = self._history  # one attribute load when recording, as the single-class allocator had
            if history is not None:
                history.record("free_requested", ptr, block.requested_size, block.stream, block.frames or None)
            if block.size >= self._max_split:
                self.stats.oversize_allocations.decrease(1)
            if block.stream_uses:
                self._insert_events(block)  # used on other streams: free once their work is done
            else:
                self._free_block(block)
            if problem is not None:
                raise problem

    def _extended_free(self, block: Block) -> Exception | None:
        """Every extension may refuse first (check_free); then each sees the free (on_free). The first problem
        reported is raised once the free is done."""
        for e in self._extensions:
            e.check_free(block)
        problem = None
        for e in self._extensions:
            found = e.on_free(block)
            if problem is None:
                problem = found
        return problem

    def _free_block(self, block: Block) -> None:
        """free_block: merge with free neighbours and return to the pool."""
        if self._extensions:
            for e in self._extensions:
                e.on_free_block(block)
        history = self._history
        if history is not None:
            history.record("free_completed", block.ptr, block.requested_size, block.stream, block.frames or None)
        block.frames = []
        original_size = block.size
        requested_size = block.requested_size
        pool = block.pool
        del self._active[block.ptr]
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            if candidate is not None and not candidate.allocated:
                subsumed = try_merge_blocks(block, candidate, pool)
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

    # -- streams -----------------------------------------------------------------------------------------------
    def record_stream(self, ptr: int, stream: int) -> None:
        """Mark a block as used on another stream: its free waits for that stream's queued work (recordStream)."""
        ptr = check_ptr(ptr)
        stream = check_stream(stream)
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
        if self._history is not None:
            self._history.record("segment_free", block.ptr, block.size, block.stream, self._history.context())
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
        found_stream, _size, _ptr, found = blocks[i] if i < len(blocks) else (None, 0, 0, None)
        # an oversize block is never split in PyTorch, so the one found is a whole segment; in a replay over a
        # state rebuilt under other settings it may be part of one, which cannot go back alone
        if found is None or found_stream != stream or found.segment is not None or found.is_split():
            # no single block is big enough: free oversize blocks from the largest down
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < key_size and i >= 0:
                _stream, _size, _ptr, b = blocks[i]
                if b.size < self._max_split or b.stream != stream:
                    break
                if b.segment is None and not b.is_split():
                    released += b.size
                    self._release_block(b)
                i -= 1
            return released >= key_size
        self._release_block(found)
        return True

    def _release_cached_blocks(self) -> bool:
        """release_cached_blocks: wait for pending frees, then return every unsplit cached block (empty_cache) of
        the default pools and of the private pools nobody uses any more (graph_pools_freeable); a pool with no
        segment left is then forgotten."""
        self._synchronize_and_free_events()
        self._release_blocks(self._large)
        self._release_blocks(self._small)
        for pool_id, private in list(self._private.items()):
            if private.use_count == 0:
                self._release_blocks(private.large)
                self._release_blocks(private.small)
                holds_memory = any(p.blocks or p.unmapped for p in (private.small, private.large))
                if not holds_memory and all(b.pool.pool_id != pool_id for b in self._active.values()):
                    del self._private[pool_id]
        return True

    def _block_pools(self) -> list[BlockPool]:
        """Every block pool: the default small and large ones, then each private pool's."""
        out = [self._small, self._large]
        for private in self._private.values():
            out += [private.small, private.large]
        return out

    def _all_blocks(self) -> Iterator[Block]:
        """Every mapped block: free ones in the pools and active ones (get_all_blocks)."""
        for pool in self._block_pools():
            yield from pool.free_blocks()
        yield from self._active.values()

    def _release_blocks(self, pool: BlockPool) -> None:
        to_unmap = []
        for block in list(pool.free_blocks()):
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

        ages = [pool.get_free_blocks_call_count - b.gc_count_base for b in pool.free_blocks() if freeable(b)]
        total_age, count = float(sum(ages)), len(ages)
        reclaimed = 0
        freed_one = True
        while reclaimed < target and freed_one and count > 0:
            age_threshold = total_age / count
            freed_one = False
            for b in list(pool.free_blocks()):
                age = pool.get_free_blocks_call_count - b.gc_count_base
                if freeable(b) and age >= age_threshold:
                    freed_one = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b)

    def empty_cache(self) -> None:
        """Return every cached segment that holds no live block to the device (torch.cuda.empty_cache).

        While history is recorded, the call is marked by a pair of external annotations (name "empty_cache",
        stage "START" and "END", as PyTorch writes record_function annotations): the releases between their
        times are empty_cache's, not a malloc's retry. The trace entries themselves are PyTorch's."""
        with self._lock:
            history = self._history
            if history is None:
                self._release_cached_blocks()
                return
            device = getattr(self.device, "index", 0)
            history.annotate("empty_cache", "START", device)
            self._release_cached_blocks()
            clock_past(history.annotate("empty_cache", "END", device))  # entries written after are later

    # -- expandable segments -----------------------------------------------------------------------------------
    def _expandable_page_size(self, small: bool) -> int:
        # the large pool's page is AcceleratorAllocatorConfig::large_segment_size() (20 MiB unless set)
        return K_SMALL_BUFFER if small else self._large_segment_size

    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest place in this stream's segments with `size` bytes of free-or-unmapped
        address space; a new segment (address space only, which is cheap) when there is none."""
        found = find_room(pool, size, stream)
        if found is not None:
            return found
        segment = ExpandableSegment(self.device, stream, self._expandable_page_size(pool.is_small))
        self._expandable_segments.append(segment)
        return range_block(segment, pool)

    def _map_block(self, to_map: Block, size: int) -> bool:
        """map_block: back the front `size` bytes of an unmapped block with pages (merged with free neighbours)."""
        ptr, mapped = map_front(to_map, size)
        if mapped == 0:
            return False
        self._total_reserved += mapped
        self.stats.increase("reserved_bytes", to_map.pool.is_small, mapped)
        self.stats.num_device_alloc += 1
        if self._history is not None:
            self._history.record("segment_map", ptr, mapped, to_map.stream, self._history.context())
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
        ptr, size = unmap_free_pages(block)
        if size == 0:
            return
        self._total_reserved -= size
        self.stats.decrease("reserved_bytes", block.pool.is_small, size)
        self.stats.num_device_free += 1
        if self._history is not None:
            self._history.record("segment_unmap", ptr, size, block.stream, self._history.context())

    def _release_expandable_segment(self, block: Block) -> None:
        segment = block.segment
        assert segment is not None and not block.mapped and block.size == segment.size
        self._expandable_segments.remove(segment)
        block.pool.remove_unmapped(block)
        segment.release()

    # -- out of memory and bad pointers --------------------------------------------------------------------------
    def _largest_cached_block(self) -> int:
        return max(p.largest_free_size() for p in self._block_pools())

    def _out_of_memory(self, orig_size: int, size: int, alloc_size: int, stream: int) -> OutOfMemoryError:
        device_free, total = self.device.mem_get_info()
        self.stats.num_ooms += 1
        if self._history is not None:
            self._history.record("oom", device_free, size, stream, self._history.context())
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
            allowed=self._allowed if self._set_fraction else None,
            allocated=allocated,
            reserved=reserved,
            largest_free_block=max(self._largest_cached_block(), device_room),
            expandable_segments=self._expandable,
            process_info=process_info(self.device),
        )
        return OutOfMemoryError(report)

    def _invalid_pointer(self, what: str, ptr: int) -> InvalidPointerError:
        return InvalidPointerError.about(what, ptr, self._all_blocks())

    # -- limits (set_per_process_memory_fraction, in memory_api.py, validates) ----------------------------------
    def _set_memory_fraction(self, fraction: float) -> None:
        self._set_fraction = fraction < 1.0
        # device_prop.totalGlobalMem is the device's whole memory, whatever is in use
        self._allowed = int(fraction * self.device.total_memory) if self._set_fraction else 0
