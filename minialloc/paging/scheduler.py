"""A vLLM-style scheduler over the block manager: continuous batching with preemption by recompute or swap.

Time is in decode steps: each step brings swapped groups back, admits waiting ones that fit (a prefill), and gives
every running sequence one token. Parallel sampling and beam search are groups of sequences sharing blocks by
fork; beam search's reshuffle is modelled with one probability, BEAM_REPLACE (minialloc.serving explains it).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .errors import OutOfBlocksError, RequestTooLongError
from .host_pool import HostPool

VOCAB = 50272  # OPT's vocabulary: token ids are drawn from it
BEAM_REPLACE = 0.1  # per step and beam: probability it is replaced by a fork of another beam


@dataclass(frozen=True)
class Request:
    """One serving request: its prompt's token ids and how many tokens it will generate."""

    req_id: int
    prompt: tuple[int, ...]
    output_len: int


@dataclass
class Group:
    """A request's sequences (vLLM's SequenceGroup): one, n parallel samples, or `width` beams."""

    request: Request
    kind: str = "single"  # "single", "parallel" or "beam"
    width: int = 1
    seq_ids: list[int] = field(default_factory=list)
    generated: int = 0  # decode steps done: every sequence of the group has this many output tokens
    saved: list[list[int]] | None = None  # tokens of each sequence while preempted by recompute
    swapped: bool = False


