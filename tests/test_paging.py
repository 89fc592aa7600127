"""minialloc.paging: the free queue, block tables, refcounts, copy-on-write, prefix caching, swap, references."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minialloc import CachingAllocator, SimulatedGPU, paging
from minialloc.config import AllocatorConfig
from minialloc.paging import (
    Block,
    BlockManager,
    FinishedSequenceError,
    FreeBlockQueue,
    HostPool,
    KVCache,
    KVSpec,
    OutOfBlocksError,
    RequestTooLongError,
    SwappedSequenceError,
    UnknownSequenceError,
    check_block_invariants,
    copy_blocks_reference,
    dense_attention_reference,
    paged_attention_reference,
    write_kv_reference,
)
from minialloc.sizes import GiB, KiB

BS = 4  # small blocks keep the tables short and readable


def ids(queue: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in queue]


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# -- the free queue ------------------------------------------------------------------------------------------------
def test_free_queue_is_fifo_in_lru_order() -> None:
    blocks = [Block(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert ids(q) == [0, 1, 2, 3, 4] and len(q) == 5
    assert q.popleft() is blocks[0] and q.popleft() is blocks[1]
    q.append(blocks[0])  # freed last: used last
    assert ids(q) == [2, 3, 4, 0]


def test_free_queue_removes_from_the_middle_without_walking(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [Block(i) for i in range(10_000)]
    q = FreeBlockQueue(blocks)

    def no_walk(self: FreeBlockQueue) -> None:
        raise AssertionError("remove must not traverse the list")

    monkeypatch.setattr(FreeBlockQueue, "__iter__", no_walk)
    for i in range(1, 9_999, 2):  # unlink every odd block: O(1) each, by its own links
        q.remove(blocks[i])
    q.remove(blocks[9_999])  # the last one, next to the tail sentinel
    monkeypatch.undo()
    assert len(q) == 5_000 and ids(q) == list(range(0, 10_000, 2))
    assert blocks[1].prev_free is None and blocks[1].next_free is None
    with pytest.raises(AssertionError, match="not in the free queue"):
        q.remove(blocks[1])


def test_free_queue_empty_raises_out_of_blocks() -> None:
    q = FreeBlockQueue([Block(0)])
    q.popleft()
    with pytest.raises(OutOfBlocksError):
        q.popleft()


# -- block tables, refcounts, fork and copy-on-write ------------------------------------------------------------------
def test_allocate_takes_one_block_per_block_size_tokens_in_lru_order() -> None:
    m = BlockManager(8, BS)
    assert m.allocate(0, toks(0, 9)) == 0  # nothing cached yet
    assert m.seq(0).table == [0, 1, 2]
    assert [m.blocks[b].ref_cnt for b in range(4)] == [1, 1, 1, 0]
    assert m.num_free_blocks == 5
    # a new block only when the last is full: 9 -> 12 tokens fit, the 13th needs block 3
    for t in range(3):
        assert m.blocks_to_append(0) == 0
        m.append_token(0, 100 + t)
    assert m.blocks_to_append(0) == 1
    m.append_token(0, 200)
    assert m.seq(0).table == [0, 1, 2, 3]
    check_block_invariants(m)


def test_fork_shares_blocks_and_copy_on_write_copies_the_shared_last_block() -> None:
    m = BlockManager(8, BS)
    m.allocate(0, toks(0, 6))  # one full block + a partial one holding 2 tokens
    m.fork(0, 1)
    m.fork(0, 2)
    assert m.seq(1).table == m.seq(2).table == [0, 1]
    assert m.blocks[0].ref_cnt == m.blocks[1].ref_cnt == 3
    assert m.blocks_to_append(0) == 1  # shared partial block: writing needs a copy
    copy = m.append_token(0, 50)
    assert copy == (1, 2)  # block 1 copied into the next free block, 2
    assert m.seq(0).table == [0, 2] and m.seq(1).table == [0, 1]
    assert m.blocks[1].ref_cnt == 2 and m.blocks[2].ref_cnt == 1
    assert m.append_token(1, 51) == (1, 3)  # still shared by 1 and 2
    assert m.append_token(2, 52) is None  # now the only holder: written in place
    assert m.seq(2).table == [0, 1] and m.blocks[1].ref_cnt == 1
    assert m.take_copies() == [(1, 2), (1, 3)] and m.take_copies() == []
    assert [m.seq(s).tokens[-1] for s in (0, 1, 2)] == [50, 51, 52]
    check_block_invariants(m)


def test_fork_on_a_full_block_needs_no_copy() -> None:
    m = BlockManager(8, BS)
    m.allocate(0, toks(0, 8))
    m.fork(0, 1)
    assert m.append_token(0, 9) is None and m.append_token(1, 9) is None
    assert m.seq(0).table[:2] == m.seq(1).table[:2] == [0, 1]
    assert m.seq(0).table[2] != m.seq(1).table[2]
    check_block_invariants(m)


def test_refcounts_drop_to_zero_only_when_the_last_holder_frees() -> None:
    m = BlockManager(8, BS, enable_prefix_caching=False)
    m.allocate(0, toks(0, 8))
    m.fork(0, 1)
    m.free(0)
    assert m.blocks[0].ref_cnt == 1 and m.num_free_blocks == 6
    m.free(1)
    assert m.blocks[0].ref_cnt == 0 and m.num_free_blocks == 8
    # freed last block first: the tail of the sequence is evicted before its prefix
    assert ids(m.free_queue)[-2:] == [1, 0]
    check_block_invariants(m)


def test_cow_copy_moves_the_data_with_copy_blocks_reference() -> None:
    alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
    cache = KVCache(alloc, KVSpec(1, 2, 4), num_blocks=6, block_size=BS, with_data=True)
    kv = cache.layer(0)
    rng = np.random.default_rng(0)
    m = BlockManager(6, BS)
    m.allocate(0, toks(0, 3))
    for pos in range(3):
        write_kv_reference(kv, m.seq(0).table, pos, rng.normal(size=(2, 4)), rng.normal(size=(2, 4)))
    m.fork(0, 1)
    m.append_token(1, 99)
    copy_blocks_reference(kv, m.take_copies())
    src, dst = m.seq(0).table[0], m.seq(1).table[0]
    assert src != dst and np.array_equal(kv[src, :, :3], kv[dst, :, :3])


# -- prefix caching -----------------------------------------------------------------------------------------------
def test_prefix_cache_hit_shares_full_blocks_only() -> None:
    m = BlockManager(16, BS)
    m.allocate(0, toks(0, 10))  # blocks 0, 1 full (cached), block 2 partial (not cached)
    assert m.allocate(1, toks(0, 10) + [77]) == 8  # the two full blocks hit, the partial one does not
    assert m.seq(1).table[:2] == m.seq(0).table[:2] and m.seq(1).table[2] != m.seq(0).table[2]
    assert m.blocks[0].ref_cnt == 2
    # a different first block breaks the chain: the same second block's tokens do not hit
    assert m.allocate(2, [9, 9, 9, 9] + toks(4, 4)) == 0
    check_block_invariants(m)


def test_freed_blocks_stay_cached_until_evicted_in_lru_order() -> None:
    m = BlockManager(6, BS)
    m.allocate(0, toks(0, 12))  # blocks 0, 1, 2, all full and cached
    m.free(0)
    assert ids(m.free_queue) == [3, 4, 5, 2, 1, 0]  # never-used blocks first, then the tail of seq 0
    assert m.allocate(1, toks(0, 12)) == 12  # a full hit revives the free blocks from the middle of the queue
    assert m.seq(1).table == [0, 1, 2] and ids(m.free_queue) == [3, 4, 5]
    m.free(1)
    m.allocate(2, toks(100, 16))  # 4 new blocks: 3, 4, 5, then evicts block 2 (seq 1's last block)
    assert m.seq(2).table == [3, 4, 5, 2]
    assert m.allocate(3, toks(0, 8)) == 8  # blocks 0 and 1, the prefix, are still cached
    assert m.seq(3).table == [0, 1]
    m.free(2)
    assert m.allocate(4, toks(0, 12)) == 8  # but block 2's content was evicted: its third block misses
    check_block_invariants(m)


def test_hash_collision_is_caught_by_the_token_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging.block_manager, "hash_block_tokens", lambda parent, tokens: 42)  # every block collides
    m = BlockManager(8, BS)
    m.allocate(0, [1, 1, 1, 1])
    assert m.allocate(1, [2, 2, 2, 2]) == 0  # same hash, other tokens: a miss, not a wrong share
    assert m.seq(1).table != m.seq(0).table and m.blocks[m.seq(0).table[0]].ref_cnt == 1
    m.free(1)
    m.free(0)  # block 0's entry was overwritten by block 1's; freeing keeps both blocks as they are
    assert m.allocate(2, [2, 2, 2, 2]) == 4  # same hash, same tokens: a real hit
    check_block_invariants(m)


def test_prefix_caching_can_be_disabled() -> None:
    m = BlockManager(8, BS, enable_prefix_caching=False)
    m.allocate(0, toks(0, 8))
    assert m.allocate(1, toks(0, 8)) == 0 and m.cached == {}


# -- errors -----------------------------------------------------------------------------------------------------------
def test_out_of_blocks_changes_nothing() -> None:
    m = BlockManager(3, BS)
    m.allocate(0, toks(0, 8))
    with pytest.raises(OutOfBlocksError, match="needs 2 free KV block") as err:
        m.allocate(1, toks(50, 8))
    assert err.value.needed == 2 and err.value.free == 1
    assert 1 not in m.seqs and m.num_free_blocks == 1
    m.allocate(2, toks(80, 4))
    with pytest.raises(OutOfBlocksError):
        m.append_token(0, 1)
    assert len(m.seq(0).tokens) == 8
    check_block_invariants(m)


def test_errors_name_the_sequence_and_its_state() -> None:
    m = BlockManager(4, BS)
    with pytest.raises(UnknownSequenceError, match="sequence 7 is not allocated"):
        m.free(7)
    m.allocate(0, toks(0, 2))
    with pytest.raises(ValueError, match="already allocated"):
        m.allocate(0, [1])
    with pytest.raises(ValueError, match="already allocated"):
        m.fork(0, 0)
    m.free(0)
    with pytest.raises(FinishedSequenceError, match="sequence 0 has finished"):
        m.append_token(0, 5)
    with pytest.raises(FinishedSequenceError):
        m.free(0)
    with pytest.raises(ValueError):
        BlockManager(0)


# -- preemption ---------------------------------------------------------------------------------------------------
def test_preempt_recompute_then_reprefill_hits_the_cache() -> None:
    m = BlockManager(8, BS)
    m.allocate(0, toks(0, 5))
    for t in range(4):
        m.append_token(0, 500 + t)
    tokens = m.preempt(0)
    assert tokens == toks(0, 5) + [500, 501, 502, 503] and m.num_free_blocks == 8
    assert 0 not in m.seqs and 0 not in m.finished  # preempted, not finished: it may come back
    assert m.allocate(0, tokens) == 8  # both full blocks still cached: only the last one is recomputed
    check_block_invariants(m)


def test_swap_out_and_in_round_trip_keeps_sharing_and_data() -> None:
    alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
    cache = KVCache(alloc, KVSpec(1, 1, 2), num_blocks=8, block_size=BS, with_data=True)
    kv = cache.layer(0)
    host_kv = np.zeros_like(kv)
    m = BlockManager(8, BS)
    host = HostPool(m, 4)
    m.allocate(0, toks(0, 6))
    m.fork(0, 1)
    m.append_token(1, 9)  # seq 1: shared block 0, own copy of the last block
    for b in range(8):
        kv[b] = b + 1  # recognisable content per block
    before = {s: [float(kv[b, 0, 0, 0, 0]) for b in m.seq(s).table] for s in (0, 1)}
    pairs = host.swap_out([0, 1])
    assert len(pairs) == 3  # blocks 0, 1, 2 once each, although block 0 is in both tables
    for gpu_block, cpu_block in pairs:
        host_kv[cpu_block] = kv[gpu_block]
    assert m.num_free_blocks == 8 and host.seqs[0].table[0] == host.seqs[1].table[0]
    check_block_invariants(m, host)
    with pytest.raises(SwappedSequenceError):
        m.append_token(0, 1)
    kv[:] = 0
    m.allocate(5, toks(1000, 8))  # the GPU blocks are reused meanwhile
    back = host.swap_in([0, 1])
    for cpu_block, gpu_block in back:
        kv[gpu_block] = host_kv[cpu_block]
    assert {s: [float(kv[b, 0, 0, 0, 0]) for b in m.seq(s).table] for s in (0, 1)} == before
    assert m.seq(0).table[0] == m.seq(1).table[0] and m.blocks[m.seq(0).table[0]].ref_cnt == 2
    assert len(host.free_ids) == 4
    m.append_token(0, 7)  # usable again
    check_block_invariants(m, host)


def test_swap_out_fails_cleanly_when_the_host_pool_is_full() -> None:
    m = BlockManager(8, BS)
    host = HostPool(m, 1)
    m.allocate(0, toks(0, 8))
    with pytest.raises(OutOfBlocksError, match="host pool"):
        host.swap_out([0])
    assert m.seq(0).table == [0, 1]
    check_block_invariants(m, host)


# -- the storage and the reference kernels ------------------------------------------------------------------------
def test_kv_cache_is_one_allocation_through_the_caching_allocator() -> None:
    opt13b = KVSpec(num_layers=40, num_kv_heads=40, head_dim=128)
    assert opt13b.bytes_per_token == 800 * KiB  # paper section 3: 800 KB per token
    alloc = CachingAllocator(SimulatedGPU(12 * GiB), AllocatorConfig())
    cache = KVCache.from_budget(alloc, opt13b, 12 * GiB)
    assert cache.num_blocks == 983 and cache.data is None  # 15.7K token slots, paper Table 1
    assert alloc.memory_stats()["allocation.all.current"] == 1
    assert cache.nbytes <= alloc.memory_allocated() < cache.nbytes + 2 * 2**20
    with pytest.raises(ValueError, match="with_data"):
        cache.layer(0)
    cache.release()
    assert alloc.memory_allocated() == 0
    with pytest.raises(ValueError, match="host memory"):
        KVCache.from_budget(alloc, opt13b, 12 * GiB, with_data=True)
    assert alloc.memory_allocated() == 0  # the refused cache gave its device memory back


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (8, 2)])
def test_paged_attention_matches_dense_attention(num_heads: int, num_kv_heads: int) -> None:
    head_dim, num_blocks = 16, 32
    alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
    kv = KVCache(alloc, KVSpec(1, num_kv_heads, head_dim), num_blocks, BS, with_data=True).layer(0)
    rng = np.random.default_rng(1)
    context_lens = [1, 4, 5, 17, 30]
    m = BlockManager(num_blocks, BS)
    for block in rng.permutation(num_blocks):  # scatter the tables over the whole cache
        m.free_queue.remove(m.blocks[block])
        m.free_queue.append(m.blocks[block])
    max_len = max(context_lens)
    k = rng.normal(size=(len(context_lens), max_len, num_kv_heads, head_dim)).astype(np.float32)
    v = rng.normal(size=k.shape).astype(np.float32)
    tables = np.zeros((len(context_lens), -(-max_len // BS)), dtype=np.int64)
    for s, n in enumerate(context_lens):
        m.allocate(s, toks(1000 * s, n))
        tables[s, : len(m.seq(s).table)] = m.seq(s).table
        for pos in range(n):
            write_kv_reference(kv, m.seq(s).table, pos, k[s, pos], v[s, pos])
    q = rng.normal(size=(len(context_lens), num_heads, head_dim)).astype(np.float32)
    scale = head_dim**-0.5
    paged = paged_attention_reference(q, kv, tables, context_lens, scale)
    dense = dense_attention_reference(q, k, v, context_lens, scale)
    assert paged.dtype == dense.dtype == np.float64 and paged.shape == q.shape  # the twins compute in float64
    np.testing.assert_allclose(paged, dense, rtol=1e-12, atol=1e-12)


# -- the property: random operations keep the books straight ----------------------------------------------------
OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "append", "fork", "free", "preempt", "swap"]),
              st.integers(0, 7), st.integers(0, 9)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_random_operations_keep_the_invariants(ops: list[tuple[str, int, int]]) -> None:
    m = BlockManager(10, BS)
    host = HostPool(m, 6)
    saved: dict[int, list[int]] = {}
    for op, a, b in ops:
        before = ({s: list(x.table) for s, x in m.seqs.items()}, m.num_free_blocks)
        try:
            if op == "alloc" and a not in m.seqs and a not in m.swapped:
                m.allocate(a, saved.pop(a, [t % 3 for t in range(b * 2)]))  # few distinct tokens: prefix hits
            elif op == "append" and a in m.seqs:
                m.append_token(a, b % 3)
            elif op == "fork" and a in m.seqs and b not in m.seqs and b not in m.swapped:
                m.fork(a, b)
            elif op == "free" and a in m.seqs:
                m.free(a)
            elif op == "preempt" and a in m.seqs:
                saved[a] = m.preempt(a)
            elif op == "swap" and a in m.seqs:
                host.swap_out([a])
            elif op == "swap" and a in host.seqs:
                host.swap_in([a])
        except OutOfBlocksError:
            assert ({s: list(x.table) for s, x in m.seqs.items()}, m.num_free_blocks) == before
        check_block_invariants(m, host)
        m.take_copies()



# -- the property with data: nobody reads another sequence's tokens --------------------------------------------------
NUM_BLOCKS, HOST_BLOCKS, MOD = 10, 6, 16_777_213  # MOD < 2**24: every tag is exact in float32


@cache
def emulated_kernels():  # built once per session (hypothesis calls the test many times)
    from minialloc.kernels.emulation import EmulatedKernels, EmulationUnavailable

    try:
        return EmulatedKernels.build()
    except EmulationUnavailable as e:
        pytest.skip(str(e))


def kv_tags(tokens: list[int]) -> list[float]:
    """What a model would store for each position: a function of the whole prefix up to it (as real K and V are),
    so two sequences may hold the same tag only where they share the prefix, and prefix sharing stays legal."""
    tags, h = [], 0
    for t in tokens:
        h = (h * 1_000_003 + t + 1) % MOD
        tags.append(float(h))
    return tags


class Engine:
    """The block manager with the KV data modelled: K of each slot holds the prefix tag of its token, V its
    position. Data moves the way a serving engine moves it: the prefill writes what the prefix cache did not hold,
    each decoded token is written after its copy-on-write copy, swaps copy blocks to a host store and back."""

    def __init__(self, kernels) -> None:
        alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
        self.cache = KVCache(alloc, KVSpec(1, 1, 1), NUM_BLOCKS, BS, with_data=True, kernels=kernels)
        self.m = BlockManager(NUM_BLOCKS, BS)
        self.host = HostPool(self.m, HOST_BLOCKS)
        self.host_kv = self.cache.new_host_store(HOST_BLOCKS)
        self.expected: dict[int, list[int]] = {}  # the tokens every live sequence (GPU or host) must read
        self.saved: dict[int, list[int]] = {}  # recomputed sequences, until they are allocated again
        self.kv = self.cache.layer(0)

    def write(self, seq_id: int, positions: range) -> None:
        st, tags = self.m.seq(seq_id), kv_tags(self.m.seq(seq_id).tokens)
        for pos in positions:
            self.kv[st.table[pos // BS], 0, pos % BS, 0, 0] = tags[pos]
            self.kv[st.table[pos // BS], 1, pos % BS, 0, 0] = pos

    def read(self, kv: np.ndarray, table: list[int], n: int) -> tuple[list[float], list[float]]:
        return ([float(kv[table[p // BS], 0, p % BS, 0, 0]) for p in range(n)],
                [float(kv[table[p // BS], 1, p % BS, 0, 0]) for p in range(n)])

    def check(self) -> None:
        check_block_invariants(self.m, self.host)
        assert set(self.m.seqs) | set(self.host.seqs) == set(self.expected)
        for sid, tokens in self.expected.items():
            on_gpu = sid in self.m.seqs
            st = self.m.seqs[sid] if on_gpu else self.host.seqs[sid]
            assert st.tokens == tokens
            k, v = self.read(self.kv if on_gpu else self.host_kv[0], st.table, len(tokens))
            assert k == kv_tags(tokens), f"sequence {sid} reads tokens that are not its own"
            assert v == list(map(float, range(len(tokens))))

    def op(self, op: str, a: int, b: int) -> None:
        m, host = self.m, self.host
        if op == "alloc" and a not in m.seqs and a not in m.swapped:
            tokens = self.saved.pop(a, None) or [t % 3 for t in range(b * 2)]  # few distinct tokens: prefix hits
            if not tokens:
                return
            cached = m.allocate(a, tokens)
            self.expected[a] = list(tokens)
            self.write(a, range(cached, len(tokens)))  # the prefill computes only what the cache lacked
        elif op == "append" and a in m.seqs:
            copy = m.append_token(a, b % 3)
            if copy is not None:
                self.cache.copy_blocks(m.take_copies())
            self.expected[a].append(b % 3)
            self.write(a, range(len(self.expected[a]) - 1, len(self.expected[a])))
        elif op == "fork" and a in m.seqs and b not in m.seqs and b not in m.swapped:
            m.fork(a, b)
            self.expected[b] = list(self.expected[a])
            self.saved.pop(b, None)
        elif op == "free" and a in m.seqs:
            m.free(a)
            del self.expected[a]
        elif op == "preempt" and a in m.seqs:
            self.saved[a] = m.preempt(a)
            del self.expected[a]
        elif op == "swap" and a in m.seqs:
            self.cache.swap_out(host.swap_out([a]), self.host_kv)
        elif op == "swap" and a in host.seqs:
            self.cache.swap_in(host.swap_in([a]), self.host_kv)

    def drain(self) -> None:
        """Everything finishes: swapped sequences come back when they fit (else are dropped), all are freed."""
        for sid in list(self.host.seqs):
            try:
                self.cache.swap_in(self.host.swap_in([sid]), self.host_kv)
            except OutOfBlocksError:
                self.host.drop([sid])
                del self.expected[sid]
            self.check()
        for sid in list(self.m.seqs):
            self.m.free(sid)
            del self.expected[sid]
        self.check()


ENGINE_OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "append", "append", "fork", "free", "preempt", "swap"]),
              st.integers(0, 7), st.integers(0, 9)),
    max_size=80,
)


@pytest.mark.parametrize("runner", ["numpy twin", "copy_blocks kernel (CPU emulation)"])
@settings(max_examples=120, deadline=None)
@given(ENGINE_OPS)
def test_no_sequence_ever_reads_another_sequences_tokens(runner: str, ops: list[tuple[str, int, int]]) -> None:
    """Random fork / append / free / preempt (recompute and swap) on a 10-block cache: after every operation each
    sequence reads, through its block table, exactly the K/V of its own tokens; reference counts match the tables;
    at the end every reference count is 0 and every block, GPU and host, is back in its pool."""
    engine = Engine(None if runner == "numpy twin" else emulated_kernels())
    for op, a, b in ops:
        before = ({s: list(x.table) for s, x in engine.m.seqs.items()}, engine.m.num_free_blocks)
        try:
            engine.op(op, a, b)
        except OutOfBlocksError:
            assert ({s: list(x.table) for s, x in engine.m.seqs.items()}, engine.m.num_free_blocks) == before
        engine.check()
    engine.drain()
    assert all(block.ref_cnt == 0 for block in engine.m.blocks)
    assert engine.m.num_free_blocks == NUM_BLOCKS and sorted(engine.host.free_ids) == list(range(HOST_BLOCKS))
    assert not engine.m.seqs and not engine.host.seqs and not engine.m.swapped


def test_the_property_check_catches_a_missed_copy_on_write() -> None:
    """If the copy of copy-on-write were skipped, the writer's new block would hold garbage: check() must see it."""
    engine = Engine(None)
    engine.op("alloc", 0, 3)  # 6 tokens: a full block and a partial one
    engine.op("fork", 0, 1)
    copy = engine.m.append_token(1, 2)  # done by hand, without applying the copy
    assert copy is not None
    engine.expected[1].append(2)
    engine.write(1, range(6, 7))
    with pytest.raises(AssertionError, match="sequence 1 reads tokens that are not its own"):
        engine.check()


