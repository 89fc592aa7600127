"""Compaction cost: milliseconds per defragment() and what it gains, accounting only and with data.

Prints figures; it is not a test. Usage:  python bench/defragment.py [--quick] [--buffers 20000]

Buffers of random sizes (512 B to 8 MiB) fill a device, then a random half of them is freed, leaving every
segment in pieces, and empty_cache() returns the segments left empty. defragment() then packs each segment;
release_empty=True also empties whole segments into the holes of others.
"""

from __future__ import annotations

import random
import sys

from minialloc import CachingAllocator, OutOfMemoryError, SimulatedGPU, format_size
from minialloc.timing import bench_parser, once


def fragment(gpu: SimulatedGPU, n: int, seed: int = 0) -> CachingAllocator:
    rng = random.Random(seed)
    a = CachingAllocator(gpu)
    a.record_memory_history(enabled=False)
    bufs = []
    for _ in range(n):
        try:
            bufs.append(a.buffer(rng.choice([rng.randint(512, 64 * 1024), rng.randint(1 << 20, 8 << 20)])))
        except OutOfMemoryError:
            break
    for b in rng.sample(bufs, len(bufs) // 2):
        b.free()
    a.empty_cache()  # wholly free segments go back: what is left holds live blocks
    return a


def measure(label: str, gpu: SimulatedGPU, n: int, release_empty: bool) -> None:
    a = fragment(gpu, n)
    reserved = a.memory_reserved()
    r, seconds = once(lambda: a.defragment(release_empty=release_empty))
    ms = seconds * 1e3
    print(f"  {label:<34} {ms:8.1f} ms: {r.blocks_moved:6d} blocks, {format_size(r.bytes_moved):>11} moved; largest "
          f"free {format_size(r.largest_free_before)} -> {format_size(r.largest_free_after)}; reserved "
          f"{format_size(reserved)} -> {format_size(a.memory_reserved())}")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--buffers", type=int, default=None, help="buffers made (default 20000; --quick: 2000)")
    args = parser.parse_args(argv)
    buffers = args.buffers or (2000 if args.quick else 20000)
    for release_empty in (False, True):
        print(f"defragment(release_empty={release_empty}):")
        measure(f"{buffers} buffers, accounting only", SimulatedGPU("80GiB"), buffers, release_empty)
        measure("up to 1 GiB of buffers, with data", SimulatedGPU("1GiB", store_data=True), buffers, release_empty)
    return 0


if __name__ == "__main__":
    sys.exit(main())
