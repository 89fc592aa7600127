"""Memory efficiency per workload: peak allocated / peak reserved under native, max_split_size_mb and expandable.

Prints one table from one run; it is not a test. Usage:  python bench/efficiency.py [--quick]

The physical limit is 1.0 (every reserved byte in use at the peak). Expandable segments should sit within page
rounding of it (pages are 2 MiB for small blocks and 20 MiB for large ones).
"""

from __future__ import annotations

import sys

from minialloc.replay import what_if
from minialloc.sizes import format_size
from minialloc.timing import bench_parser
from minialloc.workloads import CANONICAL_CAPACITY, canonical_scenario, inference_batches, training_steps

CONFIGS = ["", "max_split_size_mb:128", "max_split_size_mb:512", "expandable_segments:True"]
# Each workload on a roomy GPU (the cache grows freely) and on a tight one (a little above the peak of live
# bytes, where the allocator must release and reuse: that is where the configs differ in what they can do).
def cases(quick: bool) -> list[tuple[str, list, int | str]]:
    steps, requests = (4, 100) if quick else (12, 400)
    training, inference = training_steps(steps=steps), inference_batches(requests=requests)
    return [
        ("canonical (8 GiB)", canonical_scenario(), CANONICAL_CAPACITY),
        ("training, varying seq (80 GiB)", training, "80GiB"),
        ("training, varying seq (3.2 GiB)", training, "3.2GiB"),
        ("inference, contiguous KV (80 GiB)", inference, "80GiB"),
        ("inference, contiguous KV (14 GiB)", inference, "14GiB"),
    ]


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    header = f"{'workload':<36}" + "".join(f"{c or 'native':>26}" for c in CONFIGS)
    print(header)
    print("-" * len(header))
    for name, events, capacity in cases(args.quick):
        results = what_if(events, capacity, CONFIGS)
        cells = []
        for r in results:
            cell = f"{r.efficiency:.3f} ({format_size(r.peak_reserved)})"
            if r.ooms:
                cell += f" {r.ooms} OOM"
            cells.append(f"{cell:>26}")
        print(f"{name:<36}" + "".join(cells))
    print("\nEach cell: peak allocated / peak reserved (peak reserved), and OOMs if any.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