# -- the KV data path: copy-on-write through the kernel, swap, attention --------------------------------------------
@pytest.mark.parametrize("runner", ["numpy twin", "copy_blocks kernel (CPU emulation)"])
def test_kv_cache_copy_blocks_applies_an_ordered_list_to_every_layer(runner: str) -> None:
    kernels = None if runner == "numpy twin" else emulated_kernels()
    alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
    cache = KVCache(alloc, KVSpec(3, 2, 5), 8, BS, with_data=True, kernels=kernels)
    rng = np.random.default_rng(0)
    cache.data[...] = rng.standard_normal(cache.data.shape, dtype=np.float32)
    want = cache.data.copy()
    pairs = [(0, 1), (1, 2), (5, 0), (3, 4), (3, 6), (7, 4)]  # a chain, a source reused, a destination rewritten
    for layer in want:
        copy_blocks_reference(layer, pairs)
    launches = cache.copy_blocks(pairs)
    assert np.array_equal(cache.data, want)
    assert launches == (0 if kernels is None else 3)  # waves: [(0,1), (3,4), (3,6)], [(1,2), (7,4)], [(5,0)]
    assert np.array_equal(want[:, 2], want[:, 1]) and not np.array_equal(want[:, 0], want[:, 1])


@pytest.mark.parametrize("runner", ["numpy twin", "copy_blocks kernel (CPU emulation)"])
def test_kv_cache_swap_round_trip_moves_every_layer(runner: str) -> None:
    kernels = None if runner == "numpy twin" else emulated_kernels()
    alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
    cache = KVCache(alloc, KVSpec(2, 1, 3), 6, BS, with_data=True, kernels=kernels)
    cache.data[...] = np.arange(cache.data.size, dtype=np.float32).reshape(cache.data.shape)
    before = cache.data.copy()
    host = cache.new_host_store(4)
    cache.swap_out([(4, 0), (1, 3)], host)
    assert np.array_equal(host[:, 0], before[:, 4]) and np.array_equal(host[:, 3], before[:, 1])
    assert not host[:, 1:3].any()
    cache.data[...] = 0
    cache.swap_in([(3, 5), (0, 2)], host)
    assert np.array_equal(cache.data[:, 5], before[:, 1]) and np.array_equal(cache.data[:, 2], before[:, 4])
    cache.swap_out([], host)  # nothing to do
    assert np.count_nonzero(cache.data[:, [0, 1, 3, 4]]) == 0


