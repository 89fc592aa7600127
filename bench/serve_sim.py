"""The PagedAttention comparison (Kwon et al., SOSP 2023, arXiv:2309.06180) on both workloads, measured.

Serves a ShareGPT-like and an Alpaca-like trace on a simulated A100-40GB running OPT-13B (12 GiB of KV), with
contiguous KV reservations through minialloc's caching allocator and with paged KV blocks, and prints the share of
KV memory holding tokens, the three kinds of waste, concurrency and the savings of block sharing under parallel
sampling and beam search (see minialloc/serving.py for the model and how the lengths were chosen).

    .venv/bin/python bench/serve_sim.py [--quick] [--requests N] [--seed S]
"""

from __future__ import annotations

import sys

from minialloc.serving import REQUEST_WORKLOADS, format_table, serve_sim
from minialloc.timing import bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--requests", type=int, default=None, help="requests per trace (default 1000; --quick: 100)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    requests = args.requests or (100 if args.quick else 1000)
    for i, workload in enumerate(REQUEST_WORKLOADS):
        if i:
            print()
        print(format_table(serve_sim(workload, requests, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
