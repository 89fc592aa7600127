"""The allocator's tables as its friend modules see them: restore.py (which writes them) and invariants.py (which
checks them) are typed against this Protocol, not against CachingAllocator, so they never import allocator.py and
the allocator may import them without an import circle (the same pattern as AllocatorHost in extension.py).

CachingAllocator satisfies it structurally: the attributes are set in its __init__ and the methods are its own
(allocator.py) or MemoryAPI's (memory_api.py). It adds to AllocatorHost (device, stats, lock, max_split_size,
pools()...) the private tables that only a friend may touch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from .extension import AllocatorHost

if TYPE_CHECKING:
    from .blocks import Block, BlockPool
    from .expandable import ExpandableSegment
    from .mempool import PoolId, PrivatePool

__all__ = ["AllocatorTables"]


class AllocatorTables(AllocatorHost, Protocol):
    """AllocatorHost plus the allocator's own tables (active_blocks, the private pools, the expandable segments,
    total_allocated_memory) and the policy's methods that walk or release them."""

    _total_reserved: int
    _active: dict[int, Block]
    _private: dict[PoolId, PrivatePool]
    _expandable_segments: list[ExpandableSegment]

    def _block_pools(self) -> list[BlockPool]: ...

    def _all_blocks(self) -> Iterator[Block]: ...

    def _release_block(self, block: Block) -> None: ...

    def _incref_pool(self, pool_id: PoolId) -> None: ...

    def _expandable_page_size(self, small: bool) -> int: ...
