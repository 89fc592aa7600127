"""Paging: a PagedAttention KV cache in fixed-size blocks, managed the way vLLM manages it.

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023
(arXiv:2309.06180). A contiguous KV cache reserves each request's maximum length up front, so most of it holds
nothing (reserved slots, internal and external fragmentation: the paper measures only 20.4-38.2% of KV memory
holding real tokens). PagedAttention cuts the cache into blocks of `block_size` tokens (16 by default) and gives
each sequence a BLOCK TABLE mapping its logical blocks to physical ones, as an OS page table maps pages. A new
physical block is taken only when the last one is full, so a sequence wastes at most one partly filled block.

The pieces, each mirroring vLLM (V1: vllm/v1/core/block_pool.py, kv_cache_utils.py) or nano-vllm
(nanovllm/engine/block_manager.py):

- FreeBlockQueue (FreeKVCacheBlockQueue): free blocks in a doubly linked list with sentinels, in LRU order.
  Allocation pops the head; freeing appends at the tail; a prefix-cache hit on a free block unlinks it from the
  middle in O(1), which a deque cannot do.
- Reference counts (KVCacheBlock.ref_cnt): a block is shared by every table that holds it and is free at 0.
- Prefix caching (BlockPool.cache_full_blocks, get_cached_block, hash_block_tokens): a FULL block is hashed
  with its parent's hash, hash(parent_hash, tokens), so equal hashes mean equal prefixes (barring collisions).
  On a hit the stored key is compared too, so a collision costs a miss, not wrong attention (nano-vllm checks
  the tokens).
  A freed block keeps its hash and can be reused by prefix until the LRU queue hands it out again (eviction).
- Fork and copy-on-write (paper section 4.4; vLLM V0's fork and cow for parallel sampling and beam search): a
  fork shares every block; before a shared block (ref_cnt > 1) is written, the writer gets a fresh copy, and
  the (src, dst) pair is recorded for the caller to copy, as vLLM's copy_blocks kernel does.
- Preemption (paper section 4.5): recompute (drop the blocks; re-prefill prompt + generated tokens later) or swap
  (move the blocks to a host-side pool; the (gpu_block, cpu_block) pairs are returned for the copy).

KVCache describes the storage: one array of shape [num_blocks, 2, block_size, heads, head_dim] per layer,
allocated ONCE through minialloc's CachingAllocator (accounting), with optional data: a NumPy array for the
reference kernels at the bottom of this file, or an array where a minialloc.kernels runner works (CuPy on a real
GPU), moved by the copy_blocks kernel (copy-on-write) and by device gathers and transfers (swap).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .kernels.reference import copy_waves

if TYPE_CHECKING:
    from .allocator import CachingAllocator
    from .kernels.launch import Kernels

DEFAULT_BLOCK_SIZE = 16  # the paper's default (section 7.2 finds 16-128 best)
ROOT_HASH = 0x5EED  # parent hash of a sequence's first block; an int so hashes are the same in every run


class PagingError(Exception):
    """Base class of the block manager's errors."""


class OutOfBlocksError(PagingError, MemoryError):
    """Not enough free blocks: the scheduler catches this and preempts or waits."""

    def __init__(self, needed: int, free: int, what: str) -> None:
        super().__init__(f"{what}: needs {needed} free KV block(s), only {free} free")
        self.needed, self.free = needed, free


class RequestTooLongError(PagingError, MemoryError):
    """A request the whole cache could never hold: rejected, not queued (it would wait, or preempt, forever).

    A MemoryError like OutOfBlocksError (code that treats "not enough blocks" as MemoryError still does), but not
    an OutOfBlocksError: the scheduler catches that one to wait or preempt, which cannot help here."""


class UnknownSequenceError(PagingError, LookupError):
    """The sequence id was never allocated here, or was freed or preempted already."""


class FinishedSequenceError(PagingError):
    """The sequence finished (was freed); it can take no more tokens."""


class SwappedSequenceError(PagingError):
    """The sequence lives in the host pool (swapped out); swap it in before using it."""


def hash_block_tokens(parent_hash: int, tokens: Sequence[int]) -> int:
    """Hash of a full block chained to its prefix (vLLM hash_block_tokens). Tests monkeypatch it to collide."""
    return hash((parent_hash, tuple(tokens)))