class Scheduler:
    """First come, first served continuous batching over a BlockManager, with vLLM V0's preemption policy.

    Each step (vLLM V0 Scheduler._schedule): swapped groups come back first; then waiting groups are admitted in
    arrival order while their prompt fits above a watermark of free blocks (1%, so an admission does not force a
    preemption at once; no watermark while nothing runs, so whatever fits the cache gets in); then every running
    group decodes one token, oldest first. When a group needs a block and none is free, the most recently
    admitted group is preempted (possibly the group itself), all or nothing: recompute by default (vLLM V1 only
    recomputes), or swap to the host pool.
    """

    def __init__(self, manager: BlockManager, preemption: str = "recompute", host: HostPool | None = None,
                 watermark: float = 0.01, max_num_seqs: int = 256, seed: int = 0) -> None:
        if preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be 'recompute' or 'swap', got {preemption!r}")
        if preemption == "swap" and host is None:
            raise ValueError("swap preemption needs a HostPool")
        self.m, self.preemption, self.host, self.max_num_seqs = manager, preemption, host, max_num_seqs
        self.watermark = int(watermark * len(manager.blocks))
        self.waiting: deque[Group] = deque()
        self.running: list[Group] = []
        self.swapped: deque[Group] = deque()
        self.rng = random.Random(seed)
        self.next_seq_id = 0
        self.num_preemptions = self.num_swapped_blocks = self.num_copies = 0

    def add(self, group: Group) -> None:
        """Queue a request. One whose own sequence could never fit (its final length needs more blocks than the
        whole cache has) is rejected with RequestTooLongError (vLLM's AllocStatus.NEVER)."""
        r, bs, num_blocks = group.request, self.m.block_size, len(self.m.blocks)
        total = len(r.prompt) + r.output_len
        if -(-total // bs) > num_blocks:
            raise RequestTooLongError(
                f"request {r.req_id} is longer than the whole KV cache: {len(r.prompt)} prompt + {r.output_len} "
                f"output tokens = {total} tokens need {-(-total // bs)} blocks of {bs} tokens, and the cache has "
                f"{num_blocks} blocks ({num_blocks * bs} tokens)")
        self.waiting.append(group)

    def _watermark(self) -> int:
        return self.watermark if self.running else 0  # alone, a group may use every block

    def _too_long(self, g: Group, why: str) -> RequestTooLongError:
        bs, num_blocks = self.m.block_size, len(self.m.blocks)
        return RequestTooLongError(
            f"request {g.request.req_id} ({g.kind}, {g.width} sequence(s) of {len(g.request.prompt)} prompt + "
            f"{g.request.output_len} output tokens) {why}: the whole cache has {num_blocks} blocks of {bs} tokens "
            f"({num_blocks * bs} tokens), and runs at most {self.max_num_seqs} sequences")

    def _new_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def num_running_seqs(self) -> int:
        return sum(len(g.seq_ids) for g in self.running)

    def _admit(self, g: Group) -> bool:
        """Allocate a waiting group (its prompt, or after recompute every sequence's tokens), all or nothing.

        The group must also be able to take its first decode step (a new block or a copy per sequence) above the
        watermark; otherwise it would be preempted at once. Allocation is tried and rolled back on failure, which
        is exact where prefix-cache hits make a group need fewer blocks than its tokens fill.
        """
        if self.num_running_seqs() + g.width > self.max_num_seqs:
            return False
        fresh = not g.saved
        todo = [(self._new_id(), list(g.request.prompt))] if fresh else list(zip(g.seq_ids, g.saved, strict=True))
        done: list[int] = []
        try:
            for sid, tokens in todo:
                self.m.allocate(sid, tokens)
                done.append(sid)
            for _ in range(g.width - 1 if fresh else 0):
                done.append(self._new_id())
                self.m.fork(done[0], done[-1])
            need = sum(self.m.blocks_to_append(s) for s in done)
            if self.m.num_free_blocks - need < self._watermark():
                raise OutOfBlocksError(need, self.m.num_free_blocks, "admission above the watermark")
        except OutOfBlocksError:
            for sid in reversed(done):  # roll back; the blocks stay cached, so a retry hits them
                self.m.preempt(sid)
            return False
        g.seq_ids, g.saved = done, None
        return True

    def _swap_in(self, g: Group) -> bool:
        assert self.host is not None
        need = len({c for s in g.seq_ids for c in self.host.seqs[s].table})
        if self.m.num_free_blocks - need < self._watermark() or self.num_running_seqs() + g.width > self.max_num_seqs:
            return False
        self.num_swapped_blocks += len(self.host.swap_in(g.seq_ids))
        g.swapped = False
        return True

    def _preempt(self, g: Group) -> None:
        self.num_preemptions += 1
        if self.host is not None and self.preemption == "swap":
            try:
                self.num_swapped_blocks += len(self.host.swap_out(g.seq_ids))
                g.swapped = True
                self.swapped.appendleft(g)  # victims go newest first, so the oldest ends up in front
                return
            except OutOfBlocksError:
                pass  # the host pool is full: fall back to recompute
        g.saved = [self.m.preempt(s) for s in g.seq_ids]
        self.waiting.appendleft(g)

    def _reshuffle_beams(self, g: Group) -> None:
        """Beam search's step: each beam survives, or (probability BEAM_REPLACE) is overtaken by a fork of a beam.

        vLLM V0 does the same with its blocks: a surviving candidate of a beam forks that beam's sequence (sharing
        every block), and the beams left without a surviving candidate are freed.
        """
        parents = [i if self.rng.random() >= BEAM_REPLACE else self.rng.randrange(g.width) for i in range(g.width)]
        survivors = set(parents)
        new_ids = []
        for p in parents:
            if p in survivors:  # the first candidate of a beam continues it in place
                survivors.discard(p)
                new_ids.append(g.seq_ids[p])
            else:
                child = self._new_id()
                self.m.fork(g.seq_ids[p], child)
                new_ids.append(child)
        for i, sid in enumerate(g.seq_ids):
            if i not in parents:
                self.m.free(sid)
        g.seq_ids = new_ids

    def step(self) -> list[Group]:
        """One scheduling iteration; returns the groups that finished (their blocks are freed)."""
        while self.swapped and self._swap_in(self.swapped[0]):
            self.running.append(self.swapped.popleft())
        while not self.swapped and self.waiting and self._admit(self.waiting[0]):
            self.running.append(self.waiting.popleft())
        if self.waiting and not self.running and not self.swapped:  # every block is free, and still no room
            raise self._too_long(self.waiting[0], "cannot be admitted even into the empty cache")
        decoded: list[Group] = []
        while len(decoded) < len(self.running):
            g = self.running[len(decoded)]
            if g.kind == "beam" and g.generated > 0:
                self._reshuffle_beams(g)
            while sum(self.m.blocks_to_append(s) for s in g.seq_ids) > self.m.num_free_blocks:
                victim = self.running.pop()
                if victim is g and not self.running:  # alone and still short: it can never finish
                    held = sum(len(self.m.seqs[s].tokens) for s in g.seq_ids)
                    raise self._too_long(g, f"holds {held} tokens and needs more blocks, running alone")
                self._preempt(victim)
                if victim is g:
                    break
            else:
                for s in g.seq_ids:
                    pos = len(self.m.seqs[s].tokens)
                    self.m.append_token(s, (s * 1_000_003 + pos * 7919) % VOCAB)
                g.generated += 1
                decoded.append(g)
        self.num_copies += len(self.m.take_copies())
        return decoded

    def retire(self, decoded: list[Group]) -> list[Group]:
        """Free the groups whose output is complete (call after measuring the step)."""
        finished = [g for g in decoded if g.generated >= g.request.output_len]
        for g in finished:
            for s in g.seq_ids:
                self.m.free(s)
            self.running.remove(g)
        return finished