def test_kv_cache_attention_uses_the_kernel_when_given_one() -> None:
    from minialloc.kernels.reference import relative_error

    alloc = CachingAllocator(SimulatedGPU("64MiB"), AllocatorConfig())
    rng = np.random.default_rng(2)
    caches = [KVCache(alloc, KVSpec(2, 2, 16), 12, BS, with_data=True, kernels=k) for k in (None, emulated_kernels())]
    for c in caches:
        c.data[...] = np.random.default_rng(1).standard_normal(c.data.shape, dtype=np.float32)
    q = rng.standard_normal((2, 4, 16), dtype=np.float32)
    tables, lens = np.array([[3, 7, 1], [11, 0, -1]]), [10, 5]
    twin, kernel = (c.attention(1, q, tables, lens, 0.25) for c in caches)
    assert relative_error(kernel, twin) < 1e-5
    reference = paged_attention_reference(q, caches[0].layer(1), tables, lens, 0.25)
    assert twin.dtype == kernel.dtype == np.float32  # the float64 twin comes back in q's dtype, as the kernel's output
    assert np.array_equal(twin, reference.astype(np.float32))


def test_copy_blocks_reference_checks_the_block_range() -> None:
    kv = np.zeros((4, 2, BS, 1, 1), np.float32)
    with pytest.raises(ValueError, match=r"block pair \(0, -1\) outside \[0, 4\)"):
        copy_blocks_reference(kv, [(0, -1)])  # NumPy would have copied into the last block


def test_host_pool_drop_returns_a_swapped_sequences_blocks() -> None:
    m = BlockManager(8, BS)
    host = HostPool(m, 4)
    m.allocate(0, toks(0, 6))
    m.fork(0, 1)
    host.swap_out([0, 1])
    host.drop([0])
    assert host.ref_cnt == [1, 1, 0, 0]  # both host blocks were shared by the two sequences
    check_block_invariants(m, host)
    host.drop([1])
    assert sorted(host.free_ids) == [0, 1, 2, 3] and not m.swapped and {0, 1} <= m.finished
    with pytest.raises(UnknownSequenceError, match="not swapped out"):
        host.drop([1])
    with pytest.raises(FinishedSequenceError):
        m.append_token(0, 1)


def test_allocate_rejects_a_sequence_longer_than_the_whole_cache() -> None:
    m = BlockManager(4, BS)
    with pytest.raises(RequestTooLongError, match=r"sequence 3: 17 tokens need 5 KV blocks of 4 tokens, the whole "
                                                  r"cache has 4 blocks \(16 tokens\)"):
        m.allocate(3, toks(0, 17))
    m.allocate(3, toks(0, 16))  # exactly the whole cache fits
    check_block_invariants(m)