class Block:
    """One physical KV block (vLLM KVCacheBlock): its id, reference count, prefix-cache key and free-list links."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "key", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # set once the block is full and cached
        self.key: tuple[int, tuple[int, ...]] | None = None  # (parent hash, tokens) the hash was made from
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Free blocks, least recently freed first, as a doubly linked list (vLLM FreeKVCacheBlockQueue).

    Two sentinel blocks (id -1) bound the list, so every real block in it has both neighbours and no operation
    needs a branch for the ends. A block is in the queue exactly when its links are set.
    """

    def __init__(self, blocks: Iterable[Block]) -> None:
        self.head, self.tail = Block(-1), Block(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free

    def __iter__(self) -> Iterator[Block]:
        block = self.head.next_free
        while block is not self.tail:
            assert block is not None
            yield block
            block = block.next_free

    def popleft(self) -> Block:
        if self.num_free == 0:
            raise OutOfBlocksError(1, 0, "popleft")
        block = self.head.next_free
        assert block is not None
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        """Unlink a block from anywhere in the queue in O(1) (a prefix-cache hit on a free block)."""
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def append(self, block: Block) -> None:
        last = self.tail.prev_free
        assert last is not None and block.prev_free is None
        last.next_free, block.prev_free = block, last
        block.next_free, self.tail.prev_free = self.tail, block
        self.num_free += 1


class SeqState:
    """A sequence as the block manager sees it: its tokens and its block table (GPU block ids, or CPU when swapped)."""

    __slots__ = ("tokens", "table")

    def __init__(self, tokens: list[int], table: list[int]) -> None:
        self.tokens, self.table = tokens, table


class BlockManager:
    """Block tables, reference counts, prefix caching and copy-on-write over `num_blocks` GPU blocks.

    The core of vLLM's KV cache manager: V1's BlockPool (free queue, prefix cache) with V0's fork and
    copy-on-write. Methods raise OutOfBlocksError BEFORE changing anything, so a caller can catch it and preempt.
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size, self.caching = block_size, enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, Block] = {}  # block hash -> a full block with that content (free or not)
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

    def _take(self, block: Block) -> Block:
        """ref_cnt += 1; a free block leaves the queue (vLLM BlockPool.touch)."""
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1
        return block

    def _new_block(self) -> Block:
        """The least recently freed block; a cached one is evicted from the prefix cache (get_new_blocks)."""
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
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

    def _prefix_hits(self, tokens: Sequence[int]) -> list[Block]:
        """The cached blocks holding the longest prefix of full blocks of `tokens` (get_computed_blocks)."""
        hits: list[Block] = []
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
        while len(state.table) * self.block_size < len(tokens):
            state.table.append(self._new_block().block_id)
            if len(state.table) * self.block_size <= len(tokens):
                self._seal(state, len(state.table) - 1)
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


class HostPool:
    """Swap preemption: `num_blocks` host-side blocks a group of sequences moves to and back (vLLM V0 swap).

    Blocks shared inside the group are copied once each way, and the host blocks are reference counted like the
    GPU ones. Prefix-cache hashes are recomputed when the blocks come back.
    """

    def __init__(self, manager: BlockManager, num_blocks: int) -> None:
        self.m = manager
        self.ref_cnt = [0] * num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))
        self.seqs: dict[int, SeqState] = {}  # swapped sequences; tables hold host block ids

    def swap_out(self, seq_ids: Iterable[int]) -> list[tuple[int, int]]:
        """Move a group to the host; returns the (gpu_block, cpu_block) pairs to copy before the GPU reuses them."""
        ids = list(seq_ids)
        states = [self.m.seq(s) for s in ids]
        gpu = list(dict.fromkeys(b for st in states for b in st.table))
        if len(gpu) > len(self.free):
            raise OutOfBlocksError(len(gpu), len(self.free), "swap_out (host pool)")
        mapping = {g: self.free.pop() for g in gpu}
        for sid, st in zip(ids, states, strict=True):
            self.m.preempt(sid)
            self.m.swapped.add(sid)
            st.table = [mapping[g] for g in st.table]
            for c in st.table:
                self.ref_cnt[c] += 1
            self.seqs[sid] = st
        return list(mapping.items())

    def swap_in(self, seq_ids: Iterable[int]) -> list[tuple[int, int]]:
        """Bring a swapped group back to new GPU blocks; returns the (cpu_block, gpu_block) pairs to copy."""
        ids = list(seq_ids)
        missing = [s for s in ids if s not in self.seqs]
        if missing:
            raise UnknownSequenceError(f"sequences {missing} are not swapped out")
        cpu = list(dict.fromkeys(c for s in ids for c in self.seqs[s].table))
        if len(cpu) > self.m.num_free_blocks:
            raise OutOfBlocksError(len(cpu), self.m.num_free_blocks, "swap_in")
        mapping = {c: self.m._new_block() for c in cpu}
        for b in mapping.values():
            b.ref_cnt = 0  # counted below, once per table holding it
        for sid in ids:
            st = self.seqs.pop(sid)
            for c in st.table:
                self.ref_cnt[c] -= 1
                if self.ref_cnt[c] == 0:
                    self.free.append(c)
                mapping[c].ref_cnt += 1
            st.table = [mapping[c].block_id for c in st.table]
            self.m.swapped.discard(sid)
            self.m.seqs[sid] = st
            for i in range(len(st.tokens) // self.m.block_size):
                if self.m.blocks[st.table[i]].block_hash is None:
                    self.m._seal(st, i)
        return [(c, b.block_id) for c, b in mapping.items()]

    def drop(self, seq_ids: Iterable[int]) -> None:
        """Sequences that finish (are aborted) while swapped out: their host blocks return to the host pool."""
        for sid in seq_ids:
            st = self.seqs.pop(sid, None)
            if st is None:
                raise UnknownSequenceError(f"sequence {sid} is not swapped out")
            for c in st.table:
                self.ref_cnt[c] -= 1
                if self.ref_cnt[c] == 0:
                    self.free.append(c)
            self.m.swapped.discard(sid)
            self.m.finished.add(sid)


def check_invariants(m: BlockManager, host: HostPool | None = None) -> None:
    """Every block free xor referenced, ref_cnt = number of tables holding it, free + used = total (tests)."""
    refs = [0] * len(m.blocks)
    for st in m.seqs.values():
        assert len(st.table) == -(-len(st.tokens) // m.block_size), "one block per block_size tokens"
        for bid in st.table:
            refs[bid] += 1
    in_queue = {b.block_id for b in m.free_queue}
    assert len(in_queue) == len(m.free_queue), "free queue length disagrees with its links"
    for block, n in zip(m.blocks, refs, strict=True):
        assert block.ref_cnt == n, f"{block} is held by {n} tables"
        assert (block.block_id in in_queue) == (n == 0), f"{block} is free and referenced, or neither"
    assert len(in_queue) + sum(n > 0 for n in refs) == len(m.blocks)
    for h, block in m.cached.items():
        assert block.block_hash == h and block.key is not None, f"stale prefix-cache entry {block}"
    if host is not None:
        cpu_refs = [0] * len(host.ref_cnt)
        for st in host.seqs.values():
            for c in st.table:
                cpu_refs[c] += 1
        assert cpu_refs == host.ref_cnt and set(host.seqs) == m.swapped
        assert sorted(host.free) == [c for c, n in enumerate(cpu_refs) if n == 0]


# -- the KV storage ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVSpec:
    """Shape of a model's KV cache: per token and layer, a key and a value of num_kv_heads x head_dim."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # fp16

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x hidden x bytes; OPT-13B: 2 x 40 x 5120 x 2 = 800 KiB (paper section 3)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


class KVCache:
    """The paged KV storage: [num_blocks, 2, block_size, heads, head_dim] per layer, allocated once up front.

    The bytes come from a minialloc CachingAllocator in one malloc (accounting), as vLLM allocates its KV tensors
    once at start-up, sized by profiling. `with_data=True` adds the data, shape [num_layers, num_blocks, 2,
    block_size, heads, head_dim], float32: a NumPy array (small configurations, the reference kernels), or with
    `kernels` (a minialloc.kernels runner) an array where those kernels run: CuPy memory with CupyKernels on a
    real GPU, NumPy with EmulatedKernels. The methods below apply the block manager's lists to the data:
    copy-on-write with the copy_blocks kernel (NumPy twin without kernels), swap with gathers and one transfer
    each way, attention with the paged_attention kernel (NumPy twin without kernels).
    """

    MAX_HOST_BYTES = 1 << 30  # host data is for small configurations: refuse to fill the host's memory

    def __init__(self, allocator: CachingAllocator, spec: KVSpec, num_blocks: int,
                 block_size: int = DEFAULT_BLOCK_SIZE, with_data: bool = False, kernels: Kernels | None = None) -> None:
        self.spec, self.num_blocks, self.block_size = spec, num_blocks, block_size
        self.block_bytes = spec.bytes_per_token * block_size
        self.nbytes = self.block_bytes * num_blocks
        self.allocator = allocator
        self.kernels = kernels
        self.xp: Any = np if kernels is None else kernels.xp
        self.ptr = allocator.malloc(self.nbytes)
        self.shape = (spec.num_layers, num_blocks, 2, block_size, spec.num_kv_heads, spec.head_dim)
        data_bytes = 4 * int(np.prod(self.shape))
        if with_data and self.xp is np and data_bytes > self.MAX_HOST_BYTES:
            allocator.free(self.ptr)
            raise ValueError(f"with_data needs {data_bytes} bytes of host memory; use a smaller config")
        self.data = self.xp.zeros(self.shape, dtype=self.xp.float32) if with_data else None

    @classmethod
    def from_budget(cls, allocator: CachingAllocator, spec: KVSpec, budget_bytes: int,
                    block_size: int = DEFAULT_BLOCK_SIZE, with_data: bool = False,
                    kernels: Kernels | None = None) -> KVCache:
        """As many blocks as fit in `budget_bytes` (vLLM: free memory after profiling // block bytes)."""
        return cls(allocator, spec, budget_bytes // (spec.bytes_per_token * block_size), block_size, with_data,
                   kernels)

    def release(self) -> None:
        self.allocator.free(self.ptr)
        self.ptr = 0

    def layer(self, i: int) -> Any:
        return self._data()[i]

    def _data(self) -> Any:
        if self.data is None:
            raise ValueError("this KVCache has no data: create it with with_data=True")
        return self.data

    def copy_blocks(self, pairs: Iterable[tuple[int, int]]) -> int:
        """Apply copy-on-write pairs, in the order the block manager recorded them, to every layer.

        With kernels: the copy_blocks kernel over the cache seen as [num_layers * num_blocks, block bytes], one
        launch per wave of copy_waves (pairs that may run in parallel), each pair expanded to every layer. Without:
        copy_blocks_reference per layer. Returns the number of kernel launches (0 without kernels).
        """
        data, pairs = self._data(), list(pairs)
        if self.kernels is None:
            for layer in data:
                copy_blocks_reference(layer, pairs)
            return 0
        rows = data.reshape(self.spec.num_layers * self.num_blocks, -1).view(self.xp.uint8)
        waves = copy_waves(pairs)
        for wave in waves:
            self.kernels.copy_blocks(rows, [(src + i * self.num_blocks, dst + i * self.num_blocks)
                                            for i in range(self.spec.num_layers) for src, dst in wave])
        return len(waves)

    def new_host_store(self, num_blocks: int) -> np.ndarray:
        """Host memory for a HostPool of `num_blocks` blocks (pinned when the data lives on a GPU, so the
        transfers are DMA)."""
        shape = (self.spec.num_layers, num_blocks, *self.shape[2:])
        if self.xp is np:
            return np.zeros(shape, dtype=np.float32)
        import cupyx

        host = cupyx.empty_pinned(shape, dtype=np.float32)
        host[...] = 0
        return host

    def swap_out(self, pairs: Iterable[tuple[int, int]], host: np.ndarray) -> None:
        """Copy (gpu_block, cpu_block) pairs (HostPool.swap_out's) to the host store, every layer: one gather on
        the device, one transfer. Call before the GPU blocks are reused."""
        data, pairs = self._data(), list(pairs)
        if not pairs:
            return
        gpu, cpu = (np.array(side, dtype=np.int64) for side in zip(*pairs, strict=True))
        staged = data[:, self.xp.asarray(gpu)]
        host[:, cpu] = staged if self.kernels is None else self.kernels.to_host(staged)

    def swap_in(self, pairs: Iterable[tuple[int, int]], host: np.ndarray) -> None:
        """Copy (cpu_block, gpu_block) pairs (HostPool.swap_in's) back: one transfer, one scatter on the device."""
        data, pairs = self._data(), list(pairs)
        if not pairs:
            return
        cpu, gpu = (np.array(side, dtype=np.int64) for side in zip(*pairs, strict=True))
        staged = host[:, cpu]
        data[:, self.xp.asarray(gpu)] = staged if self.kernels is None else self.kernels.to_device(staged)

    def attention(self, layer: int, q: Any, block_tables: Any, context_lens: Sequence[int], scale: float) -> Any:
        """Decode attention of one layer through the block tables: the paged_attention kernel with kernels
        (q where they run), paged_attention_reference without."""
        if self.kernels is None:
            return paged_attention_reference(q, self.layer(layer), np.asarray(block_tables), context_lens, scale)
        return self.kernels.paged_attention(q, self.layer(layer), block_tables, context_lens, scale)


# -- NumPy references for the kernels ----------------------------------------------------------------------------
def write_kv_reference(kv_cache: np.ndarray, block_table: Sequence[int], pos: int, k: np.ndarray,
                       v: np.ndarray) -> None:
    """Store one token's K and V ([heads, head_dim]) at position `pos` through a block table (reshape_and_cache)."""
    bs = kv_cache.shape[2]
    block, off = block_table[pos // bs], pos % bs
    kv_cache[block, 0, off] = k
    kv_cache[block, 1, off] = v


def copy_blocks_reference(kv_cache: np.ndarray, pairs: Iterable[tuple[int, int]]) -> None:
    """Copy whole blocks src -> dst, keys and values, ONE PAIR AFTER ANOTHER (the copies of copy-on-write).

    Sequential on purpose: that is what the block manager's list means (a later pair may copy a block an earlier
    one wrote, a fork of a fork). The copy_blocks kernel runs its pairs in parallel and refuses such lists, so the
    GPU path (KVCache.copy_blocks, Kernels.copy_blocks_in_order) splits them with kernels.reference.copy_waves;
    the tests check that both give this function's result.
    """
    num_blocks = kv_cache.shape[0]
    for src, dst in pairs:
        if not (0 <= src < num_blocks and 0 <= dst < num_blocks):
            raise ValueError(f"block pair ({src}, {dst}) outside [0, {num_blocks})")
        kv_cache[dst] = kv_cache[src]


def paged_attention_reference(q: np.ndarray, kv_cache: np.ndarray, block_tables: np.ndarray,
                              context_lens: Sequence[int], scale: float) -> np.ndarray:
    """Decode attention through block tables, one block at a time with an online softmax, as the kernel works.

    q: [num_seqs, num_heads, head_dim]; kv_cache: [num_blocks, 2, block_size, num_kv_heads, head_dim];
    block_tables: [num_seqs, max_blocks] (entries past a sequence's context are ignored); context_lens:
    [num_seqs]. num_heads may be a multiple of num_kv_heads (grouped-query attention). Returns q's shape.
    The CUDA kernel with these semantics is minialloc/kernels/paged_attention.cu (float32 throughout).
    """
    num_seqs, num_heads, head_dim = q.shape
    bs, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = np.zeros((num_seqs, num_heads, head_dim), dtype=np.float64)
    for s in range(num_seqs):
        qs = q[s].astype(np.float64).reshape(num_kv_heads, group, head_dim)
        m = np.full((num_kv_heads, group), -np.inf)  # running max of the scores
        denom = np.zeros((num_kv_heads, group))
        acc = np.zeros((num_kv_heads, group, head_dim))
        for j in range(-(-int(context_lens[s]) // bs)):
            n = min(bs, int(context_lens[s]) - j * bs)
            k = kv_cache[block_tables[s][j], 0, :n].astype(np.float64)  # [n, kv_heads, head_dim]
            v = kv_cache[block_tables[s][j], 1, :n].astype(np.float64)
            scores = np.einsum("hgd,nhd->hgn", qs, k) * scale
            m_new = np.maximum(m, scores.max(axis=-1))
            p = np.exp(scores - m_new[..., None])
            rescale = np.exp(m - m_new)
            denom = denom * rescale + p.sum(axis=-1)
            acc = acc * rescale[..., None] + np.einsum("hgn,nhd->hgd", p, v)
            m = m_new
        out[s] = (acc / denom[..., None]).reshape(num_heads, head_dim)
    return out.astype(q.dtype)


def dense_attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, context_lens: Sequence[int],
                              scale: float) -> np.ndarray:
    """The same decode attention over contiguous K/V: k, v [num_seqs, max_len, num_kv_heads, head_dim]."""
    num_seqs, num_heads, head_dim = q.shape
    group = num_heads // k.shape[2]
    out = np.zeros_like(q)
    for s in range(num_seqs):
        n = int(context_lens[s])
        ks = np.repeat(k[s, :n], group, axis=1)  # [n, heads, head_dim]
        vs = np.repeat(v[s, :n], group, axis=1)
        scores = np.einsum("hd,nhd->hn", q[s], ks) * scale
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[s] = np.einsum("hn,nhd->hd", p / p.sum(axis=-1, keepdims=True), vs)
    return out
