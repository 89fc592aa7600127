"""The block manager: block tables, reference counts, prefix caching and copy-on-write over fixed-size KV blocks.

Mirrors vLLM (V1: vllm/v1/core/block_pool.py, kv_cache_utils.py) and nano-vllm (nanovllm/engine/block_manager.py):

- Reference counts (KVCacheBlock.ref_cnt): a block is shared by every table that holds it, free at 0 (free_queue.py).
- Prefix caching (BlockPool.cache_full_blocks, get_cached_block, hash_block_tokens): a FULL block is hashed
  with its parent's hash, hash(parent_hash, tokens), so equal hashes mean equal prefixes (barring collisions).
  On a hit the stored key is compared too, so a collision costs a miss, not wrong attention (nano-vllm checks
  the tokens). A freed block keeps its hash and can be reused by prefix until the LRU queue hands it out again.
- Fork and copy-on-write (paper section 4.4; vLLM V0's fork and cow for parallel sampling and beam search): a
  fork shares every block; before a shared block (ref_cnt > 1) is written, the writer gets a fresh copy, and
  the (src, dst) pair is recorded for the caller to copy, as vLLM's copy_blocks kernel does.

Only block ids move here; the bytes live in a KVCache (kv_cache.py), and swapping to the host in host_pool.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .errors import (
    FinishedSequenceError,
    OutOfBlocksError,
    RequestTooLongError,
    SwappedSequenceError,
    UnknownSequenceError,
)
from .free_queue import FreeBlockQueue, KVBlock

DEFAULT_BLOCK_SIZE = 16  # the paper's default (section 7.2 finds 16-128 best)
ROOT_HASH = 0x5EED  # parent hash of a sequence's first block; an int so hashes are the same in every run


def hash_block_tokens(parent_hash: int, tokens: Sequence[int]) -> int:
    """Hash of a full block chained to its prefix (vLLM hash_block_tokens). Tests monkeypatch it to collide."""
    return hash((parent_hash, tuple(tokens)))


class SeqState:
    """A sequence as the block manager sees it: its tokens and its block table (GPU block ids, or CPU when swapped)."""

    __slots__ = ("tokens", "table")

    def __init__(self, tokens: list[int], table: list[int]) -> None:
        self.tokens, self.table = tokens, table


class BlockManager:
    """Block tables, reference counts, prefix caching and copy-on-write over `num_blocks` GPU blocks.

    Methods raise OutOfBlocksError BEFORE changing anything, so a caller can catch it and preempt.
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size, self.caching = block_size, enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, KVBlock] = {}  # block hash -> a full block with that content (free or not)
        self.seqs: dict[int, SeqState] = {}
        self.finished: set[int] = set()
        self.swapped: set[int] = set()  # ids a HostPool holds, for a clear error
        self.copies: list[tuple[int, int]] = []  # CoW (src, dst) pairs not yet taken by the caller

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def seq(self, seq_id: int) -> SeqState:
        state = self.seqs.get(seq_id)
        if state is None:
            if seq_id in self.finished:
                raise FinishedSequenceError(f"sequence {seq_id} has finished and was freed")
            if seq_id in self.swapped:
                raise SwappedSequenceError(f"sequence {seq_id} is swapped out to the host pool")
            raise UnknownSequenceError(f"sequence {seq_id} is not allocated in this block manager")
        return state

    def _take(self, block: KVBlock) -> KVBlock:
        """ref_cnt += 1; a free block leaves the queue (vLLM BlockPool.touch)."""
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1
        return block

    def _new_block(self) -> KVBlock:
        """The least recently freed block; a cached one is evicted from the prefix cache (get_new_blocks)."""
        block = self.free_queue.popleft()
        if block.block_hash is not None and self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = block.key = None
        block.ref_cnt = 1
        return block

    def _release(self, block_ids: Iterable[int]) -> None:
        """ref_cnt -= 1; at 0 the block joins the queue's tail, hash kept so a prefix hit can still revive it."""
        for bid in block_ids:
            block = self.blocks[bid]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def _seal(self, state: SeqState, i: int) -> None:
        """Block i of the sequence just became full: cache it by its chained hash (cache_full_blocks)."""
        if not self.caching:
            return
        parent = ROOT_HASH if i == 0 else self.blocks[state.table[i - 1]].block_hash
        assert parent is not None, "every full block before a full block is cached"
        block, bs = self.blocks[state.table[i]], self.block_size
        block.key = (parent, tuple(state.tokens[i * bs:(i + 1) * bs]))
        block.block_hash = hash_block_tokens(*block.key)
        self.cached[block.block_hash] = block

    def _prefix_hits(self, tokens: Sequence[int]) -> list[KVBlock]:
        """The cached blocks holding the longest prefix of full blocks of `tokens` (get_computed_blocks)."""
        hits: list[KVBlock] = []
        parent, bs = ROOT_HASH, self.block_size
        for i in range(len(tokens) // bs if self.caching else 0):
            key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
            block = self.cached.get(hash_block_tokens(*key))
            if block is None or block.key != key:  # a miss, or a hash collision caught by the key check
                break
            hits.append(block)
            parent = block.block_hash  # type: ignore[assignment]
        return hits

    def allocate(self, seq_id: int, tokens: Sequence[int]) -> int:
        """Give a new sequence blocks for its prompt, reusing cached prefix blocks; returns the cached tokens."""
        if seq_id in self.seqs or seq_id in self.swapped:
            raise ValueError(f"sequence {seq_id} is already allocated")
        total = -(-len(tokens) // self.block_size)
        if total > len(self.blocks):
            raise RequestTooLongError(
                f"sequence {seq_id}: {len(tokens)} tokens need {total} KV blocks of {self.block_size} tokens, the "
                f"whole cache has {len(self.blocks)} blocks ({len(self.blocks) * self.block_size} tokens)")
        hits = self._prefix_hits(tokens)
        needed = total - len(hits) + sum(b.ref_cnt == 0 for b in hits)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(needed, self.num_free_blocks, f"allocate(seq {seq_id}, {len(tokens)} tokens)")
        state = SeqState(list(tokens), [self._take(b).block_id for b in hits])
        state.table += [self._new_block().block_id for _ in range(total - len(hits))]
        for i in range(len(hits), len(tokens) // self.block_size):  # the new full blocks join the prefix cache
            self._seal(state, i)
        self.seqs[seq_id] = state
        self.finished.discard(seq_id)
        return len(hits) * self.block_size

    def blocks_to_append(self, seq_id: int) -> int:
        """Free blocks the next token needs: 1 when the last block is full or shared (CoW), else 0."""
        state = self.seq(seq_id)
        if len(state.tokens) % self.block_size == 0:
            return 1
        return int(self.blocks[state.table[-1]].ref_cnt > 1)

    def append_token(self, seq_id: int, token: int) -> tuple[int, int] | None:
        """Add one generated token; returns the (src, dst) copy when a shared block was copied on write."""
        state = self.seq(seq_id)
        if self.blocks_to_append(seq_id) > self.num_free_blocks:
            raise OutOfBlocksError(1, 0, f"append_token(seq {seq_id})")
        copy = None
        if len(state.tokens) % self.block_size == 0:
            state.table.append(self._new_block().block_id)
        elif self.blocks[state.table[-1]].ref_cnt > 1:  # copy-on-write: the other holders keep the old block
            copy = (state.table[-1], self._new_block().block_id)
            self._release([copy[0]])
            state.table[-1] = copy[1]
            self.copies.append(copy)
        state.tokens.append(token)
        if len(state.tokens) % self.block_size == 0:
            self._seal(state, len(state.table) - 1)
        return copy

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares all the parent's blocks (parallel sampling, beam search): nothing is copied yet."""
        parent = self.seq(parent_id)
        if child_id in self.seqs or child_id in self.swapped:
            raise ValueError(f"sequence {child_id} is already allocated")
        for bid in parent.table:
            self.blocks[bid].ref_cnt += 1
        self.seqs[child_id] = SeqState(list(parent.tokens), list(parent.table))
        self.finished.discard(child_id)

    def free(self, seq_id: int) -> None:
        """The sequence finished: release its blocks, last block first so its prefix is evicted last (vLLM)."""
        self.preempt(seq_id)
        self.finished.add(seq_id)

    def preempt(self, seq_id: int) -> list[int]:
        """Recompute-style preemption: drop the blocks; returns the tokens to re-prefill with allocate later."""
        state = self.seq(seq_id)
        self._release(reversed(state.table))
        del self.seqs[seq_id]
        return state.tokens

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write pairs since the last call, for the caller's copy_blocks (then forgotten here)."""
        copies, self.copies = self.copies, []
        return copies
