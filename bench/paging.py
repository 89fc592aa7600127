"""How fast is minialloc's paging: the block manager's allocate/free rate, and the serving simulation's runtime.

1. BlockManager micro-benchmark: sequences with ShareGPT-like prompt lengths are allocated until the pool runs
   out, then all freed, over and over; the figure is KV blocks allocated plus blocks freed per second (the two
   operations a serving engine does per request), with prefix caching on (every full block hashed and looked up,
   vLLM's default) and off. Also the decode path: append_token, one token at a time (a block every 16 tokens),
   and fork + copy-on-write.
2. The serving simulation on 10,000 requests of the ShareGPT-like trace: simulate_paged (the scheduler over the
   block manager) and simulate_contiguous (max reservation through the caching allocator), each timed once.

    .venv/bin/python bench/paging.py [--quick] [--requests N] [--seconds S]
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from minialloc.paging import DEFAULT_BLOCK_SIZE, BlockManager
from minialloc.serving import sample_requests, simulate_contiguous, simulate_paged
from minialloc.timing import bench_parser, once
from minialloc.timing import rate as timed

NUM_BLOCKS = 100_000  # an H100's worth of 16-token blocks for a 7B model (about 128 KiB each, 12 GiB)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """ShareGPT-like prompt lengths (the serving trace's), random token ids: prefix hits only by chance."""
    return [list(r.prompt) for r in sample_requests("sharegpt", n, seed)]


def allocate_free_round(manager: BlockManager, batch: list[list[int]]) -> int:
    """Allocate sequences until the pool runs out, then free them all; returns blocks allocated + freed."""
    held = []
    for i, tokens in enumerate(batch):
        if -(-len(tokens) // manager.block_size) > manager.num_free_blocks:
            break
        manager.allocate(i, tokens)
        held.append(i)
    blocks = NUM_BLOCKS - manager.num_free_blocks
    for i in held:
        manager.free(i)
    return 2 * blocks


def decode_round(manager: BlockManager, seqs: int, tokens: int) -> int:
    """`seqs` sequences of 1 prompt token each decode `tokens` tokens; returns the tokens appended."""
    for s in range(seqs):
        manager.allocate(s, [s])
    for t in range(tokens):
        for s in range(seqs):
            manager.append_token(s, t)
    for s in range(seqs):
        manager.free(s)
    return seqs * tokens


def fork_round(manager: BlockManager, width: int) -> int:
    """A 100-token prompt forked `width` ways, each child writing once into the shared partial block (a copy on
    write each); returns the forks."""
    manager.allocate(0, list(range(100)))
    for c in range(1, width + 1):
        manager.fork(0, c)
        manager.append_token(c, 7)
    manager.take_copies()
    for c in range(width + 1):
        manager.free(c)
    return width


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--requests", type=int, default=None, help="requests in the simulated trace (default "
                        "10,000; --quick: 500)")
    parser.add_argument("--seconds", type=float, default=None, help="time per micro-benchmark (default 2; --quick: "
                        "0.3)")
    args = parser.parse_args(argv)
    args.requests = args.requests or (500 if args.quick else 10_000)
    args.seconds = args.seconds or (0.3 if args.quick else 2.0)

    # two batches, each more than the pool holds: a round fills the pool and so evicts the other batch's cached
    # blocks, and every allocation takes new blocks (no prefix hits by repetition)
    batches = [prompts(12_000, seed) for seed in (1, 2)]
    mean_blocks = float(np.mean([-(-len(p) // DEFAULT_BLOCK_SIZE) for p in batches[0]]))
    print(f"BlockManager, {NUM_BLOCKS} blocks of {DEFAULT_BLOCK_SIZE} tokens; ShareGPT-like prompts of "
          f"{mean_blocks:.1f} blocks on average")
    for caching in (True, False):
        manager, rounds = BlockManager(NUM_BLOCKS, enable_prefix_caching=caching), itertools.count()
        rate, done = timed(lambda m=manager, r=rounds: allocate_free_round(m, batches[next(r) % 2]), args.seconds)
        print(f"  allocate + free, prefix caching {'on ' if caching else 'off'}: {rate / 1e6:6.2f} M blocks/s "
              f"({1e9 / rate:.0f} ns per block, {done} blocks)")
    m = BlockManager(NUM_BLOCKS)
    rate, done = timed(lambda: decode_round(m, 64, 256), args.seconds)
    print(f"  append_token (64 sequences x 256 tokens):  {rate / 1e6:6.2f} M tokens/s ({1e9 / rate:.0f} ns each)")
    m = BlockManager(NUM_BLOCKS)
    rate, done = timed(lambda: fork_round(m, 32), args.seconds)
    print(f"  fork + copy-on-write write (width 32):     {rate / 1e6:6.2f} M forks/s ({1e9 / rate:.0f} ns each)")

    requests = sample_requests("sharegpt", args.requests, 0)
    print(f"\nServing simulation, {args.requests} ShareGPT-like requests (OPT-13B, 12 GiB of KV):")
    for name, run in (("simulate_paged", lambda: simulate_paged(requests)),
                      ("simulate_contiguous (max)", lambda: simulate_contiguous(requests))):
        out, elapsed = once(run)
        print(f"  {name:<26} {elapsed:6.2f} s  ({out['steps']} decode steps, {elapsed / out['steps'] * 1e6:.0f} us "
              f"per step, {args.requests / elapsed:.0f} requests/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
