"""Paging: a PagedAttention KV cache in fixed-size blocks, managed the way vLLM manages it.

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023
(arXiv:2309.06180). A contiguous KV cache reserves each request's maximum length up front, so most of it holds
nothing (reserved slots, internal and external fragmentation: the paper measures only 20.4-38.2% of KV memory
holding real tokens). PagedAttention cuts the cache into blocks of `block_size` tokens (16 by default) and gives
each sequence a BLOCK TABLE mapping its logical blocks to physical ones, as an OS page table maps pages. A new
physical block is taken only when the last one is full, so a sequence wastes at most one partly filled block.

The rooms, lowest first:

- errors, free_queue: the paging errors; physical blocks and their LRU free list;
- block_manager: block tables, reference counts, prefix caching, fork and copy-on-write (block ids only);
- host_pool: swap preemption's host-side blocks, and the invariants of both pools;
- kv_cache: the storage the block ids index (KVSpec, KVCache), allocated once through the CachingAllocator;
- scheduler: continuous batching over a BlockManager with preemption (vLLM V0's policy).

The kernels' NumPy references (paged attention, copy_blocks, write_kv) live beside the kernels, in
minialloc.kernels.reference; they are re-exported here, where the course imports them.

    >>> from minialloc.paging import BlockManager
    >>> m = BlockManager(num_blocks=4, block_size=2)
    >>> m.allocate(0, [7, 8, 9])      # 3 tokens: 2 blocks, no cached prefix yet
    0
    >>> m.fork(0, 1)                  # the child shares both blocks
    >>> m.append_token(1, 5)          # the shared last block is copied before the write
    (1, 2)
    >>> m.num_free_blocks
    1
"""

from ..kernels.reference import (
    copy_blocks_reference,
    dense_attention_reference,
    paged_attention_reference,
    write_kv_reference,
)
from .block_manager import DEFAULT_BLOCK_SIZE, ROOT_HASH, BlockManager, SeqState, hash_block_tokens
from .errors import (
    FinishedSequenceError,
    OutOfBlocksError,
    PagingError,
    RequestTooLongError,
    SwappedSequenceError,
    UnknownSequenceError,
)
from .free_queue import Block, FreeBlockQueue, KVBlock
from .host_pool import HostPool, check_block_invariants, check_invariants
from .kv_cache import KVCache, KVSpec
from .scheduler import BEAM_REPLACE, VOCAB, Group, Request, Scheduler

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BEAM_REPLACE",
    "ROOT_HASH",
    "VOCAB",
    "Block",
    "BlockManager",
    "FinishedSequenceError",
    "FreeBlockQueue",
    "Group",
    "HostPool",
    "KVBlock",
    "KVCache",
    "KVSpec",
    "OutOfBlocksError",
    "PagingError",
    "Request",
    "RequestTooLongError",
    "Scheduler",
    "SeqState",
    "SwappedSequenceError",
    "UnknownSequenceError",
    "check_block_invariants",
    "check_invariants",
    "copy_blocks_reference",
    "dense_attention_reference",
    "hash_block_tokens",
    "paged_attention_reference",
    "write_kv_reference",
]
