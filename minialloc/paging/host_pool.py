"""Swap preemption (paper section 4.5): a host-side pool a group of sequences moves to and comes back from.

Recompute preemption needs nothing here (BlockManager.preempt drops the blocks); swap keeps the blocks' contents
in host memory, and this pool hands out the host block ids, reference counted like the GPU ones.
"""

from __future__ import annotations

from collections.abc import Iterable

from .block_manager import BlockManager, SeqState
from .errors import OutOfBlocksError, UnknownSequenceError


class HostPool:
    """Swap preemption: `num_blocks` host-side blocks a group of sequences moves to and back (vLLM V0 swap).

    Blocks shared inside the group are copied once each way, and the host blocks are reference counted like the
    GPU ones. Prefix-cache hashes are recomputed when the blocks come back.
    """

    def __init__(self, manager: BlockManager, num_blocks: int) -> None:
        self.m = manager
        self.ref_cnt = [0] * num_blocks
        self.free_ids = list(range(num_blocks - 1, -1, -1))
        self.seqs: dict[int, SeqState] = {}  # swapped sequences; tables hold host block ids

    def _release(self, table: list[int]) -> None:
        """One table lets go of its host blocks; a block no table holds returns to the free ids."""
        for c in table:
            self.ref_cnt[c] -= 1
            if self.ref_cnt[c] == 0:
                self.free_ids.append(c)

    def swap_out(self, seq_ids: Iterable[int]) -> list[tuple[int, int]]:
        """Move a group to the host; returns the (gpu_block, cpu_block) pairs to copy before the GPU reuses them."""
        ids = list(seq_ids)
        states = [self.m.seq(s) for s in ids]
        gpu = list(dict.fromkeys(b for st in states for b in st.table))
        if len(gpu) > len(self.free_ids):
            raise OutOfBlocksError(len(gpu), len(self.free_ids), "swap_out (host pool)")
        mapping = {g: self.free_ids.pop() for g in gpu}
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
            self._release(st.table)
            for c in st.table:
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
            self._release(st.table)
            self.m.swapped.discard(sid)
            self.m.finished.add(sid)


def check_block_invariants(m: BlockManager, host: HostPool | None = None) -> None:
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
        assert sorted(host.free_ids) == [c for c, n in enumerate(cpu_refs) if n == 0]


check_invariants = check_block_invariants  # the older name; the allocator has a check_invariants of its own
