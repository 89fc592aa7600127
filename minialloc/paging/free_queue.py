"""Physical KV blocks and the free list that hands them out in LRU order (vLLM KVCacheBlock, FreeKVCacheBlockQueue).

A doubly linked list with sentinels, not a deque: a prefix-cache hit on a free block must unlink it from the middle
in O(1).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .errors import OutOfBlocksError


class KVBlock:
    """One physical KV block (vLLM KVCacheBlock): its id, reference count, prefix-cache key and free-list links."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "key", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # set once the block is full and cached
        self.key: tuple[int, tuple[int, ...]] | None = None  # (parent hash, tokens) the hash was made from
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Free blocks, least recently freed first, as a doubly linked list (vLLM FreeKVCacheBlockQueue).

    Two sentinel blocks (id -1) bound the list, so every real block in it has both neighbours and no operation
    needs a branch for the ends. A block is in the queue exactly when its links are set.
    """

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self.head, self.tail = KVBlock(-1), KVBlock(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free

    def __iter__(self) -> Iterator[KVBlock]:
        block = self.head.next_free
        while block is not self.tail:
            assert block is not None
            yield block
            block = block.next_free

    def popleft(self) -> KVBlock:
        if self.num_free == 0:
            raise OutOfBlocksError(1, 0, "popleft")
        block = self.head.next_free
        assert block is not None
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        """Unlink a block from anywhere in the queue in O(1) (a prefix-cache hit on a free block)."""
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def append(self, block: KVBlock) -> None:
        last = self.tail.prev_free
        assert last is not None and block.prev_free is None
        last.next_free, block.prev_free = block, last
        block.next_free, self.tail.prev_free = self.tail, block
        self.num_free += 1


Block = KVBlock  # the name the course and older code use; the allocator has a Block of its own
