"""Private memory pools: torch.cuda.MemPool and torch.cuda.use_mem_pool, as PyTorch 2.13 has them.

A private pool is a pair of block pools (small and large) of its own, with id (0, n) for a MemPool and
(n, 0) for a CUDA graph's pool in PyTorch (the snapshot's ``segment_pool_id``). While a thread is inside
``use_mem_pool(pool)``, every allocation it makes is served from that pool's cached blocks, or from a new
segment that joins the pool; the default pool never serves it, and the private pool never serves anyone else.
A freed block goes back to the pool it came from, whichever thread frees it.

Why a CUDA graph's memory does not come back: ``empty_cache()`` (release_cached_blocks) gives back the default
pools' unsplit cached segments, and only those private pools nobody uses any more (use_count 0, PyTorch's
``graph_pools_freeable``). While the MemPool object (or the graph) is alive its cached segments stay reserved.

use_count: 1 for the MemPool object, plus one for each open use_mem_pool context (create_or_incref_pool and
releasePool in c10/cuda/CUDACachingAllocator.cpp; torch.cuda.MemPool.use_count). Not modelled: a MemPool's own
allocator (a pluggable one), use_on_oom and no_split.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from .blocks import BlockPool

__all__ = ["MemPool", "PoolOwner", "PrivatePool"]

PoolId = tuple[int, int]
DEFAULT_POOL: PoolId = (0, 0)


class PrivatePool:
    """The allocator's side of a pool (PrivatePool in PyTorch): its two block pools and its use count."""

    def __init__(self, pool_id: PoolId) -> None:
        self.id = pool_id
        self.small = BlockPool(is_small=True, pool_id=pool_id)
        self.large = BlockPool(is_small=False, pool_id=pool_id)
        self.use_count = 0


class PoolOwner(Protocol):
    """What a MemPool asks of its allocator: CachingAllocator has these through memory_api.MemoryAPI. A protocol,
    so that this module, which the allocator imports, need not import the allocator."""

    def _incref_pool(self, pool_id: PoolId) -> None: ...

    def _decref_pool(self, pool_id: PoolId) -> None: ...

    def _pool_use_count(self, pool_id: PoolId) -> int: ...

    def snapshot(self) -> dict: ...


class MemPool:
    """torch.cuda.MemPool: a handle on a private pool of one allocator. Make one with alloc.mem_pool(), route a
    thread's allocations to it with ``with alloc.use_mem_pool(pool):``. When the handle is deleted (and no
    context uses the pool), the pool's cached segments go back at the next empty_cache()."""

    def __init__(self, allocator: PoolOwner, pool_id: PoolId) -> None:
        self._allocator = allocator
        self._id = pool_id
        allocator._incref_pool(pool_id)
        # PyTorch's ~MemPool calls releasePool: here when the handle is garbage-collected
        self._finalizer = weakref.finalize(self, allocator._decref_pool, pool_id)

    @property
    def id(self) -> PoolId:
        """The pool's id, as the snapshot's segment_pool_id writes it."""
        return self._id

    def use_count(self) -> int:
        """1 for this object, plus one for each open use_mem_pool context."""
        return self._allocator._pool_use_count(self._id)

    def snapshot(self) -> list[dict[str, Any]]:
        """The segments of this pool, in the snapshot schema (MemPool.snapshot)."""
        return [s for s in self._allocator.snapshot()["segments"] if tuple(s["segment_pool_id"]) == self._id]

    def __repr__(self) -> str:
        return f"MemPool(id={self._id}, use_count={self.use_count()})"
