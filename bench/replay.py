"""Allocator speed: microseconds per malloc/free over a generated trace, and how it grows with live blocks.

Prints figures; it is not a test. Usage:  python bench/replay.py [--quick] [--events 1000000]

The trace mixes small (<= 1 MiB) and large sizes on four streams and keeps a target number of blocks live, so
the pools hold thousands of cached blocks. Each operation is timed as part of the whole replay loop (the loop's
own overhead, measured with a no-op allocator, is subtracted).
"""

from __future__ import annotations

import random
import sys
import time

from minialloc import CachingAllocator, SimulatedGPU
from minialloc.timing import bench_parser


def make_trace(n_events: int, live_target: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """(op, size_or_index, stream): op 1 = malloc, 0 = free of a random live block (by position)."""
    rng = random.Random(seed)
    trace = []
    live = 0
    for _ in range(n_events):
        if live > 0 and (live >= live_target * 1.1 or (live > live_target * 0.9 and rng.random() < 0.5)):
            trace.append((0, rng.randrange(live), 0))
            live -= 1
        else:
            size = rng.randint(1, 64 * 1024) if rng.random() < 0.7 else rng.randint(1 << 20, 48 << 20)
            trace.append((1, size, rng.randrange(4)))
            live += 1
    return trace


def run(trace, allocator) -> float:
    live: list[int] = []
    malloc, free = allocator.malloc, allocator.free
    t0 = time.perf_counter()
    for op, arg, stream in trace:
        if op:
            live.append(malloc(arg, stream))
        else:
            # swap-remove keeps the choice random and the removal O(1)
            live[arg], live[-1] = live[-1], live[arg]
            free(live.pop())
    return time.perf_counter() - t0


class NoOp:
    def malloc(self, size, stream=0):
        return size

    def free(self, ptr):
        pass


def measure(trace, history: bool, capacity: str = "80TiB") -> float:
    alloc = CachingAllocator(SimulatedGPU(capacity), "")
    alloc.record_memory_history(enabled=history)
    elapsed = run(trace, alloc) - run(trace, NoOp())
    return elapsed / len(trace) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--events", type=int, default=None, help="events in the main trace (default 1,000,000; "
                    "--quick: 100,000)")
    args = ap.parse_args(argv)
    events = args.events or (100_000 if args.quick else 1_000_000)
    trace = make_trace(events, live_target=5000)
    print(f"trace: {len(trace):,} events, ~5,000 live blocks, sizes 1 B-64 KiB (70%) and 1-48 MiB, 4 streams")
    for history in (False, True):
        print(f"  history recording {'on ' if history else 'off'}: {measure(trace, history):.2f} us per operation")
    if args.quick:
        return 0
    print("growth with live blocks (200,000 events each, history off):")
    for live_target in (1_000, 10_000, 100_000):
        t = make_trace(200_000 if live_target < 100_000 else 400_000, live_target, seed=1)
        print(f"  {live_target:>7,} live blocks: {measure(t, False):.2f} us per operation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
