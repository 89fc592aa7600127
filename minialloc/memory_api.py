"""The allocator's public methods that are not its rules: what torch/cuda/memory.py offers over PyTorch's
allocator (statistics, memory fraction, history and snapshots, MemPool), minialloc's own Buffers and
defragment(), and the state restore replays use. Each is a thin call into the module that owns the idea.

CachingAllocator (allocator.py) inherits these, so that allocator.py holds only the policy, in PyTorch's order;
PyTorch draws the same line between DeviceCachingAllocator (the rules) and NativeCachingAllocator with
torch/cuda/memory.py (the calls users make). This module never imports allocator.py: the attributes it uses are
the policy's, listed below for the reader.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import restore
from .compaction import Buffer, DefragmentReport, defragment
from .history import DEFAULT_TRACE_ENTRIES, History
from .invariants import check_allocator_invariants
from .mempool import DEFAULT_POOL, MemPool, PoolId, PrivatePool
from .snapshot_writer import take_snapshot

if TYPE_CHECKING:
    from .blocks import Block, BlockPool
    from .config import AllocatorConfig
    from .expandable import ExpandableSegment
    from .stats import DeviceStats

__all__ = ["MemoryAPI", "check_ptr", "check_size", "check_stream"]


# The argument checks of malloc, free and record_stream: called only once the cheap exact-type test on the hot
# path has failed, to turn a wrong argument into a one-line error that names it.
def check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int number of bytes, got {type(size).__name__} {size!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    return size


def check_stream(stream: object) -> int:
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise TypeError(f"stream must be a non-negative int (0 is the default stream), got {stream!r}")
    return stream


def check_ptr(ptr: object) -> int:
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise TypeError(f"pointer must be an int address returned by malloc, got {type(ptr).__name__} {ptr!r}")
    return ptr


class MemoryAPI:
    """The public calls of CachingAllocator that are not rules (see the module's docstring)."""

    # set by CachingAllocator.__init__ (allocator.py)
    device: Any
    stats: DeviceStats
    config: AllocatorConfig
    _lock: threading.RLock
    _history: History | None
    _memory_metadata: str
    _private: dict[PoolId, PrivatePool]
    _routing: dict[int, list[PoolId]]
    _next_mempool_id: int
    _stats_max_split: int
    _set_fraction: bool
    _allowed: int
    _expandable_segments: list[ExpandableSegment]

    if TYPE_CHECKING:  # the policy's methods these calls use (allocator.py)
        def _set_memory_fraction(self, fraction: float) -> None: ...

        def _largest_cached_block(self) -> int: ...

        def _all_blocks(self) -> Iterator[Block]: ...

    # -- private pools (mempool.py) ------------------------------------------------------------------------------
    def mem_pool(self) -> MemPool:
        """A new private pool (torch.cuda.MemPool()): ids (0, 1), (0, 2), ... in creation order."""
        with self._lock:
            pool_id = (0, self._next_mempool_id)
            self._next_mempool_id += 1
            return MemPool(self, pool_id)

    @contextmanager
    def use_mem_pool(self, pool: MemPool) -> Iterator[MemPool]:
        """torch.cuda.use_mem_pool(pool): this thread's allocations come from `pool` inside the block
        (beginAllocateToPool / endAllocateToPool; the context holds one use of the pool, releasePool drops it)."""
        if not isinstance(pool, MemPool) or pool._allocator is not self:
            raise ValueError(f"use_mem_pool needs a MemPool of this allocator (alloc.mem_pool()), got {pool!r}")
        thread = threading.get_ident()
        with self._lock:
            self._incref_pool(pool.id)
            self._routing.setdefault(thread, []).append(pool.id)
        try:
            yield pool
        finally:
            with self._lock:
                stack = self._routing[thread]
                stack.pop()
                if not stack:
                    del self._routing[thread]
                self._decref_pool(pool.id)

    def _incref_pool(self, pool_id: PoolId) -> None:
        """create_or_incref_pool."""
        if pool_id == DEFAULT_POOL:
            raise ValueError("(0, 0) is the default pool's id, not a private pool's")
        with self._lock:
            self._private.setdefault(pool_id, PrivatePool(pool_id)).use_count += 1

    def _decref_pool(self, pool_id: PoolId) -> None:
        """releasePool: at use_count 0 the pool's cached blocks go back at the next release_cached_blocks."""
        with self._lock:
            private = self._private.get(pool_id)
            if private is not None and private.use_count > 0:
                private.use_count -= 1

    def _pool_use_count(self, pool_id: PoolId) -> int:
        private = self._private.get(pool_id)
        return 0 if private is None else private.use_count

    # -- limits --------------------------------------------------------------------------------------------------
    def set_per_process_memory_fraction(self, fraction: float) -> None:
        """Cap RESERVED memory at fraction x total (torch.cuda.set_per_process_memory_fraction, PyTorch 2.13).

        The fraction must be a float (an int such as 1 raises TypeError, as torch/cuda/memory.py checks) within
        [0, 1]. A fraction under 1.0 sets the limit, and only then does garbage_collection_threshold act; 1.0
        means "no limit" and switches it off again (DeviceCachingAllocator::setMemoryFraction sets
        allowed_memory_maximum only for fraction < 1.0)."""
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        with self._lock:
            self._set_memory_fraction(fraction)

    def get_per_process_memory_fraction(self) -> float:
        """torch.cuda.get_per_process_memory_fraction: allowed / total, or 1.0 when no limit is set."""
        with self._lock:
            return self._allowed / self.device.total_memory if self._set_fraction else 1.0

    # -- statistics ----------------------------------------------------------------------------------------------
    def memory_stats(self) -> dict[str, int]:
        """Every key of torch.cuda.memory_stats(), with the same meaning."""
        with self._lock:
            # stats.max_split_size is set once, in the DeviceCachingAllocator constructor
            return self.stats.as_dict(self._stats_max_split)

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
        return Buffer(self, nbytes, stream)

    def defragment(self, release_empty: bool = False) -> DefragmentReport:
        """Move Buffer blocks toward the start of their segments so each segment's free space becomes one piece;
        a report (compaction.DefragmentReport) says what moved. See compaction.defragment."""
        with self._lock:
            return defragment(self, release_empty)

    # -- history and snapshots -----------------------------------------------------------------------------------
    def record_memory_history(
        self,
        enabled: bool | str | None = "all",
        max_entries: int = DEFAULT_TRACE_ENTRIES,
        stacks: bool = False,
        clear_history: bool = False,
    ) -> None:
        """Turn the trace ring buffer on or off (torch.cuda.memory._record_memory_history, PyTorch 2.13).

        Nothing is recorded until this is called: call it before the run you want to read. enabled: "all",
        "state" or True records, None or False stops and clears. max_entries bounds the ring buffer (default
        unlimited, as PyTorch's sys.maxsize); the oldest entries go first. stacks: also keep each allocation's
        Python stack as the entries' and blocks' frames (slower); without it trace entries have no "frames" key,
        as PyTorch's have none when no context is recorded. clear_history: drop what was recorded so far.
        """
        with self._lock:
            self._history = History.switched(self._history, enabled, max_entries, stacks, clear_history,
                                             self._memory_metadata)

    def set_memory_metadata(self, metadata: str) -> None:
        """The user_metadata written into every trace entry from now on ("" clears it), as
        torch.cuda.memory._set_memory_metadata; entries carry "" when none is set."""
        if not isinstance(metadata, str):
            raise TypeError(f"metadata must be a string, got {type(metadata).__name__}")
        with self._lock:
            self._memory_metadata = metadata
            if self._history is not None:
                self._history.note = metadata

    def get_memory_metadata(self) -> str:
        """torch.cuda.memory._get_memory_metadata: the user_metadata being written."""
        return self._memory_metadata

    def snapshot(self) -> dict:
        """The allocator's state in torch.cuda.memory._snapshot()'s schema: segments, device_traces, settings."""
        with self._lock:
            return take_snapshot(self._all_blocks(), getattr(self.device, "index", 0), self._history,
                                 self.config.settings_dict())

    # -- state restore (restore.py): a recorded run's segments, rebuilt at their recorded addresses ------------
    def restore_segments(self, segments: list[dict]) -> None:
        """Rebuild segments given in the snapshot schema at their own addresses (a replay's starting state; see
        restore.restore_segments). The allocator must be empty and the device a SimulatedGPU."""
        restore.restore_segments(self, segments)

    def held_pool(self, pool_id: PoolId) -> tuple[BlockPool, BlockPool]:
        """The private pool `pool_id` as (small, large), made if new and held for good (restore.held_pool)."""
        with self._lock:
            return restore.held_pool(self, pool_id)

    def replay_pool(self, pool_id: PoolId) -> MemPool:
        """A MemPool handle on the recorded run's pool `pool_id` (held_pool), to replay its allocations in it."""
        self.held_pool(pool_id)
        return MemPool(self, pool_id)

    def release_cached_segment(self, ptr: int) -> bool:
        """Give back the cached segment starting at ptr if it is wholly free; False if not (a replay releases
        exactly the segments the recorded run released)."""
        return restore.release_cached_segment(self, ptr)

    # -- introspection for tests and the course -------------------------------------------------------------------
    @property
    def expandable_segments(self) -> list[ExpandableSegment]:
        return list(self._expandable_segments)

    def check_invariants(self) -> None:
        """Assert the allocator's bookkeeping agrees with itself and with the device (used by the tests)."""
        with self._lock:
            check_allocator_invariants(self)
